#version 450
// Packer "transposed": dst[c][r] = src[r][c] for a rows x cols matrix of 32-bit elements
// (moved as raw words, so the result is bit-exact for any 4-byte dtype).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint cols;
};

void main() {
    uint total = rows * cols;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint c = o / rows;
        uint r = o % rows;
        dst[o] = src[r * cols + c];
    }
}
