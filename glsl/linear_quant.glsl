#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] for the N rows of W bound here (a window starting at row n0
// of a larger weight; ldy is y's row length), W quantized in GGML blocks and packed by
// pack_quant.glsl. Each invocation computes ROWS consecutive rows for TOKENS consecutive m (1
// and 1 on GPUs; more on CPU renderers, where a weight block decoded once serves TOKENS tokens
// and the x values loaded once serve ROWS rows), dequantizing four weights per 32-bit word.
// TEXEL reads W, X_TEXEL x, as a uniform texel buffer: lavapipe runs a storage-buffer load inside
// a loop as a loop over its SIMD lanes, a texel fetch as one gather. RESIDUAL adds res (shaped as
// y) to y.
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"
#ifndef ROWS
#define ROWS 1
#endif
#ifndef TOKENS
#define TOKENS 1
#endif

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
#if X_TEXEL
layout(set = 0, binding = 1) uniform samplerBuffer xt;  // RGBA32F texels
#define X4(i) texelFetch(xt, int(i))
#else
layout(set = 0, binding = 1) readonly buffer X { vec4 x4[]; };
#define X4(i) x4[i]
#endif
#if TEXEL
layout(set = 0, binding = 2) uniform usamplerBuffer wt;  // R32UI texels
#define WORD(i) texelFetch(wt, int(i)).x
#else
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };
#define WORD(i) w[i]
#endif

#if RESIDUAL
layout(set = 0, binding = 3) readonly buffer Res { float res[]; };
#endif

layout(push_constant) uniform Params {
    uint M;
    uint N;
    uint K;
    uint n0;
    uint ldy;
};

vec4 bytes4(uint word) {
    return vec4(uvec4(word) >> uvec4(0u, 8u, 16u, 24u) & 0xFFu);
}

void main() {
    uint nb = K / 32u;
    uint groups = (N + ROWS - 1u) / ROWS;
    uint work = groups * ((M + TOKENS - 1u) / TOKENS);
    for (uint o = gl_GlobalInvocationID.x; o < work; o += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        uint first = (o % groups) * ROWS;
        uint m0 = (o / groups) * TOKENS;
        float acc[ROWS * TOKENS];
        for (uint a = 0u; a < ROWS * TOKENS; ++a) acc[a] = 0.0;
        for (uint b = 0u; b < nb; ++b) {
            vec4 xv[TOKENS * 8];  // this block's 32 x values of each token, and their sums
            float sx[TOKENS];
            for (uint t = 0u; t < TOKENS; ++t) {
                uint xb = (min(m0 + t, M - 1u) * K + b * 32u) / 4u;
                vec4 s = vec4(0.0);
                for (uint i = 0u; i < 8u; ++i) {
                    xv[t * 8u + i] = X4(xb + i);
                    s += xv[t * 8u + i];
                }
                sx[t] = s.x + s.y + s.z + s.w;
            }
            for (uint r = 0u; r < ROWS; ++r) {
                uint rec = (min(first + r, N - 1u) * nb + b) * REC;
                vec4 q[8];  // the block's quants, in x's order
#if QTYPE == 2
                for (uint i = 0u; i < 8u; ++i) {
                    q[i] = bytes4(WORD(rec + SCALES + i));
                    q[i] -= 256.0 * vec4(greaterThanEqual(q[i], vec4(128.0)));
                }
#else
                for (uint i = 0u; i < 4u; ++i) {
                    uint word = WORD(rec + SCALES + i);
                    q[i] = bytes4(word & 0x0F0F0F0Fu);
                    q[i + 4u] = bytes4((word >> 4u) & 0x0F0F0F0Fu);
                }
#endif
                float d = uintBitsToFloat(WORD(rec));
#if QTYPE == 1
                float mn = uintBitsToFloat(WORD(rec + 1u));
#endif
                for (uint t = 0u; t < TOKENS; ++t) {
                    float sq = 0.0;
                    for (uint i = 0u; i < 8u; ++i) sq += dot(q[i], xv[t * 8u + i]);
#if QTYPE == 0
                    acc[r * TOKENS + t] += d * (sq - 8.0 * sx[t]);
#elif QTYPE == 1
                    acc[r * TOKENS + t] += d * sq + mn * sx[t];
#else
                    acc[r * TOKENS + t] += d * sq;
#endif
                }
            }
        }
        for (uint t = 0u; t < TOKENS && m0 + t < M; ++t) {
            for (uint r = 0u; r < ROWS && first + r < N; ++r) {
                uint at = (m0 + t) * ldy + n0 + first + r;
#if RESIDUAL
                y[at] = acc[r * TOKENS + t] + res[at];
#else
                y[at] = acc[r * TOKENS + t];
#endif
            }
        }
    }
}
