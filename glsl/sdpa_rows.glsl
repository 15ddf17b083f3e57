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

void main() {
    uint group = H / Hkv;
#if DYNAMIC_POS
    uint pos0 = step[0];
#else
    uint pos0 = q_pos0;
#endif
    for (uint row = gl_GlobalInvocationID.x; row < B * T * H; row += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        uint b = row / (T * H);
        uint i = (row / H) % T;
        uint h = row % H;
        uint q_base = ((b * T + i) * H + h) * D4;
        uint kv_stride = Hkv * D4;
        uint kv_base = b * S * kv_stride + (h / group) * D4;
        vec4 q[D4];
        [[unroll]] for (uint d = 0u; d < D4; ++d) q[d] = Q4(q_base + d) * scale;
        vec4 acc[D4];
        [[unroll]] for (uint d = 0u; d < D4; ++d) acc[d] = vec4(0.0);
        float m = -3.4e38;
        float l = 0.0;
        uint last = causal != 0u ? min(S, pos0 + i + 1u) : S;
        for (uint j = 0u; j < last; ++j) {
            if (key_mask[b * S + j] == 0.0) continue;
            uint kb = kv_base + j * kv_stride;
            vec4 s4 = vec4(0.0);
            [[unroll]] for (uint d = 0u; d < D4; ++d) s4 += q[d] * K4(kb + d);
            float s = s4.x + s4.y + s4.z + s4.w;
            float m_new = max(m, s);
            float c = exp(m - m_new);  // rescales what was summed so far
            float p = exp(s - m_new);
            l = l * c + p;
            [[unroll]] for (uint d = 0u; d < D4; ++d) acc[d] = acc[d] * c + p * V4(kb + d);
            m = m_new;
        }
        float inv = l > 0.0 ? 1.0 / l : 0.0;  // a fully masked row gives zeros
        [[unroll]] for (uint d = 0u; d < D4; ++d) outv[q_base + d] = acc[d] * inv;
    }
}
