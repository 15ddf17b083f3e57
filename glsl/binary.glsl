#version 450
// out = a OP b (glsl/binary_op.h) with numpy broadcasting over up to 4 dims: out has dims d[4]
// (padded with 1 on the left); sa/sb are a's and b's element strides per output dim (0 where it
// is broadcast). FLAT: no broadcasting (index i everywhere); VEC4 (FLAT, n a multiple of 4, OP
// 0-3, 5, 6 or 17): a vec4 per index.
#extension GL_GOOGLE_include_directive : require
#include "binary_op.h"

layout(local_size_x_id = 0) in;

#ifndef VEC4
#define VEC4 0
#endif
#if VEC4
#define T vec4
#define OP_T binary_op4
#else
#define T float
#define OP_T binary_op
#endif
layout(set = 0, binding = 0) writeonly buffer Out { T outv[]; };
layout(set = 0, binding = 1) readonly buffer A { T a[]; };
layout(set = 0, binding = 2) readonly buffer B { T b[]; };

layout(push_constant) uniform Params {
    uvec4 d;   // vectors first: a uvec4 is 16-byte aligned in the push-constant block
    uvec4 sa;
    uvec4 sb;
    uint n;
    float alpha;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < (VEC4 != 0 ? n / 4u : n); i += stride) {
#if FLAT  // a, b and out of one shape
        T av = a[i];
        T bv = b[i];
#else
        uvec4 c = uvec4(i / (d.y * d.z * d.w), (i / (d.z * d.w)) % d.y, (i / d.w) % d.z, i % d.w);
        float av = a[c.x * sa.x + c.y * sa.y + c.z * sa.z + c.w * sa.w];
        float bv = b[c.x * sb.x + c.y * sb.y + c.z * sb.z + c.w * sb.w];
#endif
        outv[i] = OP_T(av, bv, alpha);
    }
}
