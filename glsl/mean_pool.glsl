#version 450
// out[b][d] = sum_t mask[b*T+t] * x[b*T+t][d] / max(sum_t mask[b*T+t], 1e-9)  (masked mean pooling)

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer Mask { float mask[]; };

layout(push_constant) uniform Params {
    uint B;
    uint T;
    uint D;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < B * D; o += stride) {
        uint b = o / D;
        uint d = o % D;
        float s = 0.0;
        float n = 0.0;
        for (uint t = 0u; t < T; ++t) {
            float w = mask[b * T + t];
            s += w * x[(b * T + t) * D + d];
            n += w;
        }
        outv[o] = s / max(n, 1e-9);
    }
}
