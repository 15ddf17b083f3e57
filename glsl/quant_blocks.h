// GGML block formats (32 weights per block) and vkgraph's packed layout for them.
//   Q4_0: f16 d, 16 bytes of nibbles           w = d * (q - 8)       18 bytes
//   Q4_1: f16 d, f16 m, 16 bytes of nibbles    w = d * q + m         20 bytes
//   Q8_0: f16 d, 32 int8                       w = d * q             34 bytes
// Nibbles: byte j holds weight j (low) and weight j + 16 (high).
// Packed (pack_quant.glsl): one record of REC 32-bit words per block, blocks row-major over
// (row, block): the scales as floats (d, or d and m for Q4_1), then the quant words. Rows are
// contiguous, so a window of rows is a contiguous range of the buffer.
#if QTYPE == 0
#define BLOCK_BYTES 18u
#define QUANT_OFFSET 2u
#define WORDS 4u
#define SCALES 1u
#elif QTYPE == 1
#define BLOCK_BYTES 20u
#define QUANT_OFFSET 4u
#define WORDS 4u
#define SCALES 2u
#else
#define BLOCK_BYTES 34u
#define QUANT_OFFSET 2u
#define WORDS 8u
#define SCALES 1u
#endif
#define REC (WORDS + SCALES)
