#version 450
// out[o][i] = reduce over r of in[o][r][i] for `in` seen as [outer, R, inner].
// OP: 0 sum, 1 mean, 2 max, 3 min, 4 any (1.0 if any element is non-zero), 5 argmax, 6 argmin
// (the first index of the extreme, as a float; a NaN counts as the extreme, as torch).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer In { float inv[]; };

layout(push_constant) uniform Params {
    uint outer;
    uint R;
    uint inner;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < outer * inner; i += stride) {
        uint o = i / inner;
        uint j = i % inner;
        uint base = o * R * inner + j;
#if OP == 5 || OP == 6
        float best = inv[base];
        uint at = 0u;
        for (uint r = 1u; r < R && !isnan(best); ++r) {
            float v = inv[base + r * inner];
#if OP == 5
            if (v > best || isnan(v)) {
#else
            if (v < best || isnan(v)) {
#endif
                best = v;
                at = r;
            }
        }
        outv[i] = float(at);
        continue;
#endif
#if OP == 2
        float acc = -1.0 / 0.0;
#elif OP == 3
        float acc = 1.0 / 0.0;
#else
        float acc = 0.0;
#endif
        for (uint r = 0u; r < R; ++r) {
            float v = inv[base + r * inner];
#if OP == 2
            acc = max(acc, v);
#elif OP == 3
            acc = min(acc, v);
#elif OP == 4
            acc = max(acc, float(v != 0.0));
#else
            acc += v;
#endif
        }
#if OP == 1
        acc /= float(R);
#endif
        outv[i] = acc;
    }
}
