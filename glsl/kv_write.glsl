#version 450
// cache[step[0] + t][:] = src[t][:] for t < T: append this step's keys or values to a
// key/value cache of `rows` rows (rows past the end are dropped).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) buffer Cache { float cache[]; };
layout(set = 0, binding = 1) readonly buffer Src { float src[]; };
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };

layout(push_constant) uniform Params {
    uint T;
    uint W;
    uint rows;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < T * W; o += stride) {
        uint row = step[0] + o / W;
        if (row < rows) {
            cache[row * W + o % W] = src[o];
        }
    }
}
