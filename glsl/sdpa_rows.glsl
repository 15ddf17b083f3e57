#version 450
// Scaled dot-product attention for CPU renderers, one invocation per (batch b, query i, head h)
// with a one-pass (online) softmax: no shared memory, no barriers, and the keys' loop bound is the
// same across a SIMD group's lanes (neighbouring invocations are heads of one query). Same
// contract as sdpa.glsl: q [B*T, H*Dh], k and v [B*S, Hkv*Dh], key_mask [B*S] (0 masks a key
// out), causal with the first query at q_pos0 (or step[0] with DYNAMIC_POS); keys past the last
// visible one are never read. Dh = DH, a multiple of 4; q, k, v read as vec4. TEXEL reads them
// as RGBA32F uniform texel buffers (lavapipe runs a storage-buffer load in a loop lane by lane).
// The loops over a row's vec4s are unrolled: SwiftShader keeps an array indexed inside a loop in
// memory (SmolLM2 there, 400-token prompt: prefill 30.6 -> 35.1 tok/s, decode 9.2 -> 10.6).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
#ifndef DH
#define DH 64
#endif

#if TEXEL
layout(set = 0, binding = 1) uniform samplerBuffer q4;
layout(set = 0, binding = 2) uniform samplerBuffer k4;
layout(set = 0, binding = 3) uniform samplerBuffer v4;
#define Q4(i) texelFetch(q4, int(i))
#define K4(i) texelFetch(k4, int(i))
#define V4(i) texelFetch(v4, int(i))
#else
layout(set = 0, binding = 1) readonly buffer Q { vec4 qv[]; };
layout(set = 0, binding = 2) readonly buffer K { vec4 kv[]; };
layout(set = 0, binding = 3) readonly buffer V { vec4 vv[]; };
#define Q4(i) qv[i]
#define K4(i) kv[i]
#define V4(i) vv[i]
#endif
layout(set = 0, binding = 0) writeonly buffer Out { vec4 outv[]; };
layout(set = 0, binding = 4) readonly buffer Mask { float key_mask[]; };
#if DYNAMIC_POS
layout(set = 0, binding = 5) readonly buffer Step { uint step[]; };
#endif

#include "sdpa_params.h"

#define D4 (DH / 4)
// GROUP: query heads per invocation, sharing one key/value head (H / Hkv of them, or 1): each key
// and value row is fetched once for the group (a batched prompt; one token's few heads stay one
// per invocation, where a fetch costs the same for the whole SIMD group either way).
#ifndef GROUP
#define GROUP 1
#endif

void main() {
    uint group = H / Hkv;
    uint per_query = H / GROUP;  // invocations per query
#if DYNAMIC_POS
    uint pos0 = step[0];
#else
    uint pos0 = q_pos0;
#endif
    for (uint row = gl_GlobalInvocationID.x; row < B * T * per_query; row += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        uint b = row / (T * per_query);
        uint i = (row / per_query) % T;
        uint h0 = (row % per_query) * GROUP;
        uint q_base = ((b * T + i) * H + h0) * D4;  // head h0 + g at q_base + g * D4
        uint kv_stride = Hkv * D4;
        uint kv_base = b * S * kv_stride + (h0 / group) * D4;
        vec4 q[GROUP * D4];
        [[unroll]] for (uint d = 0u; d < GROUP * D4; ++d) q[d] = Q4(q_base + d) * scale;
        vec4 acc[GROUP * D4];
        [[unroll]] for (uint d = 0u; d < GROUP * D4; ++d) acc[d] = vec4(0.0);
        float m[GROUP], l[GROUP];
        [[unroll]] for (uint g = 0u; g < GROUP; ++g) { m[g] = -3.4e38; l[g] = 0.0; }
        uint last = causal != 0u ? min(S, pos0 + i + 1u) : S;
        for (uint j = 0u; j < last; ++j) {
            if (key_mask[b * S + j] == 0.0) continue;
            uint kb = kv_base + j * kv_stride;
            vec4 s4[GROUP];
            [[unroll]] for (uint g = 0u; g < GROUP; ++g) s4[g] = vec4(0.0);
            [[unroll]] for (uint d = 0u; d < D4; ++d) {
                vec4 kd = K4(kb + d);
                [[unroll]] for (uint g = 0u; g < GROUP; ++g) s4[g] += q[g * D4 + d] * kd;
            }
            float c[GROUP], p[GROUP];
            [[unroll]] for (uint g = 0u; g < GROUP; ++g) {
                float s = s4[g].x + s4[g].y + s4[g].z + s4[g].w;
                float m_new = max(m[g], s);
                c[g] = exp(m[g] - m_new);  // rescales what was summed so far
                p[g] = exp(s - m_new);
                l[g] = l[g] * c[g] + p[g];
                m[g] = m_new;
            }
            [[unroll]] for (uint d = 0u; d < D4; ++d) {
                vec4 vd = V4(kb + d);
                [[unroll]] for (uint g = 0u; g < GROUP; ++g) acc[g * D4 + d] = acc[g * D4 + d] * c[g] + p[g] * vd;
            }
        }
        [[unroll]] for (uint g = 0u; g < GROUP; ++g) {
            float inv = l[g] > 0.0 ? 1.0 / l[g] : 0.0;  // a fully masked row gives zeros
            [[unroll]] for (uint d = 0u; d < D4; ++d) outv[q_base + g * D4 + d] = acc[g * D4 + d] * inv;
        }
    }
}
