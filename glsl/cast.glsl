#version 450
// out[i] = float(in[i]) for int32 in (TO_INT 0), or int(round toward zero)(in[i]) for float in (TO_INT 1).

layout(local_size_x_id = 0) in;

#if TO_INT
layout(set = 0, binding = 0) writeonly buffer Out { int outv[]; };
layout(set = 0, binding = 1) readonly buffer In { float inv[]; };
#else
layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer In { int inv[]; };
#endif

layout(push_constant) uniform Params {
    uint n;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
#if TO_INT
        outv[i] = int(inv[i]);
#else
        outv[i] = float(inv[i]);
#endif
    }
}
