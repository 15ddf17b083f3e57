#version 450
#extension GL_EXT_control_flow_attributes : require
// Packer "linear_4x4": an fp32 linear weight W[N][K] (out_features x in_features) packed in
// 4x4 blocks, as ET-VK's pack_fp_linear_weight does for its GEMV/GEMM shaders.
//
// Block (n4, k4) holds rows 4*n4..4*n4+3 and columns 4*k4..4*k4+3; blocks are stored row-major
// over (n4, k4), and inside a block element (kk, nn) sits at kk*4 + nn, so one vec4 read gives
// the weights of 4 consecutive output channels for one input channel. Rows and columns past
// N and K are zero padding. Elements move as raw 32-bit words (bit-exact). A block is 16 words
// read, 4 vectors written (a word per invocation ran at half the speed on
// lavapipe; reading the rows as vectors from a storage buffer measured no faster).
// TEXEL (K a multiple of 4) reads the source as a uniform texel buffer of RGBA32UI texels, a
// block row's 4 words per fetch: lavapipe runs a storage-buffer load inside a loop as a loop
// over its SIMD lanes, a texel fetch as one load per lane (packing 1.5-1.8x faster there, 1.3x
// on SwiftShader; packers.Packer.texel_source). Writing the destination as a storage texel
// buffer too measured slower (lavapipe: MiniLM's legacy loads 0.090-0.134 s against 0.080-0.091).
// An invocation packs BLOCKS consecutive blocks (packers.Linear4x4Packer.BLOCKS; row-major, so
// they may run on into the next block row), its loops unrolled: SwiftShader's compiler keeps an
// array indexed in a loop in memory, and an invocation's fixed costs (the grid-stride loop, the
// division by K4) are paid once for them all (synthetic:128's settled packing on SwiftShader, GPU
// time: 0.146-0.188 s with one block an invocation in rolled loops, 0.129 unrolled, 0.109-0.117
// with 8 blocks; lavapipe within its noise).
// STORE64 (device shaderInt64; packers.Linear4x4Packer.device_defines) writes a block as two
// 32-byte vectors of 64-bit words, the same bytes: lavapipe stores lane by lane, each component
// apart, and at 16 lanes halving the stores packed 1.3x faster.

layout(local_size_x_id = 0) in;
#ifndef STORE64
#define STORE64 0
#endif
#ifndef BLOCKS
#define BLOCKS 1
#endif

#if TEXEL
layout(set = 0, binding = 0) uniform usamplerBuffer srct;
#else
layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
#endif
#if STORE64
#extension GL_ARB_gpu_shader_int64 : require
layout(set = 0, binding = 1) writeonly buffer Dst { u64vec4 dst[]; };
#else
layout(set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };
#endif

layout(push_constant) uniform Params {
    uint N;
    uint K;
};

void main() {
    uint K4 = (K + 3u) / 4u;
    uint blocks = ((N + 3u) / 4u) * K4;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x * uint(BLOCKS);
    for (uint b0 = gl_GlobalInvocationID.x * uint(BLOCKS); b0 < blocks; b0 += stride) {
        uint n0 = (b0 / K4) * 4u;
        uint k0 = (b0 % K4) * 4u;
        [[unroll]] for (uint j = 0u; j < uint(BLOCKS); ++j) {
            uint b = b0 + j;
            if (b < blocks) {
                uvec4 r[4];
                [[unroll]] for (uint nn = 0u; nn < 4u; ++nn) {
                    uint n = n0 + nn;
#if TEXEL
                    r[nn] = n < N ? texelFetch(srct, int((n * K + k0) / 4u)) : uvec4(0u);
#else
                    [[unroll]] for (uint kk = 0u; kk < 4u; ++kk) {
                        r[nn][kk] = (n < N && k0 + kk < K) ? src[n * K + k0 + kk] : 0u;
                    }
#endif
                }
#if STORE64
                // words (kk, 0..3) then (kk + 1, 0..3), little-endian: as the uvec4 stores below
                [[unroll]] for (uint kk = 0u; kk < 4u; kk += 2u) {
                    dst[b * 2u + kk / 2u] = u64vec4(
                        packUint2x32(uvec2(r[0][kk], r[1][kk])), packUint2x32(uvec2(r[2][kk], r[3][kk])),
                        packUint2x32(uvec2(r[0][kk + 1u], r[1][kk + 1u])), packUint2x32(uvec2(r[2][kk + 1u], r[3][kk + 1u])));
                }
#else
                [[unroll]] for (uint kk = 0u; kk < 4u; ++kk) {
                    dst[b * 4u + kk] = uvec4(r[0][kk], r[1][kk], r[2][kk], r[3][kk]);
                }
#endif
            }
            k0 += 4u;  // the next block of the row, or the first of the next row
            if (k0 == K4 * 4u) {
                k0 = 0u;
                n0 += 4u;
            }
        }
    }
}
