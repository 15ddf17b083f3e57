#version 450
// Packer "q4_0" / "q4_1" / "q8_0": GGML blocks (raw bytes, N rows of row_bytes) repacked so a
// GEMV reads whole 32-bit quant words and float scales (layout in quant_blocks.h). One
// invocation per 4 consecutive blocks: their 4 * BLOCK_BYTES bytes start on a word boundary, so
// it reads them as BLOCK_BYTES whole words (not byte by byte: on lavapipe every storage-buffer
// load in a loop is a loop over the SIMD lanes) and cuts the blocks out with shifts.
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

#define GROUP_WORDS BLOCK_BYTES  // 4 blocks of BLOCK_BYTES bytes = BLOCK_BYTES words

uint v[GROUP_WORDS + 1u];

// The 4 bytes at byte offset a of the group (any alignment).
uint word_at(uint a) {
    uint s = (a & 3u) * 8u;
    uint lo = v[a >> 2u];
    return s == 0u ? lo : (lo >> s) | (v[(a >> 2u) + 1u] << (32u - s));
}

void main() {
    uint blocks = N * nb;
    uint groups = (blocks + 3u) / 4u;
    uint last = (N * row_bytes - 1u) / 4u;  // the last source word holding a byte
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint grp = gl_GlobalInvocationID.x; grp < groups; grp += stride) {
        for (uint i = 0u; i < GROUP_WORDS; ++i) {
            v[i] = src[min(grp * GROUP_WORDS + i, last)];
        }
        v[GROUP_WORDS] = 0u;
        for (uint j = 0u; j < 4u; ++j) {
            uint blk = grp * 4u + j;
            if (blk < blocks) {
                uint base = j * BLOCK_BYTES;
                uint rec = blk * REC;
                uint head = word_at(base);  // the f16 scale d (and, for Q4_1, m)
                dst[rec] = floatBitsToUint(unpackHalf2x16(head).x);
#if QTYPE == 1
                dst[rec + 1u] = floatBitsToUint(unpackHalf2x16(head >> 16u).x);
#endif
                for (uint i = 0u; i < WORDS; ++i) {
                    dst[rec + SCALES + i] = word_at(base + QUANT_OFFSET + 4u * i);
                }
            }
        }
    }
}
