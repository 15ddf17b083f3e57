#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] for the N rows of W bound here (a window starting at row n0
// of a larger weight; ldy is y's row length), W the file's GGML blocks (quant_blocks.h). Each
// invocation computes ROWS consecutive rows for TOKENS consecutive m (on GPUs a row, for
// ops.LINEAR_TOKENS_GPU tokens of a batch; more rows on CPU renderers): a weight block decoded once
// serves TOKENS tokens and the x values loaded once serve ROWS rows; four weights per 32-bit word.
// TEXEL reads W, X_TEXEL x, as a uniform texel buffer: lavapipe runs a storage-buffer load inside
// a loop as a loop over its SIMD lanes, a texel fetch as one gather. RESIDUAL adds res (shaped as
// y) to y. GATED (a Llama MLP's gate and up projections in one dispatch, x read once for both):
// y = silu(x . W[n]) * (x . U[n]), U a second weight of W's format and shape (binding 3).
// NORM (one token at a time only): x is RMS-normalized first, x / sqrt(mean(x^2) + eps) * g (g:
// the norm's weight, the next binding): x * g goes into the dot products and the sum of x^2 taken
// as x is read scales y at the end, so the norm costs no dispatch of its own. (In tiles every
// invocation would normalize its tokens again: a batch runs the norm apart, once.)
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "grid.h"
#include "quant_blocks.h"
#ifndef ROWS
#define ROWS 1
#endif
#ifndef TOKENS
#define TOKENS 1
#endif
#ifndef Q8X
#define Q8X 0
#endif
#ifndef HEAD_AT
#define HEAD_AT 0
#endif
#ifndef SPLIT
#define SPLIT 1
#endif

layout(local_size_x_id = 0) in;

// Y4 (tiles whose rows, row offset and y's row length are multiples of 4): y, and res, as vec4s,
// four rows a store (lavapipe stores lane by lane, a vector's components in one pass over the lanes)
#if Y4
#define YTYPE vec4
#else
#define YTYPE float
#endif
layout(set = 0, binding = 0) writeonly buffer Y { YTYPE y[]; };
#if Q8X
// Q8X (tiles of Q4 weights in planes; config graph.int8_activations): x in glsl/q8_pairs.glsl's
// int8 form, two tokens a word, as RGBA32UI texels: a block of a pair of tokens is 8 texels, the
// blocks' scales (d and d * sum of q of each token) a texel each after all the pairs' quants. A
// tile's first token m0 is even (TOKENS even, or a single tile).
layout(set = 0, binding = 1) uniform usamplerBuffer xt;
#define XQ4(i) ivec4(texelFetch(xt, int(i)))
#elif X_TEXEL
layout(set = 0, binding = 1) uniform samplerBuffer xt;  // RGBA32F texels
#define X4(i) texelFetch(xt, int(i))
#else
layout(set = 0, binding = 1) readonly buffer X { vec4 x4[]; };
#define X4(i) x4[i]
#endif
// W's words (and GATED's U's: binding 3) as R32UI texels or storage buffers
#if TEXEL
layout(set = 0, binding = 2) uniform usamplerBuffer wt;
#define WORD(i) texelFetch(wt, int(i)).x
#if GATED
layout(set = 0, binding = 3) uniform usamplerBuffer ut;
#define UWORD(i) texelFetch(ut, int(i)).x
#endif
#else
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };
#define WORD(i) w[i]
#if GATED
layout(set = 0, binding = 3) readonly buffer Uq { uint u[]; };
#define UWORD(i) u[i]
#endif
#endif

// PLANES (quant_blocks.h): block b's quant texel j (of QUADS) and its head; the weight's N rows
// hold N * K / 32 blocks.
#if PLANES
#define NBLK (N * (K / 32u))
#if TEXEL
#define WORD_QUADS(b, j) texelFetch(wt, int((b) * QUADS + (j)))
#define UWORD_QUADS(b, j) texelFetch(ut, int((b) * QUADS + (j)))
#if HEAD_AT
// the heads through R32UI views of the same buffers (bindings HEAD_AT and, GATED, the next):
// lavapipe fetches each of a texel's channels, so a head out of an RGBA32UI texel cost four
// fetches and a pick (SmolLM2's one-token Q4_1 GEMVs ran 30-40% faster without the heads)
layout(set = 0, binding = HEAD_AT) uniform usamplerBuffer wh;
#define WORD_HEAD(b) texelFetch(wh, int(PLANE_HEAD(b))).x
#if GATED
layout(set = 0, binding = HEAD_AT + 1) uniform usamplerBuffer uh;
#define UWORD_HEAD(b) texelFetch(uh, int(PLANE_HEAD(b))).x
#endif
#else
#define PICK(v, c) ((c) == 0u ? (v).x : ((c) == 1u ? (v).y : ((c) == 2u ? (v).z : (v).w)))
#define WORD_HEAD(b) PICK(texelFetch(wt, int(NBLK * QUADS + ((b) >> 2u))), (b) & 3u)
#define UWORD_HEAD(b) PICK(texelFetch(ut, int(NBLK * QUADS + ((b) >> 2u))), (b) & 3u)
#endif
#else
#define QUAD_AT(a, at) uvec4(a[at], a[(at) + 1u], a[(at) + 2u], a[(at) + 3u])
#define WORD_QUADS(b, j) QUAD_AT(w, PLANE_QUANT(b, (j) * 4u))
#define WORD_HEAD(b) w[PLANE_HEAD(b)]
#define UWORD_QUADS(b, j) QUAD_AT(u, PLANE_QUANT(b, (j) * 4u))
#define UWORD_HEAD(b) u[PLANE_HEAD(b)]
#endif
#endif

#if RESIDUAL
layout(set = 0, binding = 3) readonly buffer Res { YTYPE res[]; };
#endif
#if NORM
#if G_TEXEL
layout(set = 0, binding = 3 + RESIDUAL + GATED) uniform samplerBuffer gt;
#define G4(i) texelFetch(gt, int(i))
#else
layout(set = 0, binding = 3 + RESIDUAL + GATED) readonly buffer G { vec4 g4[]; };
#define G4(i) g4[i]
#endif
// x's vec4 v as the dot products take it (times gv, the norm weight's), its squares added to SS
#define XN(v, gv, SS) { SS += dot(v, v); v *= (gv); }
#define RMS(SS) inversesqrt((SS) / float(K) + eps)
#else
#define XN(v, gv, SS)
#define RMS(SS) 1.0
#endif

#include "linear_params.h"

// The four bytes of word as floats, converted as signed ints (values below 256): SwiftShader
// converts unsigned ones in several instructions (SmolLM2 decode step 109 -> 98 ms there)
vec4 bytes4(uint word) {
    return vec4(ivec4(uvec4(word) >> uvec4(0u, 8u, 16u, 24u) & 0xFFu));
}

#if PLANES && QTYPE != 2
// The low nibbles of word's four bytes, each masked where it lies and converted as a signed int
// (positive: the top one below 2^28): nibble f's value times 2^(8f), no shift (SwiftShader shifts
// a vector lane by lane). LO_SCALE's places take them back down exactly. A tile scales the
// nibbles by them (its high nibbles: word >> 4 first); against bytes4 of the masked word,
// SmolLM2's four linear shapes in q4_1 at 64 tokens, one process each, min of 15: SwiftShader 283,
// 357, 265 -> 216, 271, 246 ms; lavapipe within its noise (six pairs: median of the mins 22.3 ->
// 22.5). One token scales x instead (below).
vec4 nibbles_lo(uint w) { return vec4(ivec4(uvec4(w) & uvec4(0xFu, 0xF00u, 0xF0000u, 0xF000000u))); }
#define LO_SCALE vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0)
#endif
#if QTYPE == 2 && PLANES
// Q8_0's four int8 of word as floats times 2^24: each byte moved to the top byte, the rest masked
// off, converted as a signed int (the block's scale d takes the 2^-24, Q8_0_UNIT; exact). Against
// bytes4 and a sign fix, in one process: SmolLM2's four layer linears in q8_0, lavapipe (AVX2)
// one token 1.36 -> 1.27 ms, 64 tokens 14.7 -> 12.3 ms; SwiftShader 4.80 -> 3.62 and 117 -> 80 ms
vec4 int8x4_high(uint w) {
    return vec4(ivec4(uvec4(w << 24u, (w << 16u) & 0xFF000000u, (w << 8u) & 0xFF000000u, w & 0xFF000000u)));
}
#define Q8_0_UNIT (1.0 / 16777216.0)
#if TOKENS == 1
// A one-token linear's int8 decoded where they lie, with no shift: SwiftShader shifts a vector lane
// by lane. Each low byte's sign bit flipped (the int is then the byte plus 128 times its place
// 2^(8k)), the top byte's kept (its signed value times 2^24); x's values come scaled by 2^24 over
// their byte's place (Q8_PLACES: d's Q8_0_UNIT holds as for the tiles), and the 128s' share, 2^31
// times the sum of x's values at the low three bytes (xc, made once per block for all the rows), is
// taken off once per row's block. Against int8x4_high, SmolLM2's four linear shapes at one token in
// q8_0 on SwiftShader 7.96-10.0 -> 5.24-5.77 ms (lavapipe within its noise); its decode step's
// linears 141-155 -> 115-118 ms (the q8_0 output head). The tiles keep int8x4_high, each decode
// serving 8 tokens (with this one and each token's x scaled, SwiftShader's q8_0 shapes at 64 tokens
// took 244 and 273 ms against 186 and 187; lavapipe within its noise).
vec4 int8x4_placed(uint w) {
    uint v = w ^ 0x00808080u;
    return vec4(ivec4(uvec4(v & 0xFFu, v & 0xFF00u, v & 0xFF0000u, v & 0xFF000000u)));
}
#define Q8_PLACES vec4(16777216.0, 65536.0, 256.0, 1.0)
#endif
#endif
#if PLANES && QTYPE != 2 && TOKENS == 1
// A one-token linear's Q4 nibbles decoded where they lie: word & mask is nibble f's value times
// 2^(4f) (nibbles_lo, nibbles_hi), converted as a signed int (the top nibble's sign bit flipped
// first, so its int is the nibble less 8 times 2^28, the 8s' share xh added once per block:
// SwiftShader shifts a vector lane by lane, and word >> 28 had cost its q4_1 GEMVs 8%); x's values
// come scaled by the inverse (LO_SCALE, HI_SCALE: exact), once per block for all the rows. Against
// bytes4 of the shifted, masked word, in one process: SmolLM2's four layer linears at one token,
// SwiftShader q4_1 3.88 -> 1.92 ms, q4_0 4.81 -> 2.43; lavapipe (AVX2) within -10% .. +1%. The
// tiles scale the nibbles, not each token's x: that cost more there than the decode it saves, which
// the tile's tokens share (lavapipe's 64-token q4_1 linears 8.7 -> 9.2 ms)
vec4 nibbles_hi(uint w) {
    return vec4(ivec4(uvec4(w & 0xF0u, w & 0xF000u, w & 0xF00000u, (w ^ 0x80000000u) & 0xF0000000u)));
}
#define HI_SCALE vec4(1.0 / 16.0, 1.0 / 4096.0, 1.0 / 1048576.0, 1.0 / 268435456.0)
#endif
#if RESIDUAL
#define STORE(at, v) y[at] = (v) + res[at]
#else
#define STORE(at, v) y[at] = (v)
#endif
#if GATED
#define STORE_GATED(at, v, w) y[at] = (v) / (1.0 + exp(-(v))) * (w)
#endif

// A block's share of y from its quants . x (q) and x's sum (x): BLOCK_SCALES declares the
// block's scale d (and Q4_1's minimum mn), decoded once per block, SCALED applies them.
#if QTYPE == 0
#define BLOCK_SCALES(head, s) float d = BLOCK_D(head, s);
#define SCALED(q, x) (d * ((q) - 8.0 * (x)))
#elif QTYPE == 1
#define BLOCK_SCALES(head, s) float d = BLOCK_D(head, s), mn = BLOCK_M(head);
#define SCALED(q, x) (d * (q) + mn * (x))
#elif PLANES
#define BLOCK_SCALES(head, s) float d = BLOCK_D(head, s) * Q8_0_UNIT;
#define SCALED(q, x) (d * (q))
#else
#define BLOCK_SCALES(head, s) float d = BLOCK_D(head, s);
#define SCALED(q, x) (d * (q))
#endif

// One token: the block at word base (bit shift s) of a row, read through WORDF, dotted with x
// (xv: its 32 values; Q4: lo and hi, the sum sxs), added to ACC.
#if QTYPE == 2 && PLANES
#define ROW_BLOCK(WORDF, ACC) { \
    uint head = WORDF##_HEAD(blk); \
    float sq = 0.0; \
    [[unroll]] for (uint j = 0u; j < 2u; ++j) { \
        uvec4 quads = WORDF##_QUADS(blk, j); \
        [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
            sq += dot(int8x4_placed(quads[i]), xv[j * 4u + i]); \
        } \
    } \
    sq -= xc; \
    BLOCK_SCALES(head, s) \
    ACC += SCALED(sq, 0.0); }
#elif QTYPE == 2
#define ROW_BLOCK(WORDF, ACC) { \
    uint head = WORDF(base), prev = head; \
    float sq = 0.0; \
    for (uint i = 0u; i < 8u; ++i) { \
        uint next = WORDF(base + 1u + i); \
        vec4 q = bytes4(QUANT_WORD(prev, next, s)); \
        prev = next; \
        sq += dot(q - 256.0 * vec4(greaterThanEqual(q, vec4(128.0))), xv[i]); \
    } \
    BLOCK_SCALES(head, s) \
    ACC += SCALED(sq, 0.0); }
#elif PLANES
#define ROW_BLOCK(WORDF, ACC) { \
    uvec4 quads = WORDF##_QUADS(blk, 0u); \
    uint head = WORDF##_HEAD(blk); \
    float sq = xh; \
    [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
        sq += dot(nibbles_lo(quads[i]), lo[i]) + dot(nibbles_hi(quads[i]), hi[i]); \
    } \
    BLOCK_SCALES(head, s) \
    ACC += SCALED(sq, sxs); }
#else
#define ROW_BLOCK(WORDF, ACC) { \
    uint head = WORDF(base), prev = head; \
    float sq = 0.0; \
    for (uint i = 0u; i < 4u; ++i) { \
        uint next = WORDF(base + 1u + i); \
        uint word = QUANT_WORD(prev, next, s); \
        prev = next; \
        sq += dot(bytes4(word & 0x0F0F0F0Fu), lo[i]) + dot(bytes4((word >> 4u) & 0x0F0F0F0Fu), hi[i]); \
    } \
    BLOCK_SCALES(head, s) \
    ACC += SCALED(sq, sxs); }
#endif

// TOKENS tokens: the block at word base (bit shift s) of row r, read through WORDF, dotted with
// each token's x (xv, sums sx), added to ACC[r * TOKENS + t]. The token loops here and in the
// tiles' main are unrolled: SwiftShader keeps an array indexed in a loop in memory, and ran
// SmolLM2's 64-token prefill batch in 6.8 s with them rolled, 1.3-1.7 s unrolled (lavapipe's
// compiler unrolls them itself: no change there).
// sq[t] += q . xv[t * 8 + at] for each token. PAIRS (ops.DOT_PAIRS_RENDERERS): the products
// added in pairs, a pair for every token in turn, not each token's whole dot() in turn: lavapipe
// (AVX2; it multiplies and adds apart, fma() too), SmolLM2's 64-token prefill batch, both forms
// in one process, min of 8, six processes: -6% to -15% (508 -> 430 ms; its code spills a fifth
// fewer registers); Q8_0's tiles within the noise. SwiftShader ran them 2% faster, but compiled
// the longer code 2.7x slower (the gated linears' tests 27 -> 76 s).
#if PAIRS
#define DOT_TOKENS(q, at) \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] += q.x * xv[t * 8u + (at)].x + q.y * xv[t * 8u + (at)].y; \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] += q.z * xv[t * 8u + (at)].z + q.w * xv[t * 8u + (at)].w;
#else
#define DOT_TOKENS(q, at) [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] += dot(q, xv[t * 8u + (at)]);
#endif
#if Q8X
// The block's quants as ints less 8 (-8..7: Q4_0's w = d * q'; Q4_1's w = d * q' + (m + 8d)),
// each multiplied by a word of two tokens' int8 x (xp: its 16-bit halves keep the two sums apart),
// each token's sum then scaled by d and its x's scale xd, plus Q4_1's offset times x's sum sx.
// Against the float tiles: ops._q8_pairs.
#if QTYPE == 0
#define Q8X_OFFSET(d, head) 0.0
#else
#define Q8X_OFFSET(d, head) (BLOCK_M(head) + 8.0 * (d))
#endif
#define IDOT(q, X) (q.x * X.x + q.y * X.y + q.z * X.z + q.w * X.w)
#define TILE_BLOCK(WORDF, ACC) { \
    int sq[TOKEN_PAIRS]; \
    [[unroll]] for (uint p = 0u; p < TOKEN_PAIRS; ++p) sq[p] = 0; \
    uvec4 quads = WORDF##_QUADS(blk, 0u); \
    uint head = WORDF##_HEAD(blk); \
    [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
        ivec4 lo = ivec4((uvec4(quads[i]) >> uvec4(0u, 8u, 16u, 24u)) & 0xFu) - 8; \
        ivec4 hi = ivec4((uvec4(quads[i]) >> uvec4(4u, 12u, 20u, 28u)) & 0xFu) - 8; \
        [[unroll]] for (uint p = 0u; p < TOKEN_PAIRS; ++p) sq[p] += IDOT(lo, xp[p * 8u + i]) + IDOT(hi, xp[p * 8u + i + 4u]); \
    } \
    float d = BLOCK_D(head, s), c = Q8X_OFFSET(d, head); \
    [[unroll]] for (uint p = 0u; p < TOKEN_PAIRS; ++p) { \
        int lo16 = (sq[p] << 16) >> 16, hi16 = (sq[p] - lo16) >> 16; \
        ACC[r * TOKENS + 2u * p] += d * xd[2u * p] * float(lo16) + c * sx[2u * p]; \
        if (2u * p + 1u < TOKENS) \
            ACC[r * TOKENS + 2u * p + 1u] += d * xd[2u * p + 1u] * float(hi16) + c * sx[2u * p + 1u]; \
    } }
#elif QTYPE == 2 && PLANES
#define TILE_BLOCK(WORDF, ACC) { \
    float sq[TOKENS]; \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] = 0.0; \
    uint head = WORDF##_HEAD(blk); \
    [[unroll]] for (uint j = 0u; j < 2u; ++j) { \
        uvec4 quads = WORDF##_QUADS(blk, j); \
        [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
            vec4 q = int8x4_high(quads[i]); \
            DOT_TOKENS(q, j * 4u + i) \
        } \
    } \
    BLOCK_SCALES(head, s) \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) ACC[r * TOKENS + t] += SCALED(sq[t], sx[t]); }
#elif QTYPE == 2
// unrolled: lavapipe left this loop rolled once the quant words were spliced, and kept xv in
// memory (3x slower)
#define TILE_BLOCK(WORDF, ACC) { \
    float sq[TOKENS]; \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] = 0.0; \
    [[unroll]] for (uint i = 0u; i < 8u; ++i) { \
        vec4 q = bytes4(QUANT_WORD(WORDF(base + i), WORDF(base + i + 1u), s)); \
        q -= 256.0 * vec4(greaterThanEqual(q, vec4(128.0))); \
        [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] += dot(q, xv[t * 8u + i]); \
    } \
    BLOCK_SCALES(WORDF(base), s) \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) ACC[r * TOKENS + t] += SCALED(sq[t], sx[t]); }
#elif PLANES
#define TILE_BLOCK(WORDF, ACC) { \
    float sq[TOKENS]; \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] = 0.0; \
    uvec4 quads = WORDF##_QUADS(blk, 0u); \
    uint head = WORDF##_HEAD(blk); \
    [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
        vec4 lo = nibbles_lo(quads[i]) * LO_SCALE; \
        vec4 hi = nibbles_lo(quads[i] >> 4u) * LO_SCALE; \
        DOT_TOKENS(lo, i) \
        DOT_TOKENS(hi, i + 4u) \
    } \
    BLOCK_SCALES(head, s) \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) ACC[r * TOKENS + t] += SCALED(sq[t], sx[t]); }
#else
#define TILE_BLOCK(WORDF, ACC) { \
    float sq[TOKENS]; \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] = 0.0; \
    [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
        uint word = QUANT_WORD(WORDF(base + i), WORDF(base + i + 1u), s); \
        vec4 lo = bytes4(word & 0x0F0F0F0Fu); \
        vec4 hi = bytes4((word >> 4u) & 0x0F0F0F0Fu); \
        [[unroll]] for (uint t = 0u; t < TOKENS; ++t) sq[t] += dot(lo, xv[t * 8u + i]) + dot(hi, xv[t * 8u + i + 4u]); \
    } \
    BLOCK_SCALES(WORDF(base), s) \
    [[unroll]] for (uint t = 0u; t < TOKENS; ++t) ACC[r * TOKENS + t] += SCALED(sq[t], sx[t]); }
#endif

#if TOKENS == 1
// x's block b of token m as the one-token kernels take it: 8 vec4s xv (Q8_0; in planes scaled to
// the bytes' places, xc the sum int8x4_placed's bias takes off), or lo and hi with their sum sxs
// (Q4; in planes scaled to the nibbles' places, xh what nibbles_hi's bias takes off); the norm's
// squares added to ss.
#if QTYPE == 2
#if PLANES
#define Q8_PLACE(v) { xc += v.x + v.y + v.z; v *= Q8_PLACES; }
#define Q8_BIAS xc *= 2147483648.0;
#else
#define Q8_PLACE(v)
#define Q8_BIAS
#endif
#define X_BLOCK(m, b) \
    vec4 xv[8]; \
    float xc = 0.0; \
    { \
        uint xb = ((m) * K + (b) * 32u) / 4u; \
        [[unroll]] for (uint i = 0u; i < 8u; ++i) { \
            xv[i] = X4(xb + i); \
            XN(xv[i], G4((b) * 8u + i), ss) \
            Q8_PLACE(xv[i]) \
        } \
        Q8_BIAS \
    }
#else
#if PLANES
#define NIBBLE_PLACES \
    [[unroll]] for (uint i = 0u; i < 4u; ++i) { xh += 8.0 * hi[i].w; lo[i] *= LO_SCALE; hi[i] *= HI_SCALE; }
#else
#define NIBBLE_PLACES
#endif
#define X_BLOCK(m, b) \
    vec4 lo[4], hi[4]; \
    float sxs, xh = 0.0; \
    { \
        uint xb = ((m) * K + (b) * 32u) / 4u; \
        vec4 sx = vec4(0.0); \
        [[unroll]] for (uint i = 0u; i < 4u; ++i) { \
            lo[i] = X4(xb + i); \
            hi[i] = X4(xb + i + 4u); \
            XN(lo[i], G4((b) * 8u + i), ss) \
            XN(hi[i], G4((b) * 8u + i + 4u), ss) \
            sx += lo[i] + hi[i]; \
        } \
        sxs = sx.x + sx.y + sx.z + sx.w; \
        NIBBLE_PLACES \
    }
#endif

#if SPLIT > 1
// GPUs, one token at a time (decode; ops.GEMV_SPLIT_GPU): SPLIT consecutive invocations share a
// row, each taking every SPLIT-th block, their sums (and GATED's, NORM's squares) added in shared
// memory; a workgroup takes LOCAL_SIZE / SPLIT rows, and the workgroups loop over the rows. An
// invocation a row left most of a GPU idle (SmolLM2's 576-row linears: 9 workgroups).
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
shared vec4 split_sums[LOCAL_SIZE];

// The sums over each run of SPLIT invocations, for the run's first; every invocation calls it.
vec4 split_sum(vec4 v) {
    uint t = gl_LocalInvocationID.x;
    split_sums[t] = v;
    barrier();
    [[unroll]] for (uint h = SPLIT / 2u; h > 0u; h /= 2u) {
        if (t % SPLIT < h) split_sums[t] += split_sums[t + h];
        barrier();
    }
    vec4 r = split_sums[t];
    barrier();  // read before the next call writes
    return r;
}

void main() {
    uint nb = K / 32u;
    uint lane = gl_LocalInvocationID.x % SPLIT, per = LOCAL_SIZE / SPLIT;
    // the loop's bounds are the workgroup's: all its invocations reach split_sum's barriers
    for (uint first = gl_WorkGroupID.x * per; first < N; first += gl_NumWorkGroups.x * per) {
        uint row = first + gl_LocalInvocationID.x / SPLIT;
        for (uint m = 0u; m < M; ++m) {
            float acc = 0.0, accu = 0.0, ss = 0.0;
            for (uint b = lane; b < nb; b += SPLIT) {
                X_BLOCK(m, b)
                uint blk = min(row, N - 1u) * nb + b;
                uint base = BLOCK_WORD(blk), s = BLOCK_SHIFT(blk);
                ROW_BLOCK(WORD, acc)
#if GATED
                ROW_BLOCK(UWORD, accu)
#endif
            }
            vec4 sums = split_sum(vec4(acc, accu, ss, 0.0));
            if (lane == 0u && row < N) {
                float inv = RMS(sums.z);
#if GATED
                STORE_GATED(m * ldy + n0 + row, sums.x * inv, sums.y * inv);
#else
                STORE(m * ldy + n0 + row, sums.x * inv);
#endif
            }
        }
    }
}
#else
// One token at a time (decode): x's block loaded once for the ROWS rows, every m in turn.
// Kept apart from the tiled form below: SwiftShader's compiler keeps the tiled form's small
// arrays in memory (its GEMV ran 1.8x slower that way).
void main() {
    uint nb = K / 32u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x * ROWS;
    for (uint first = gl_GlobalInvocationID.x * ROWS; first < N; first += stride) {
        for (uint m = 0u; m < M; ++m) {
            float acc[ROWS];
            for (uint r = 0u; r < ROWS; ++r) acc[r] = 0.0;
#if GATED
            float accu[ROWS];
            for (uint r = 0u; r < ROWS; ++r) accu[r] = 0.0;
#endif
            float ss = 0.0;
            for (uint b = 0u; b < nb; ++b) {
                X_BLOCK(m, b)
                for (uint r = 0u; r < ROWS; ++r) {
                    uint blk = min(first + r, N - 1u) * nb + b;
                    uint base = BLOCK_WORD(blk), s = BLOCK_SHIFT(blk);
                    ROW_BLOCK(WORD, acc[r])
#if GATED
                    ROW_BLOCK(UWORD, accu[r])
#endif
                }
            }
            float inv = RMS(ss);
            for (uint r = 0u; r < ROWS && first + r < N; ++r) {
#if GATED
                STORE_GATED(m * ldy + n0 + first + r, acc[r] * inv, accu[r] * inv);
#else
                STORE(m * ldy + n0 + first + r, acc[r] * inv);
#endif
            }
        }
    }
}
#endif
#else
// Tiles of ROWS rows x TOKENS tokens (a batched prompt).
#define TOKEN_PAIRS ((TOKENS + 1) / 2)
void main() {
    uint nb = K / 32u;
    uint groups = (N + ROWS - 1u) / ROWS;
    uint work = groups * ((M + TOKENS - 1u) / TOKENS);
    // an invocation per tile (ops: nodes.grid_groups), no grid-stride loop: lavapipe ran the tiles
    // 5-20% faster without one
    uint o = GRID_ITEM;
    if (o < work) {
        uint first = (o % groups) * ROWS;
        uint m0 = (o / groups) * TOKENS;
        float acc[ROWS * TOKENS];
        [[unroll]] for (uint a = 0u; a < ROWS * TOKENS; ++a) acc[a] = 0.0;
#if GATED
        float accu[ROWS * TOKENS];
        [[unroll]] for (uint a = 0u; a < ROWS * TOKENS; ++a) accu[a] = 0.0;
#endif
        for (uint b = 0u; b < nb; ++b) {
#if Q8X
            ivec4 xp[TOKEN_PAIRS * 8];  // this block's 32 int8 x of each pair of tokens, their scales and sums
            float xd[TOKEN_PAIRS * 2], sx[TOKEN_PAIRS * 2];
            [[unroll]] for (uint p = 0u; p < TOKEN_PAIRS; ++p) {
                uint pp = min(m0 / 2u + p, (M - 1u) / 2u);
                uint xb = (pp * K + b * 32u) / 4u;
                [[unroll]] for (uint i = 0u; i < 8u; ++i) xp[p * 8u + i] = XQ4(xb + i);
                vec4 sc = intBitsToFloat(XQ4((M + 1u) / 2u * (K / 4u) + pp * nb + b));
                xd[2u * p] = sc.x;
                sx[2u * p] = sc.y;
                xd[2u * p + 1u] = sc.z;
                sx[2u * p + 1u] = sc.w;
            }
#else
            vec4 xv[TOKENS * 8];  // this block's 32 x values of each token, and their sums
            float sx[TOKENS];
            [[unroll]] for (uint t = 0u; t < TOKENS; ++t) {
                uint xb = (min(m0 + t, M - 1u) * K + b * 32u) / 4u;
                vec4 s = vec4(0.0);
                [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                    xv[t * 8u + i] = X4(xb + i);
                    s += xv[t * 8u + i];
                }
                sx[t] = s.x + s.y + s.z + s.w;
            }
#endif
            // unrolled: the accumulators' indices become constants (ops.LINEAR_TILE_ROWS_CPU)
            [[unroll]] for (uint r = 0u; r < ROWS; ++r) {
                uint blk = min(first + r, N - 1u) * nb + b;
                uint base = BLOCK_WORD(blk), s = BLOCK_SHIFT(blk);
                TILE_BLOCK(WORD, acc)
#if GATED
                TILE_BLOCK(UWORD, accu)
#endif
            }
        }
        // unrolled too, each store guarded (lavapipe: SmolLM2's linears at 32 tokens in one
        // process, min of 10, rolled -> unrolled: q4_1 10.45 -> 9.27 ms, q8_0 18.4 -> 12.3, q4_0
        // 15.6 -> 11.8; SwiftShader within 1%)
#if Y4
#define ROW_STEP 4u
#define ACC4(A, r, t) vec4(A[(r) * TOKENS + t], A[(r + 1u) * TOKENS + t], A[(r + 2u) * TOKENS + t], A[(r + 3u) * TOKENS + t])
#define AT(t, r) (((m0 + t) * ldy + n0 + first + r) / 4u)
#else
#define ROW_STEP 1u
#define ACC4(A, r, t) A[(r) * TOKENS + t]
#define AT(t, r) ((m0 + t) * ldy + n0 + first + r)
#endif
        [[unroll]] for (uint t = 0u; t < TOKENS; ++t) {
            [[unroll]] for (uint r = 0u; r < ROWS; r += ROW_STEP) {
                if (m0 + t < M && first + r < N) {
#if GATED
                    STORE_GATED(AT(t, r), ACC4(acc, r, t), ACC4(accu, r, t));
#else
                    STORE(AT(t, r), ACC4(acc, r, t));
#endif
                }
            }
        }
    }
}
#endif
