// Reading packed quantized weights; include after quant_blocks.h and a readonly `uint w[]`.

// Weight j (0..31) of block blk.
float dequant(uint blk, uint j) {
    uint base = BLOCK_WORD(blk), s = BLOCK_SHIFT(blk);
    float d = BLOCK_D(w[base], s);
#if QTYPE == 2
    uint i = j / 4u;
    uint word = QUANT_WORD(w[base + i], w[base + i + 1u], s);
    return d * float(bitfieldExtract(int(word), int((j % 4u) * 8u), 8));
#else
    uint i = (j % 16u) / 4u;
    uint byte_ = (QUANT_WORD(w[base + i], w[base + i + 1u], s) >> ((j % 4u) * 8u)) & 0xFFu;
    float q = float(j < 16u ? byte_ & 0xFu : byte_ >> 4u);
#if QTYPE == 0
    return d * (q - 8.0);
#else
    return d * q + BLOCK_M(w[base]);
#endif
#endif
}
