#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] (+ bias[n0 + n]) for the N rows of W bound here (a window
// starting at row n0 of a larger weight; ldy is y's row length), W packed by
// pack_linear_4x4.glsl: one invocation per (row m, block of 4 output channels n4) reads one vec4
// of weights per input channel.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { vec4 w[]; };
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer B { float bias[]; };
#endif

#include "linear_params.h"

void main() {
    uint N4 = (N + 3u) / 4u;
    uint K4 = (K + 3u) / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < M * N4; o += stride) {
        uint m = o / N4;
        uint n4 = o % N4;
        vec4 acc = vec4(0.0);
        for (uint k4 = 0u; k4 < K4; ++k4) {
            uint block = (n4 * K4 + k4) * 4u;
            for (uint kk = 0u; kk < 4u; ++kk) {
                uint k = k4 * 4u + kk;
                if (k < K) {
                    acc += x[m * K + k] * w[block + kk];
                }
            }
        }
        for (uint nn = 0u; nn < 4u; ++nn) {
            uint n = n4 * 4u + nn;
            if (n < N) {
#if HAS_BIAS
                y[m * ldy + n0 + n] = acc[nn] + bias[n0 + n];
#else
                y[m * ldy + n0 + n] = acc[nn];
#endif
            }
        }
    }
}
