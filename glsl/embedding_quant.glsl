#version 450
// out[t][k] = dequantized table[ids[t]][k] for a table of GGML blocks (quant_blocks.h; PLANES:
// split into planes, the whole table bound). The bound table is the window of rows [r0, r1) of a
// V-row table: only ids in the window are written, and the dispatch with `first` set also writes
// zero rows for ids outside [0, V).
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };

layout(push_constant) uniform Params {
    uint T;
    uint K;
    uint r0;
    uint r1;
    uint V;
    uint first;
};

#define NBLK ((r1 - r0) * (K / 32u))  // PLANES: the whole table is bound
#include "quant_dequant.h"

void main() {
    uint nb = K / 32u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < T * K; i += stride) {
        int id = ids[i / K];
        uint k = i % K;
        if (id >= int(r0) && id < int(r1)) {
            outv[i] = dequant((uint(id) - r0) * nb + k / 32u, k % 32u);
        } else if (first != 0u && (id < 0 || uint(id) >= V)) {
            outv[i] = 0.0;
        }
    }
}
