#version 450
// out[t][d] = table[ids[t]][d]; ids outside [0, V) give a zero row.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer Table { float table[]; };

layout(push_constant) uniform Params {
    uint T;
    uint D;
    uint V;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < T * D; i += stride) {
        uint t = i / D;
        int id = ids[t];
        outv[i] = (id >= 0 && uint(id) < V) ? table[uint(id) * D + i % D] : 0.0;
    }
}
