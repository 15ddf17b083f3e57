#version 450
// y[m][n0 + n] = x[m][:] . W[n][:] for the N rows of W bound here (a window starting at row n0
// of a larger weight; ldy is y's row length), W quantized in GGML blocks and packed by
// pack_quant.glsl. One invocation per output element, dequantizing as it goes.
#extension GL_GOOGLE_include_directive : require
#include "quant_blocks.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer Wq { uint w[]; };

layout(push_constant) uniform Params {
    uint M;
    uint N;
    uint K;
    uint n0;
    uint ldy;
};

void main() {
    uint nb = K / 32u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < M * N; o += stride) {
        uint m = o / N;
        uint n = o % N;
        float acc = 0.0;
        for (uint b = 0u; b < nb; ++b) {
            uint rec = (n * nb + b) * REC;
            uint xb = m * K + b * 32u;
            float d = uintBitsToFloat(w[rec]);
            float sq = 0.0;
#if QTYPE == 2
            for (uint i = 0u; i < 8u; ++i) {
                uint word = w[rec + SCALES + i];
                for (uint k = 0u; k < 4u; ++k) {
                    sq += float(bitfieldExtract(int(word), int(k * 8u), 8)) * x[xb + i * 4u + k];
                }
            }
            acc += d * sq;
#else
            float sx = 0.0;
            for (uint i = 0u; i < 4u; ++i) {
                uint word = w[rec + SCALES + i];
                for (uint k = 0u; k < 4u; ++k) {
                    uint byte_ = (word >> (k * 8u)) & 0xFFu;
                    float lo = x[xb + i * 4u + k];
                    float hi = x[xb + i * 4u + k + 16u];
                    sq += float(byte_ & 0xFu) * lo + float(byte_ >> 4u) * hi;
                    sx += lo + hi;
                }
            }
#if QTYPE == 0
            acc += d * (sq - 8.0 * sx);
#else
            acc += d * sq + uintBitsToFloat(w[rec + 1u]) * sx;
#endif
#endif
        }
        y[m * ldy + n0 + n] = acc;
    }
}
