#version 450
// Packer "q4_0" / "q4_1" / "q8_0": GGML blocks (raw bytes, N rows of row_bytes) repacked so a
// GEMV reads whole 32-bit quant words and float scales (layout in quant_blocks.h). One
// invocation per block.
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint N;
    uint nb;  // blocks per row
    uint row_bytes;
};

uint byte_at(uint off) {
    return (src[off >> 2u] >> ((off & 3u) * 8u)) & 0xFFu;
}

float half_at(uint off) {
    return unpackHalf2x16(byte_at(off) | (byte_at(off + 1u) << 8u)).x;
}

void main() {
    uint blocks = N * nb;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint blk = gl_GlobalInvocationID.x; blk < blocks; blk += stride) {
        uint base = (blk / nb) * row_bytes + (blk % nb) * BLOCK_BYTES;
        uint q = base + QUANT_OFFSET;
        uint rec = blk * REC;
        dst[rec] = floatBitsToUint(half_at(base));
#if QTYPE == 1
        dst[rec + 1u] = floatBitsToUint(half_at(base + 2u));
#endif
        for (uint i = 0u; i < WORDS; ++i) {
            uint o = q + 4u * i;
            dst[rec + SCALES + i] = byte_at(o) | (byte_at(o + 1u) << 8u) | (byte_at(o + 2u) << 16u) | (byte_at(o + 3u) << 24u);
        }
    }
}
