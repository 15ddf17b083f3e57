#version 450
// Rotary embedding with the angles' cos and sin given as tensors (ExecuTorch's
// et_vk.apply_rotary_emb / apply_rotary_emb_hf): x is [B, T, H, D] contiguous, cos and sin are
// rows of F values; row (pos * H + h) with PER_HEAD, else row pos, where pos = step[0] + t (the
// start position lives in a buffer: a SymInt read on the device), clamped to the last row.
//   INTERLEAVED 1 (llama): pairs (2i, 2i+1) turn by row[i], F = D / 2.
//   INTERLEAVED 0 (Hugging Face, rotate_half): the first F of D turn, element d < F with its
//   partner half F/2 away by row[d]; elements d >= F pass through.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer Cos { float cosv[]; };
layout(set = 0, binding = 3) readonly buffer Sin { float sinv[]; };
layout(set = 0, binding = 4) readonly buffer Step { uint step[]; };

layout(push_constant) uniform Params {
    uint n;     // B * T * H * D
    uint T;
    uint H;
    uint D;
    uint F;     // values per row of cos / sin
    uint rows;  // rows of cos / sin
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint e = gl_GlobalInvocationID.x; e < n; e += stride) {
        uint d = e % D;
        uint row = e / D;
        uint h = row % H;
        uint pos = step[0] + (row / H) % T;
#if PER_HEAD
        uint fr = min(pos * H + h, rows - 1u);
#else
        uint fr = min(pos, rows - 1u);
#endif
#if INTERLEAVED
        uint f = fr * F + d / 2u;
        float c = cosv[f];
        float s = sinv[f];
        outv[e] = (d % 2u == 0u) ? x[e] * c - x[e + 1u] * s : x[e - 1u] * s + x[e] * c;
#else
        if (d >= F) {
            outv[e] = x[e];
        } else {
            uint half_ = F / 2u;
            float rot = d < half_ ? -x[e + half_] : x[e - half_];
            outv[e] = x[e] * cosv[fr * F + d] + rot * sinv[fr * F + d];
        }
#endif
    }
}
