#version 450
// out = c != 0 ? a : b with numpy broadcasting over up to 4 dims (as binary.glsl: dims d, element
// strides sc/sa/sb per output dim, 0 where broadcast).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer C { float c[]; };
layout(set = 0, binding = 2) readonly buffer A { float a[]; };
layout(set = 0, binding = 3) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uvec4 d;
    uvec4 sc;
    uvec4 sa;
    uvec4 sb;
    uint n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uvec4 k = uvec4(i / (d.y * d.z * d.w), (i / (d.z * d.w)) % d.y, (i / d.w) % d.z, i % d.w);
        bool cond = c[k.x * sc.x + k.y * sc.y + k.z * sc.z + k.w * sc.w] != 0.0;
        outv[i] = cond ? a[k.x * sa.x + k.y * sa.y + k.z * sa.z + k.w * sa.w]
                       : b[k.x * sb.x + k.y * sb.y + k.z * sb.z + k.w * sb.w];
    }
}
