#version 450
// out[i] = a[i] OP b[i % b_n]: elementwise, with b repeated along a's rows when it is shorter
// (a bias or a per-channel scale). OP: 0 add, 1 sub, 2 mul.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint n;
    uint b_n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        float av = a[i];
        float bv = b[i % b_n];
#if OP == 0
        outv[i] = av + bv;
#elif OP == 1
        outv[i] = av - bv;
#else
        outv[i] = av * bv;
#endif
    }
}
