#version 450
// y[m][:] = softmax(x[m][:]) over the last dimension (max-subtracted), or its log with LOG=1;
// one workgroup per row.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
#include "reduce.h"

#ifndef LOG
#define LOG 0
#endif

layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform Params {
    uint M;
    uint D;
};

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint m = gl_WorkGroupID.x; m < M; m += gl_NumWorkGroups.x) {
        float mx = -3.4e38;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            mx = max(mx, x[m * D + d]);
        }
        mx = workgroup_max(mx);
        float s = 0.0;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            s += exp(x[m * D + d] - mx);
        }
        s = workgroup_sum(s);
#if LOG
        float lse = mx + log(s);
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = x[m * D + d] - lse;
        }
#else
        float inv = 1.0 / s;
        for (uint d = t; d < D; d += LOCAL_SIZE) {
            y[m * D + d] = exp(x[m * D + d] - mx) * inv;
        }
#endif
    }
}
