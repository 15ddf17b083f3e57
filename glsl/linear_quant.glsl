#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] for the N rows of W bound here (a window starting at row n0
// of a larger weight; ldy is y's row length), W quantized in GGML blocks and packed by
// pack_quant.glsl. Each invocation computes ROWS consecutive rows (1 on GPUs; more on CPU
// renderers, where every x value an invocation loads then serves ROWS rows), for every m in turn,
// dequantizing four weights per 32-bit word. TEXEL reads W as a uniform texel buffer: lavapipe
// runs a storage-buffer load inside a loop as a loop over its SIMD lanes, a texel fetch as one
// gather.
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"
#ifndef ROWS
#define ROWS 1
#endif

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { vec4 x4[]; };
#if TEXEL  // the weight as a uniform texel buffer: lavapipe fetches texels without a loop over lanes
layout(set = 0, binding = 2) uniform usamplerBuffer wt;
#define WORD(i) texelFetch(wt, int(i)).x
#else
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };
#define WORD(i) w[i]
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
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x * ROWS;
    for (uint first = gl_GlobalInvocationID.x * ROWS; first < N; first += stride) {
        for (uint m = 0u; m < M; ++m) {
            float acc[ROWS];
            for (uint r = 0u; r < ROWS; ++r) acc[r] = 0.0;
            for (uint b = 0u; b < nb; ++b) {
                uint xb = (m * K + b * 32u) / 4u;  // x as vec4: 8 per block
#if QTYPE == 2
                vec4 xv[8];
                for (uint i = 0u; i < 8u; ++i) xv[i] = x4[xb + i];
                for (uint r = 0u; r < ROWS; ++r) {
                    uint rec = (min(first + r, N - 1u) * nb + b) * REC;
                    float sq = 0.0;
                    for (uint i = 0u; i < 8u; ++i) {
                        vec4 q = bytes4(WORD(rec + SCALES + i));
                        sq += dot(q - 256.0 * vec4(greaterThanEqual(q, vec4(128.0))), xv[i]);
                    }
                    acc[r] += uintBitsToFloat(WORD(rec)) * sq;
                }
#else
                vec4 lo[4], hi[4];
                vec4 sx = vec4(0.0);
                for (uint i = 0u; i < 4u; ++i) {
                    lo[i] = x4[xb + i];
                    hi[i] = x4[xb + i + 4u];
                    sx += lo[i] + hi[i];
                }
                float sxs = sx.x + sx.y + sx.z + sx.w;
                for (uint r = 0u; r < ROWS; ++r) {
                    uint rec = (min(first + r, N - 1u) * nb + b) * REC;
                    float sq = 0.0;
                    for (uint i = 0u; i < 4u; ++i) {
                        uint word = WORD(rec + SCALES + i);
                        sq += dot(bytes4(word & 0x0F0F0F0Fu), lo[i]) + dot(bytes4((word >> 4u) & 0x0F0F0F0Fu), hi[i]);
                    }
#if QTYPE == 0
                    acc[r] += uintBitsToFloat(WORD(rec)) * (sq - 8.0 * sxs);
#else
                    acc[r] += uintBitsToFloat(WORD(rec)) * sq + uintBitsToFloat(WORD(rec + 1u)) * sxs;
#endif
                }
#endif
            }
            for (uint r = 0u; r < ROWS && first + r < N; ++r) {
                y[m * ldy + n0 + first + r] = acc[r];
            }
        }
    }
}
