#version 450
// y[m][:] = x[m][:] / max(||x[m][:]||_2, eps); one workgroup per row.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
#include "reduce.h"

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

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
        float inv = 1.0 / max(sqrt(workgroup_sum(s)), eps);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = x[m * D + d] * inv;
        }
    }
}
