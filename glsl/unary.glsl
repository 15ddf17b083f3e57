#version 450
// out[i] = f(a[i]). OP: 0 silu (x * sigmoid(x)), 1 relu.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Params {
    uint n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        float v = a[i];
#if OP == 0
        outv[i] = v / (1.0 + exp(-v));
#else
        outv[i] = max(v, 0.0);
#endif
    }
}
