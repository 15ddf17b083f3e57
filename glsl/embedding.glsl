#version 450
// out[t][d] = table[ids[t]][d]. The bound table is the window of rows [r0, r1) of a V-row table:
// only ids in the window are written, and the dispatch with `first` set also writes zero rows for
// ids outside [0, V).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(set = 0, binding = 2) readonly buffer Table { float table[]; };

layout(push_constant) uniform Params {
    uint T;
    uint D;
    uint r0;
    uint r1;
    uint V;
    uint first;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < T * D; i += stride) {
        uint t = i / D;
        int id = ids[t];
        if (id >= int(r0) && id < int(r1)) {
            outv[i] = table[(uint(id) - r0) * D + i % D];
        } else if (first != 0u && (id < 0 || uint(id) >= V)) {
            outv[i] = 0.0;
        }
    }
}
