#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] (+ bias[n0 + n]) (+ res[m][n0 + n]) for the N rows of W bound
// here (a window starting at row n0 of a larger weight; ldy is y's row length), W packed by
// pack_linear_4x4.glsl, K a multiple of 4. The fp32 linear of CPU renderers (linear_4x4.glsl
// elsewhere): each invocation computes 4 * R4 consecutive rows for TOKENS consecutive m, so a
// weight block loaded once serves TOKENS tokens and an x vec4 loaded once serves 4 * R4 rows.
// TEXEL reads W, X_TEXEL x, as an RGBA32F uniform texel buffer: lavapipe runs a storage-buffer
// load inside a loop as a loop over its SIMD lanes, a texel fetch as one gather (see
// linear_quant.glsl). ACT (1 + an OP of unary_op.h; 0: none) applies that function to
// x . W + bias, before the residual is added.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef R4
#define R4 1
#endif
#ifndef TOKENS
#define TOKENS 1
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef W_ROWS
#define W_ROWS 0
#endif
#if ACT
#define OP (ACT - 1)
#define OP2 0
#include "unary_op.h"
#define EPILOGUE(v) unary_op(v, 0.0, 0.0, 0.0, 0.0)
#else
#define EPILOGUE(v) (v)
#endif

layout(local_size_x_id = 0) in;

// Y4 (tiles whose rows, row offset and y's row length are multiples of 4): y, bias and res as
// vec4s, four rows a store (lavapipe stores lane by lane, a vector's components in one pass over
// the lanes)
#if Y4
#define YTYPE vec4
#define EPI(v) vec4(EPILOGUE((v).x), EPILOGUE((v).y), EPILOGUE((v).z), EPILOGUE((v).w))
#else
#define YTYPE float
#define EPI(v) EPILOGUE(v)
#endif
layout(set = 0, binding = 0) writeonly buffer Y { YTYPE y[]; };
#if X_TEXEL
layout(set = 0, binding = 1) uniform samplerBuffer xt;
#define X4(i) texelFetch(xt, int(i))
#else
layout(set = 0, binding = 1) readonly buffer X { vec4 x4[]; };
#define X4(i) x4[i]
#endif
#if TEXEL
layout(set = 0, binding = 2) uniform samplerBuffer wt;
#define W4(i) texelFetch(wt, int(i))
#else
layout(set = 0, binding = 2) readonly buffer W { vec4 w4[]; };
#define W4(i) w4[i]
#endif
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer B { YTYPE bias[]; };
#define BIAS(n) bias[n]
#else
#define BIAS(n) 0.0
#endif
#if RESIDUAL
layout(set = 0, binding = 3 + HAS_BIAS) readonly buffer Res { YTYPE res[]; };
#define STORE(at, n, v) y[at] = EPI((v) + BIAS(n)) + res[at]
#else
#define STORE(at, n, v) y[at] = EPI((v) + BIAS(n))
#endif

#include "linear_params.h"
#include "grid.h"

#if W_ROWS
// W as it is, [N, K] row-major (no packing: the load copies it): ROW4(n4, k4, c) is row n4 * 4 + c
// at input channels k4 * 4 ..
#define ROW4(n4, k4, c) W4(min((n4) * 4u + (c), N - 1u) * k4s + (k4))
#else
// W4(blk + kk): 4 output channels (n4 * 4 ..) of input channel k4 * 4 + kk
#define BLOCK(n4, k4) ((min(n4, N4 - 1u) * k4s + (k4)) * 4u)
#endif

#if TOKENS == 1
// One token at a time (GEMV): kept apart from the tiled form.
void main() {
    uint k4s = K / 4u;
    uint N4 = (N + 3u) / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x * R4;
    for (uint first = gl_GlobalInvocationID.x * R4; first < N4; first += stride) {
        for (uint m = 0u; m < M; ++m) {
            vec4 acc[R4];
            for (uint r = 0u; r < R4; ++r) acc[r] = vec4(0.0);
            for (uint k4 = 0u; k4 < k4s; ++k4) {
                vec4 xv = X4(m * k4s + k4);
                for (uint r = 0u; r < R4; ++r) {
#if W_ROWS
                    acc[r] += vec4(dot(ROW4(first + r, k4, 0u), xv), dot(ROW4(first + r, k4, 1u), xv),
                                   dot(ROW4(first + r, k4, 2u), xv), dot(ROW4(first + r, k4, 3u), xv));
#else
                    uint blk = BLOCK(first + r, k4);
                    acc[r] += W4(blk) * xv.x + W4(blk + 1u) * xv.y + W4(blk + 2u) * xv.z + W4(blk + 3u) * xv.w;
#endif
                }
            }
            for (uint r = 0u; r < R4; ++r) {
                for (uint c = 0u; c < 4u; ++c) {
                    uint n = (first + r) * 4u + c;
                    if (n < N) STORE(m * ldy + n0 + n, n0 + n, acc[r][c]);
                }
            }
        }
    }
}
#else
void main() {
    uint k4s = K / 4u;
    uint N4 = (N + 3u) / 4u;
    uint groups = (N4 + R4 - 1u) / R4;
    uint tgroups = (M + TOKENS - 1u) / TOKENS;
    // an invocation per tile (ops: nodes.grid_groups), no grid-stride loop: lavapipe ran the tiles
    // 5-20% faster without one
    uint o = GRID_ITEM;
    if (o < groups * tgroups) {
        // consecutive invocations (a SIMD group's lanes) take consecutive token tiles of one
        // row tile: their weight fetches are the same texels
        uint first = (o / tgroups) * R4;
        uint m0 = (o % tgroups) * TOKENS;
        float acc[R4 * 4u * TOKENS];
        [[unroll]] for (uint a = 0u; a < R4 * 4u * TOKENS; ++a) acc[a] = 0.0;
        for (uint k4 = 0u; k4 < k4s; ++k4) {
            vec4 xv[TOKENS];
            [[unroll]] for (uint t = 0u; t < TOKENS; ++t) xv[t] = X4(min(m0 + t, M - 1u) * k4s + k4);
            // unrolled, the accumulators' indices are constants: rolled, lavapipe updated them lane
            // by lane (a MiniLM layer's six linears at 32 tokens: 6.3 GPU ms against 17.8).
            // SwiftShader keeps an array indexed inside a loop in memory, so the token loops are
            // unrolled too (its MiniLM at batch 1: 13 sentences/s with linear_4x4.glsl, 47 so)
            [[unroll]] for (uint r = 0u; r < R4; ++r) {
#if W_ROWS
                mat4 wm = mat4(ROW4(first + r, k4, 0u), ROW4(first + r, k4, 1u), ROW4(first + r, k4, 2u),
                               ROW4(first + r, k4, 3u));
#else
                uint blk = BLOCK(first + r, k4);
                mat4 wm = transpose(mat4(W4(blk), W4(blk + 1u), W4(blk + 2u), W4(blk + 3u)));
#endif
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) acc[(r * 4u + c) * TOKENS + t] += dot(wm[c], xv[t]);
                }
            }
        }
        // unrolled too, each store guarded (lavapipe, one process, 1536-row linears at 32 tokens,
        // min of 8, rolled -> unrolled: K 384 2.75 -> 0.95 ms, K 1536 8.39 -> 2.74)
#if Y4
#define ROW_STEP 4u
#define ACC4(r, t) vec4(acc[(r) * TOKENS + t], acc[(r + 1u) * TOKENS + t], acc[(r + 2u) * TOKENS + t], acc[(r + 3u) * TOKENS + t])
#define Y_AT(i) ((i) / 4u)
#else
#define ROW_STEP 1u
#define ACC4(r, t) acc[(r) * TOKENS + t]
#define Y_AT(i) (i)
#endif
        [[unroll]] for (uint t = 0u; t < TOKENS; ++t) {
            [[unroll]] for (uint r = 0u; r < R4 * 4u; r += ROW_STEP) {
                uint n = first * 4u + r;
                if (m0 + t < M && n < N) STORE(Y_AT((m0 + t) * ldy + n0 + n), Y_AT(n0 + n), ACC4(r, t));
            }
        }
    }
}
#endif
