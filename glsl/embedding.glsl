#version 450
// out[t][d] = table[ids[t]][d]. The bound table is the window of rows [r0, r1) of a V-row table:
// only ids in the window are written, and the dispatch with `first` set also writes zero rows for
// ids outside [0, V). TEXTURE 1 (the whole table bound): out [..., D] is a width-packed texture
// (texture_layout.h), token t at texel row (t % H, t / H); one invocation per texel.
#extension GL_GOOGLE_include_directive : require
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

#if TEXTURE
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
#else
layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
#endif
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer Table { float table[]; };

layout(push_constant) uniform Params {
    uint T;
    uint D;
    uint r0;
    uint r1;
    uint V;
    uint first;
    uint H;  // TEXTURE: rows per texel plane
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
#if TEXTURE
    ivec3 size = imageSize(outv);
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        int id = ids[uint(q.z) * H + uint(q.y)];
        vec4 v = vec4(0.0);
        for (uint i = 0u; i < 4u; ++i) {
            uint d = uint(q.x) * 4u + i;
            if (id >= 0 && uint(id) < V && d < D) v[i] = table[uint(id) * D + d];
        }
        imageStore(outv, q, v);
    }
#else
    for (uint i = gl_GlobalInvocationID.x; i < T * D; i += stride) {
        uint t = i / D;
        int id = ids[t];
        if (id >= int(r0) && id < int(r1)) {
            outv[i] = table[(uint(id) - r0) * D + i % D];
        } else if (first != 0u && (id < 0 || uint(id) >= V)) {
            outv[i] = 0.0;
        }
    }
#endif
}
