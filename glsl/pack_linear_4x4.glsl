#version 450
// Packer "linear_4x4": an fp32 linear weight W[N][K] (out_features x in_features) packed in
// 4x4 blocks, as ET-VK's pack_fp_linear_weight does for its GEMV/GEMM shaders.
//
// Block (n4, k4) holds rows 4*n4..4*n4+3 and columns 4*k4..4*k4+3; blocks are stored row-major
// over (n4, k4), and inside a block element (kk, nn) sits at kk*4 + nn, so one vec4 read gives
// the weights of 4 consecutive output channels for one input channel. Rows and columns past
// N and K are zero padding. Elements move as raw 32-bit words (bit-exact). One invocation per
// block: 16 words read, 4 vectors written (a word per invocation ran at half the speed on
// lavapipe; reading the rows as vectors measured no faster).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };

layout(push_constant) uniform Params {
    uint N;
    uint K;
};

void main() {
    uint K4 = (K + 3u) / 4u;
    uint blocks = ((N + 3u) / 4u) * K4;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint b = gl_GlobalInvocationID.x; b < blocks; b += stride) {
        uint n0 = (b / K4) * 4u;
        uint k0 = (b % K4) * 4u;
        uvec4 r[4];
        for (uint nn = 0u; nn < 4u; ++nn) {
            uint n = n0 + nn;
            for (uint kk = 0u; kk < 4u; ++kk) {
                r[nn][kk] = (n < N && k0 + kk < K) ? src[n * K + k0 + kk] : 0u;
            }
        }
        for (uint kk = 0u; kk < 4u; ++kk) {
            dst[b * 4u + kk] = uvec4(r[0][kk], r[1][kk], r[2][kk], r[3][kk]);
        }
    }
}
