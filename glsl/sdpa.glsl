#version 450
// Scaled dot-product attention, one workgroup per (batch b, head h, query i):
//   out[b,i,h,:] = softmax_j(q[b,i,h,:] . k[b,j,kh,:] * scale + mask) @ v[b,j,kh,:]
// q: [B*T, H*Dh], k and v: [B*S, Hkv*Dh] (kh = h / (H / Hkv): grouped-query heads share a
// key/value head), key_mask: [B*S] (0 = padding, masked out). With causal != 0, query i sits at
// position q_pos0 + i and sees keys j <= q_pos0 + i (q_pos0 > 0 when a key/value cache holds
// earlier tokens). With DYNAMIC_POS, q_pos0 is read from step[0] (binding 5) so recorded command
// buffers serve every generation step; keys past the last visible one are never read.


#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LOCAL_SIZE = 64;
#include "reduce.h"

#ifndef MAX_KEYS
#define MAX_KEYS 2048
#endif

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer Q { float q[]; };
layout(set = 0, binding = 2) readonly buffer K { float k[]; };
layout(set = 0, binding = 3) readonly buffer V { float v[]; };
layout(set = 0, binding = 4) readonly buffer Mask { float key_mask[]; };
#if DYNAMIC_POS
layout(set = 0, binding = 5) readonly buffer Step { uint step[]; };
#endif

#include "sdpa_params.h"

shared float scores[MAX_KEYS];
void main() {
    uint t = gl_LocalInvocationID.x;
    uint rows = B * H * T;
    uint group = H / Hkv;
    for (uint row = gl_WorkGroupID.x; row < rows; row += gl_NumWorkGroups.x) {
        uint b = row / (H * T);
        uint h = (row / T) % H;
        uint i = row % T;
        uint kh = h / group;
        uint q_base = (b * T + i) * H * Dh + h * Dh;
#if DYNAMIC_POS
        uint pos0 = step[0];
#else
        uint pos0 = q_pos0;
#endif
        uint last = causal != 0u ? min(S, pos0 + i + 1u) : S;

        float local_max = -3.4e38;
        for (uint j = t; j < last; j += LOCAL_SIZE) {
            float s = -3.4e38;
            if (key_mask[b * S + j] != 0.0) {
                uint k_base = (b * S + j) * Hkv * Dh + kh * Dh;
                float acc = 0.0;
                for (uint d = 0u; d < Dh; ++d) {
                    acc += q[q_base + d] * k[k_base + d];
                }
                s = acc * scale;
            }
            scores[j] = s;
            local_max = max(local_max, s);
        }
        float m = workgroup_max(local_max);
        float local_sum = 0.0;
        for (uint j = t; j < last; j += LOCAL_SIZE) {
            float p = scores[j] > -3.0e38 ? exp(scores[j] - m) : 0.0;
            scores[j] = p;
            local_sum += p;
        }
        float denom = workgroup_sum(local_sum);
        float inv = denom > 0.0 ? 1.0 / denom : 0.0;  // a fully masked row gives zeros
        for (uint d = t; d < Dh; d += LOCAL_SIZE) {
            float acc = 0.0;
            for (uint j = 0u; j < last; ++j) {
                acc += scores[j] * v[(b * S + j) * Hkv * Dh + kh * Dh + d];
            }
            outv[q_base + d] = acc * inv;
        }
        barrier();  // scores are rewritten by the next row
    }
}
