// Reading packed quantized weights; include after quant_blocks.h and a readonly `uint w[]`, and
// with PLANES after NBLK (the blocks bound) is defined.

#if PLANES
#define HEAD_WORD(blk) w[PLANE_HEAD(blk)]
#define QUANT_AT(blk, i) w[PLANE_QUANT(blk, i)]
#else
#define HEAD_WORD(blk) w[BLOCK_WORD(blk)]
#define QUANT_AT(blk, i) QUANT_WORD(w[BLOCK_WORD(blk) + (i)], w[BLOCK_WORD(blk) + (i) + 1u], BLOCK_SHIFT(blk))
#endif

// Weight j (0..31) of block blk.
float dequant(uint blk, uint j) {
    uint head = HEAD_WORD(blk);
    float d = BLOCK_D(head, BLOCK_SHIFT(blk));
#if QTYPE == 2
    return d * float(bitfieldExtract(int(QUANT_AT(blk, j / 4u)), int((j % 4u) * 8u), 8));
#else
    uint byte_ = (QUANT_AT(blk, (j % 16u) / 4u) >> ((j % 4u) * 8u)) & 0xFFu;
    float q = float(j < 16u ? byte_ & 0xFu : byte_ >> 4u);
#if QTYPE == 0
    return d * (q - 8.0);
#else
    return d * q + BLOCK_M(head);
#endif
#endif
}
