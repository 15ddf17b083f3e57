#version 450
// y[m][n] = sum_k x[m][k] * w(n, k) (+ bias[n]) with weights quantized in groups along k:
//   w(n, k) = (q(n, k) - zero(n, g)) * scale(n, g),  g = k / G.
// BITS 4: row n holds K/2 bytes; byte k/2 has k even in its low nibble, k odd in its high one,
//         q = nibble - 8 (ET-VK's q4gsw); HI_FIRST swaps the nibbles (ET-VK's qcs4w).
//         BITS 8: row n holds K signed bytes.
// scale(n, g) = s[n * SN + g * SG] (ET-VK's [groups, N] or torchao's [N, groups] by strides);
// zero points (HAS_ZP) are floats at the same index. One invocation per row m and 4 output
// channels. TEXTURE 1: x [..., K] and y [..., N] are width-packed textures (texture_layout.h),
// row m at texel row (m % H, m / H), H the texture's height; else buffers.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

#if TEXTURE
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D y;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D x;
#define X_AT(m, k) imageLoad(x, ivec3(int((k) / 4u), int((m) % H), int((m) / H)))[(k) % 4u]
#else
layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
#define X_AT(m, k) x[(m) * K + (k)]
#endif
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
    uint H;  // TEXTURE: rows per texel plane
};

#include "qw.h"

void main() {
    uint N4 = (N + 3u) / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < M * N4; i += stride) {
        uint m = i / N4;
        uint n0 = (i % N4) * 4u;
        uint lanes = min(4u, N - n0);
        vec4 acc = vec4(0.0);
        for (uint g0 = 0u; g0 < K; g0 += G) {
            vec4 part = vec4(0.0);
            float xs = 0.0;
            uint g1 = min(g0 + G, K);
            for (uint k = g0; k < g1; ++k) {
                float xv = X_AT(m, k);
                for (uint nn = 0u; nn < lanes; ++nn) part[nn] += xv * q_at(n0 + nn, k);
                xs += xv;
            }
            for (uint nn = 0u; nn < lanes; ++nn) {
                uint si = (n0 + nn) * SN + (g0 / G) * SG;
#if HAS_ZP
                part[nn] -= zp[si] * xs;
#endif
                acc[nn] += part[nn] * s[si];
            }
        }
#if HAS_BIAS
        for (uint nn = 0u; nn < lanes; ++nn) acc[nn] += bias[n0 + nn];
#endif
#if TEXTURE
        imageStore(y, ivec3(int(n0 / 4u), int(m % H), int(m / H)), acc);  // lanes past N stay zero
#else
        for (uint nn = 0u; nn < lanes; ++nn) y[m * N + n0 + nn] = acc[nn];
#endif
    }
}
