// GGML block formats (32 weights per block). The packed weight is the file's blocks as they are,
// one after another, rows contiguous; block i starts at byte i * BLOCK_BYTES.
//   Q4_0: f16 d, 16 bytes of nibbles           w = d * (q - 8)       18 bytes
//   Q4_1: f16 d, f16 m, 16 bytes of nibbles    w = d * q + m         20 bytes
//   Q8_0: f16 d, 32 int8                       w = d * q             34 bytes
// Nibbles: byte j holds weight j (low) and weight j + 16 (high).
// Q4_1's blocks are word-aligned. Q4_0's and Q8_0's start on a word (BLOCK_SHIFT 0) or half way
// into one (BLOCK_SHIFT 16); either way 5 (Q4_0) or 9 (Q8_0) words from BLOCK_WORD hold the block:
// BLOCK_D reads d from the first, QUANT_WORD splices quant word j from words j and j + 1.
#if QTYPE == 0
#define BLOCK_BYTES 18u
#elif QTYPE == 1
#define BLOCK_BYTES 20u
#else
#define BLOCK_BYTES 34u
#endif
// PLANES (packers.QuantPlanesPacker, CPU renderers): the blocks split into two planes, every
// block's quants (QUADS RGBA32UI texels: 16 bytes of nibbles, or Q8_0's 32 int8), then every
// block's head (a word: d and Q4_1's m, or d in the low half; BLOCK_SHIFT 0).
#ifndef PLANES
#define PLANES 0
#endif
#if QTYPE == 2
#define QUADS 2u
#else
#define QUADS 1u
#endif
// In words (NBLK: the blocks bound, which the includer defines): quant word i of block b, and
// block b's head.
#define PLANE_QUANT(b, i) ((b) * QUADS * 4u + (i))
#define PLANE_HEAD(b) (NBLK * QUADS * 4u + (b))
// A block's first word and where in it the block starts (0 or 16 bits). Written without a
// division: lavapipe's linears ran 30% slower on ((i) * BLOCK_BYTES / 4u).
#if QTYPE == 1 || PLANES
#define BLOCK_WORD(i) ((i) * 5u)
#define BLOCK_SHIFT(i) 0u
#else
#define BLOCK_WORD(i) ((i) * (BLOCK_BYTES / 4u) + ((i) >> 1u))
#define BLOCK_SHIFT(i) (((i) & 1u) * 16u)
#endif
#if QTYPE == 1
#define BLOCK_D(head, s) unpackHalf2x16(head).x
#define BLOCK_M(head) unpackHalf2x16(head).y
#define QUANT_WORD(lo, hi, s) (hi)
#else
#define BLOCK_D(head, s) unpackHalf2x16((head) >> (s)).x
// The quant bytes start 2 bytes after the block: the word at byte 2 of (lo, hi) when s is 0,
// hi itself when s is 16.
#define QUANT_WORD(lo, hi, s) ((((lo) >> 16u) >> (s)) | ((hi) << (16u - (s))))
#endif
