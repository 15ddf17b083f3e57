#version 450
// x [M, K] (K a multiple of 32) in the int8 form CPU renderers' Q4 tiles read (linear_quant.glsl
// Q8X), llama.cpp's scheme for the activations of a Q4 dot product: each token's blocks of 32
// values scaled by d = max|x| / 127 and rounded to q = roundEven(x * 127 / max|x|), in [-127, 127].
// Two tokens a word, token 2p's q in the low 16 bits and 2p + 1's above them (the int q0 + q1 *
// 65536), so that one 32-bit multiply by a weight's quant (-8..7) gives both tokens' products; a
// block's 32 of them add up to at most 32 * 127 * 8 < 2^15, so the halves never run into each
// other. Out, as ints: P = ceil(M / 2) pairs of K words, then P * K / 32 vec4s (d0, d0 * sum of
// q0, d1, d1 * sum of q1) of each pair's block as float bits (an odd M's last pair has q1 = 0).
// An invocation per pair. NORM: the rows RMS-normalized first, x / sqrt(mean(x^2) + eps) * g.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Q { ivec4 q4[]; };
layout(set = 0, binding = 1) uniform samplerBuffer xt;
#if NORM
layout(set = 0, binding = 2) uniform samplerBuffer gt;
#endif

layout(push_constant) uniform Params {
    uint M;
    uint K;
    float eps;
};

// row m's RMS-norm factor 1 / sqrt(mean(x^2) + eps) (1 without NORM)
float inv_rms(uint m) {
#if NORM
    vec4 s = vec4(0.0);
    for (uint i = 0u; i < K / 4u; ++i) {
        vec4 v = texelFetch(xt, int(m * (K / 4u) + i));
        s += v * v;
    }
    return inversesqrt((s.x + s.y + s.z + s.w) / float(K) + eps);
#else
    return 1.0;
#endif
}

void main() {
    uint pairs = (M + 1u) / 2u, nb = K / 32u;
    for (uint p = gl_GlobalInvocationID.x; p < pairs; p += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        uint m0 = 2u * p, m1 = min(m0 + 1u, M - 1u);
        float one = m0 + 1u < M ? 1.0 : 0.0;  // an odd M's last pair: no second token
        float inv0 = inv_rms(m0), inv1 = inv_rms(m1) * one;
        for (uint b = 0u; b < nb; ++b) {
            vec4 v0[8], v1[8];
            vec4 mx0 = vec4(0.0), mx1 = vec4(0.0);
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
#if NORM
                vec4 g = texelFetch(gt, int(b * 8u + i));
#else
                vec4 g = vec4(1.0);
#endif
                v0[i] = texelFetch(xt, int((m0 * K + b * 32u) / 4u + i)) * inv0 * g;
                v1[i] = texelFetch(xt, int((m1 * K + b * 32u) / 4u + i)) * inv1 * g;
                mx0 = max(mx0, abs(v0[i]));
                mx1 = max(mx1, abs(v1[i]));
            }
            float a0 = max(max(mx0.x, mx0.y), max(mx0.z, mx0.w)), a1 = max(max(mx1.x, mx1.y), max(mx1.z, mx1.w));
            float id0 = a0 > 0.0 ? 127.0 / a0 : 0.0, id1 = a1 > 0.0 ? 127.0 / a1 : 0.0;
            ivec4 s0 = ivec4(0), s1 = ivec4(0);
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                ivec4 q0 = ivec4(roundEven(v0[i] * id0)), q1 = ivec4(roundEven(v1[i] * id1));
                s0 += q0;
                s1 += q1;
                q4[(p * K + b * 32u) / 4u + i] = q0 + (q1 << 16);
            }
            float d0 = a0 / 127.0, d1 = a1 / 127.0;
            q4[pairs * (K / 4u) + p * nb + b] = floatBitsToInt(vec4(d0, d0 * float(s0.x + s0.y + s0.z + s0.w),
                                                                    d1, d1 * float(s1.x + s1.y + s1.z + s1.w)));
        }
    }
}
