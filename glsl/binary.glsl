#version 450
// out = a OP b with numpy broadcasting over up to 4 dims: out has dims d[4] (padded with 1 on
// the left); sa/sb are a's and b's element strides per output dim (0 where it is broadcast).
// OP: 0 add, 1 sub, 2 mul.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uvec4 d;   // vectors first: a uvec4 is 16-byte aligned in the push-constant block
    uvec4 sa;
    uvec4 sb;
    uint n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uvec4 c = uvec4(i / (d.y * d.z * d.w), (i / (d.z * d.w)) % d.y, (i / d.w) % d.z, i % d.w);
        float av = a[c.x * sa.x + c.y * sa.y + c.z * sa.z + c.w * sa.w];
        float bv = b[c.x * sb.x + c.y * sb.y + c.z * sb.z + c.w * sb.w];
#if OP == 0
        outv[i] = av + bv;
#elif OP == 1
        outv[i] = av - bv;
#else
        outv[i] = av * bv;
#endif
    }
}
