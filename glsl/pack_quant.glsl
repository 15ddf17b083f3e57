#version 450
// Packer "q4_0" / "q8_0": GGML blocks (raw bytes, N rows of row_bytes) repacked so a
// GEMV reads whole 32-bit quant words and float scales (layout in quant_blocks.h). One
// invocation per block. A block starts at byte BLOCK_BYTES * blk: on a word boundary, or (its
// blocks are 18 or 34 bytes) two bytes past one, so its words are read whole and
// cut with one 16-bit shift; no private arrays (on lavapipe an indexed local array is memory,
// every access a loop over the SIMD lanes).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "quant_blocks.h"
#if QTYPE == 1
#error Q4_1 blocks are packed as they are: a copy (graph/packers.py)
#endif

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint N;
    uint nb;  // blocks per row
    uint row_bytes;
};

void main() {
    uint blocks = N * nb;
    uint last = (N * row_bytes - 1u) / 4u;  // the last source word holding a byte
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint blk = gl_GlobalInvocationID.x; blk < blocks; blk += stride) {
        uint a = blk * BLOCK_BYTES;
        uint w = a >> 2u;
        uint rec = blk * REC;
        uint head = src[w];
        if ((a & 2u) == 0u) {
            // aligned: d is the low half of the first word, the quants start 2 bytes in
            dst[rec] = floatBitsToUint(unpackHalf2x16(head).x);
            uint lo = head;
            [[unroll]] for (uint i = 0u; i < WORDS; ++i) {
                uint hi = src[min(w + 1u + i, last)];
                dst[rec + SCALES + i] = (lo >> 16u) | (hi << 16u);
                lo = hi;
            }
        } else {
            // two bytes past a word: d is the first word's high half, the quants are whole words
            dst[rec] = floatBitsToUint(unpackHalf2x16(head >> 16u).x);
            [[unroll]] for (uint i = 0u; i < WORDS; ++i) {
                dst[rec + SCALES + i] = src[w + 1u + i];
            }
        }
    }
}
