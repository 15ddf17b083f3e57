#version 450
// y[m][n] = sum_k x[m][k] * w(n, k) (+ bias[n]) with weights quantized in groups along k:
//   w(n, k) = (q(n, k) - zero(n, g)) * scale(n, g),  g = k / G.
// BITS 4: row n holds K/2 bytes; byte k/2 has k even in its low nibble, k odd in its high one,
//         q = nibble - 8 (ET-VK's q4gsw); HI_FIRST swaps the nibbles (ET-VK's qcs4w).
//         BITS 8: row n holds K signed bytes.
// scale(n, g) = s[n * SN + g * SG] (ET-VK's [groups, N] or torchao's [N, groups] by strides);
// zero points (HAS_ZP) are floats at the same index. One invocation per output element.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { uint w[]; };
layout(set = 0, binding = 3) readonly buffer S { float s[]; };
#if HAS_ZP
layout(set = 0, binding = 4) readonly buffer Z { float zp[]; };
#endif
#if HAS_BIAS
layout(set = 0, binding = 4 + HAS_ZP) readonly buffer B { float bias[]; };
#endif

layout(push_constant) uniform Params {
    uint M;
    uint N;
    uint K;
    uint G;
    uint row_bytes;
    uint SN;
    uint SG;
};

#include "qw.h"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < M * N; i += stride) {
        uint m = i / N;
        uint n = i % N;
        float acc = 0.0;
        for (uint g0 = 0u; g0 < K; g0 += G) {
            uint si = n * SN + (g0 / G) * SG;
            float part = 0.0;
            float xs = 0.0;
            uint g1 = min(g0 + G, K);
            for (uint k = g0; k < g1; ++k) {
                float xv = x[m * K + k];
                part += xv * q_at(n, k);
                xs += xv;
            }
#if HAS_ZP
            part -= zp[si] * xs;
#endif
            acc += part * s[si];
        }
#if HAS_BIAS
        acc += bias[n];
#endif
        y[i] = acc;
    }
}
