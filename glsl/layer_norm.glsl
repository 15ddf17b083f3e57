#version 450
// y[m][d] = (x[m][d] - mean) / sqrt(var + eps) * w[d] + b[d] over the last dimension; one
// workgroup per row, mean and variance in two shared-memory reductions (no E[x^2] - E[x]^2).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };
layout(set = 0, binding = 3) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint M;
    uint D;
    float eps;
};

shared float partial[LOCAL_SIZE];

float row_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    partial[t] = v;
    barrier();
    for (uint half_ = LOCAL_SIZE / 2u; half_ > 0u; half_ /= 2u) {
        if (t < half_) {
            partial[t] += partial[t + half_];
        }
        barrier();
    }
    float total = partial[0];
    barrier();  // everyone has read partial[0] before it is reused
    return total;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint m = gl_WorkGroupID.x; m < M; m += gl_NumWorkGroups.x) {
        float s = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            s += x[m * D + d];
        }
        float mean = row_sum(s) / float(D);
        float q = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            float c = x[m * D + d] - mean;
            q += c * c;
        }
        float inv = inversesqrt(row_sum(q) / float(D) + eps);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = (x[m * D + d] - mean) * inv * w[d] + b[d];
        }
    }
}
