#version 450
// y[m][d] = (x[m][d] - mean) / sqrt(var + eps) * w[d] + b[d] over the last dimension; one
// workgroup per row, mean and variance in two shared-memory reductions (no E[x^2] - E[x]^2).

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
#include "reduce.h"

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };
layout(set = 0, binding = 3) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint M;
    uint D;
    float eps;
};

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint m = gl_WorkGroupID.x; m < M; m += gl_NumWorkGroups.x) {
        float s = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            s += x[m * D + d];
        }
        float mean = workgroup_sum(s) / float(D);
        float q = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            float c = x[m * D + d] - mean;
            q += c * c;
        }
        float inv = inversesqrt(workgroup_sum(q) / float(D) + eps);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = (x[m * D + d] - mean) * inv * w[d] + b[d];
        }
    }
}
