// GGML block formats (32 weights per block) and vkgraph's packed layout for them.
//   Q4_0: f16 d, 16 bytes of nibbles           w = d * (q - 8)       18 bytes
//   Q4_1: f16 d, f16 m, 16 bytes of nibbles    w = d * q + m         20 bytes
//   Q8_0: f16 d, 32 int8                       w = d * q             34 bytes
// Nibbles: byte j holds weight j (low) and weight j + 16 (high).
// Packed: one record of REC 32-bit words per block, blocks row-major over (row, block): the
// scale word, then the quant words. Q4_0 and Q8_0 (pack_quant.glsl): d as a float (their blocks
// are not word-aligned, so they are cut out anyway). Q4_1: the file's block as it is, d and m as
// two float16 in its first word (a copy packs it). Rows are contiguous, so a window of rows is a
// contiguous range of the buffer. BLOCK_D / BLOCK_M: a record's scales from its first word.
#if QTYPE == 0
#define BLOCK_BYTES 18u
#define QUANT_OFFSET 2u
#define WORDS 4u
#define SCALES 1u
#elif QTYPE == 1
#define BLOCK_BYTES 20u
#define QUANT_OFFSET 4u
#define WORDS 4u
#define SCALES 1u
#else
#define BLOCK_BYTES 34u
#define QUANT_OFFSET 2u
#define WORDS 8u
#define SCALES 1u
#endif
#define REC (WORDS + SCALES)
#if QTYPE == 1
#define BLOCK_D(word) unpackHalf2x16(word).x
#define BLOCK_M(word) unpackHalf2x16(word).y
#else
#define BLOCK_D(word) uintBitsToFloat(word)
#endif
