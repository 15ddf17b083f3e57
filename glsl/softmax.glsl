#version 450
// y[m][:] = softmax(x[m][:]) over the last dimension (max-subtracted); one workgroup per row.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform Params {
    uint M;
    uint D;
};

shared float partial[LOCAL_SIZE];

float reduce(float v, bool take_max) {
    uint t = gl_LocalInvocationID.x;
    partial[t] = v;
    barrier();
    for (uint half_ = LOCAL_SIZE / 2u; half_ > 0u; half_ /= 2u) {
        if (t < half_) {
            partial[t] = take_max ? max(partial[t], partial[t + half_]) : partial[t] + partial[t + half_];
        }
        barrier();
    }
    float r = partial[0];
    barrier();
    return r;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint m = gl_WorkGroupID.x; m < M; m += gl_NumWorkGroups.x) {
        float mx = -3.4e38;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            mx = max(mx, x[m * D + d]);
        }
        mx = reduce(mx, true);
        float s = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            s += exp(x[m * D + d] - mx);
        }
        float inv = 1.0 / reduce(s, false);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = exp(x[m * D + d] - mx) * inv;
        }
    }
}
