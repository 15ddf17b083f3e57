#version 450
// y[i] = alpha * x[i] + BETA * y[i] for i < n (grid-stride, so any n fits any dispatch size).
// The smoke-test kernel: alpha and n arrive as push constants, BETA and the workgroup size as
// specialization constants, so one shader exercises every way a kernel gets its parameters.

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const float BETA = 1.0;

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };

layout(push_constant) uniform Params {
    float alpha;
    uint n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        y[i] = alpha * x[i] + BETA * y[i];
    }
}
