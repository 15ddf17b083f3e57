#version 450
// Elementwise ops on textures (layouts in texture_layout.h), one invocation per output texel.
// ARITY 1: unary_op(x) (unary_op.h: OP, OP2, parameters p), 2: binary_op(a, b) (binary_op.h: OP,
// alpha p.x), 3: where(c, a, b). Inputs broadcast against the output (numpy rules on sizes padded
// to NCHW) and may have any layout; an input with the output's sizes and layout (same[k]) is read
// a texel at a time, others a component at a time. Padding components of the output get zeros.
#extension GL_GOOGLE_include_directive : require
#ifndef ARITY
#define ARITY 1
#endif
#ifndef OP2
#define OP2 0
#endif
#if ARITY == 1
#include "unary_op.h"
#elif ARITY == 2
#include "binary_op.h"
#endif
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D in0;
#if ARITY > 1
layout(set = 0, binding = 2, rgba32f) uniform readonly image3D in1;
#endif
#if ARITY > 2
layout(set = 0, binding = 3, rgba32f) uniform readonly image3D in2;
#endif

layout(push_constant) uniform Params {
    uvec4 so;      // sizes (N, C, H, W) of the output and of each input
    uvec4 s0;
    uvec4 s1;
    uvec4 s2;
    uvec4 packed;  // packed dim of the output, in0, in1, in2
    uvec4 same;    // input k has the output's sizes and layout
    vec4 p;
};

// Input k at the output elements of texel q (broadcast: an input dim of size 1 is read at 0).
#define GATHER(img, s, pk, k)                                                 \
    vec4 v = vec4(0.0);                                                       \
    if (same[k] != 0u) return imageLoad(img, q);                              \
    uvec4 e;                                                                  \
    for (uint i = 0u; i < 4u; ++i) {                                          \
        if (element_of(q, i, so, packed.x, e)) {                              \
            ivec4 t = texel_of(min(e, s - 1u), s, pk);                        \
            v[i] = imageLoad(img, t.xyz)[t.w];                                \
        }                                                                     \
    }                                                                         \
    return v;

vec4 gather0(ivec3 q) { GATHER(in0, s0, packed.y, 0) }
#if ARITY > 1
vec4 gather1(ivec3 q) { GATHER(in1, s1, packed.z, 1) }
#endif
#if ARITY > 2
vec4 gather2(ivec3 q) { GATHER(in2, s2, packed.w, 2) }
#endif

void main() {
    ivec3 size = imageSize(outv);
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        vec4 x = gather0(q);
#if ARITY == 1
        vec4 r = vec4(unary_op(x.x, p.x, p.y, p.z, p.w), unary_op(x.y, p.x, p.y, p.z, p.w),
                      unary_op(x.z, p.x, p.y, p.z, p.w), unary_op(x.w, p.x, p.y, p.z, p.w));
#elif ARITY == 2
        vec4 r = binary_op4(x, gather1(q), p.x);
#else
        vec4 r = mix(gather2(q), gather1(q), notEqual(x, vec4(0.0)));
#endif
        uvec4 e;
        if (!element_of(q, 3u, so, packed.x, e)) {  // the last texel along the packed dim
            for (uint i = 0u; i < 3u; ++i) {
                if (!element_of(q, i, so, packed.x, e)) r[i] = 0.0;
            }
            r.w = 0.0;
        }
        imageStore(outv, q, r);
    }
}
