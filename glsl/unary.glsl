#version 450
// out[i] = unary_op(a[i]) (glsl/unary_op.h: OP and OP2 pick the function; p0..p3 its parameters).
#extension GL_GOOGLE_include_directive : require
#ifndef OP
#define OP 0
#endif
#ifndef OP2
#define OP2 0
#endif
#include "unary_op.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Params {
    uint n;
    float p0;
    float p1;
    float p2;
    float p3;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        outv[i] = unary_op(a[i], p0, p1, p2, p3);
    }
}
