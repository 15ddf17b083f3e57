// q_at(n, k): the quantized value of weight row n, column k, for the kernels of weights quantized
// in groups (linear_qw.glsl, embedding_qw.glsl). BITS 4: row n holds row_bytes bytes; byte k/2
// has k even in its low nibble, k odd in its high one, q = nibble - 8 (ET-VK's q4gsw); HI_FIRST
// swaps the nibbles (ET-VK's qcs4w, ExecuTorch's embedding_4bit). BITS 8: row n holds signed
// bytes. The includer declares the words w[] and the push constant row_bytes.
#ifndef BITS
#define BITS 4
#endif
#ifndef HI_FIRST
#define HI_FIRST 0
#endif

uint byte_at(uint i) {
    return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu;
}

float q_at(uint n, uint k) {
#if BITS == 4
    uint b = byte_at(n * row_bytes + (k >> 1));
    return float(int(((k & 1u) == HI_FIRST) ? (b & 0xFu) : (b >> 4)) - 8);
#else
    uint b = byte_at(n * row_bytes + k);
    return float(int(b) - (b >= 128u ? 256 : 0));
#endif
}
