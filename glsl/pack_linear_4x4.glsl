#version 450
// Packer "linear_4x4": an fp32 linear weight W[N][K] (out_features x in_features) packed in
// 4x4 blocks, as ET-VK's pack_fp_linear_weight does for its GEMV/GEMM shaders.
//
// Block (n4, k4) holds rows 4*n4..4*n4+3 and columns 4*k4..4*k4+3; blocks are stored row-major
// over (n4, k4), and inside a block element (kk, nn) sits at kk*4 + nn, so one vec4 read gives
// the weights of 4 consecutive output channels for one input channel. Rows and columns past
// N and K are zero padding. Elements move as raw 32-bit words (bit-exact).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint N;
    uint K;
};

void main() {
    uint K4 = (K + 3u) / 4u;
    uint total = ((N + 3u) / 4u) * K4 * 16u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint block = o / 16u;
        uint within = o % 16u;
        uint n = (block / K4) * 4u + within % 4u;
        uint k = (block % K4) * 4u + within / 4u;
        dst[o] = (n < N && k < K) ? src[n * K + k] : 0u;
    }
}
