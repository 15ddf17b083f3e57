#version 450
// out[t][d] = (q(id, d) - zero(id, g)) * scale(id, g), g = d / G, id = ids[t]: rows of a table
// quantized in groups along D (glsl/qw.h: BITS, HI_FIRST), scale(n, g) = s[n * SN + g * SG], zero
// points (HAS_ZP) floats at the same index; ids outside [0, V) give zero rows.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer W { uint w[]; };
layout(set = 0, binding = 3) readonly buffer S { float s[]; };
#if HAS_ZP
layout(set = 0, binding = 4) readonly buffer Z { float zp[]; };
#endif

layout(push_constant) uniform Params {
    uint T;
    uint D;
    uint V;
    uint G;
    uint row_bytes;
    uint SN;
    uint SG;
};

#include "qw.h"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < T * D; i += stride) {
        int id = ids[i / D];
        uint d = i % D;
        if (id < 0 || uint(id) >= V) {
            outv[i] = 0.0;
            continue;
        }
        uint si = uint(id) * SN + (d / G) * SG;
        float q = q_at(uint(id), d);
#if HAS_ZP
        q -= zp[si];
#endif
        outv[i] = q * s[si];
    }
}
