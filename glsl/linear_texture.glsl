#version 450
// y = x @ W.T (+ bias) on width-packed textures (texture_layout.h): x [..., K] and y [..., N] in
// texels of 4 consecutive k (or n); one invocation per output texel (4 output channels of one
// row), W packed by pack_linear_4x4.glsl (a vec4 of 4 output channels per input channel).
#extension GL_GOOGLE_include_directive : require
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D y;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D x;
layout(set = 0, binding = 2) readonly buffer W { vec4 w[]; };
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer B { float bias[]; };
#endif

layout(push_constant) uniform Params {
    uint K;
    uint N;
};

void main() {
    ivec3 size = imageSize(y);
    uint K4 = (K + 3u) / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        uint n4 = uint(q.x);
        vec4 acc = vec4(0.0);
        for (uint k4 = 0u; k4 < K4; ++k4) {
            vec4 xv = imageLoad(x, ivec3(int(k4), q.y, q.z));  // components past K are zero
            uint block = (n4 * K4 + k4) * 4u;
            acc += xv.x * w[block] + xv.y * w[block + 1u] + xv.z * w[block + 2u] + xv.w * w[block + 3u];
        }
        for (uint nn = 0u; nn < 4u; ++nn) {
            uint n = n4 * 4u + nn;
#if HAS_BIAS
            acc[nn] = n < N ? acc[nn] + bias[n] : 0.0;
#else
            acc[nn] = n < N ? acc[nn] : 0.0;
#endif
        }
        imageStore(y, q, acc);
    }
}
