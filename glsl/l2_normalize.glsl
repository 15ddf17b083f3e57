#version 450
// y[m][:] = x[m][:] / max(||x[m][:]||_2, eps); one workgroup per row.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform Params {
    uint M;
    uint D;
    float eps;
};

shared float partial[LOCAL_SIZE];

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint m = gl_WorkGroupID.x; m < M; m += gl_NumWorkGroups.x) {
        float s = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            float v = x[m * D + d];
            s += v * v;
        }
        partial[t] = s;
        barrier();
        for (uint half_ = LOCAL_SIZE / 2u; half_ > 0u; half_ /= 2u) {
            if (t < half_) {
                partial[t] += partial[t + half_];
            }
            barrier();
        }
        float inv = 1.0 / max(sqrt(partial[0]), eps);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = x[m * D + d] * inv;
        }
        barrier();
    }
}
