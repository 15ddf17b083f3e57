// Reading packed quantized weights; include after quant_blocks.h and a readonly `uint w[]`.

// Weight j (0..31) of the packed block whose record starts at word rec.
float dequant(uint rec, uint j) {
    float d = BLOCK_D(w[rec]);
    uint wbase = rec + SCALES;
#if QTYPE == 2
    uint word = w[wbase + j / 4u];
    return d * float(bitfieldExtract(int(word), int((j % 4u) * 8u), 8));
#else
    uint byte_ = (w[wbase + (j % 16u) / 4u] >> (((j % 16u) % 4u) * 8u)) & 0xFFu;
    float q = float(j < 16u ? byte_ & 0xFu : byte_ >> 4u);
#if QTYPE == 0
    return d * (q - 8.0);
#else
    return d * q + BLOCK_M(w[rec]);
#endif
#endif
}
