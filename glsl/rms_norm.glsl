#version 450
// y[m][d] = x[m][d] / sqrt(mean_d(x[m][d]^2) + eps) * w[d]; one workgroup per row, the sum of
// squares reduced in shared memory.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
#include "reduce.h"

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };

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
            float v = x[m * D + d];
            s += v * v;
        }
        float scale = inversesqrt(workgroup_sum(s) / float(D) + eps);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = x[m * D + d] * scale * w[d];
        }
    }
}
