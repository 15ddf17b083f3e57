#version 450
// out[t][k] = dequantized table[ids[t]][k] for a table packed by pack_quant.glsl; ids outside
// [0, V) give a zero row.
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };

#include "quant_dequant.h"

layout(push_constant) uniform Params {
    uint T;
    uint K;
    uint V;
};

void main() {
    uint nb = K / 32u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < T * K; i += stride) {
        int id = ids[i / K];
        uint k = i % K;
        float v = 0.0;
        if (id >= 0 && uint(id) < V) {
            uint blk = uint(id) * nb + k / 32u;
            v = dequant(blk * WORDS, V * nb * WORDS + blk * SCALES, k % 32u);
        }
        outv[i] = v;
    }
}
