#version 450
// One dispatch for what a decoder layer does between its q/k/v projections and attention
// (ET-VK fuses the same: apply_rotary_emb rotates q and k together, update_cache writes the
// caches): q_out = rope(q); k_cache[step[0] + t] = rope(k)[t]; v_cache[step[0] + t] = v[t], for
// T tokens; rows past the caches' end are dropped. Pairs and angles as rope_pair.h says.
// q, k and v are the columns of one tensor qkv [T][(H + 2 KH) Dh] (the projections' one linear
// over their stacked weights), side by side in that order.
// Invocations: the q pairs, then the k pairs, then the v pairs (copies). TEXEL reads qkv and the
// table as R32F and RG32F uniform texel buffers (lavapipe: a fetch is a gather, a storage-buffer
// load in a loop a loop over the SIMD lanes).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

#if QUAD
// QUAD (GGML's normal mode, Dh a multiple of 4; ops.rope_kv): an invocation per two neighbouring
// pairs, four values read as one RGBA32F texel and written as a vec4 (lavapipe stores lane by
// lane, a vector's components in one pass), their two (cos, sin) one RGBA32F texel of the table.
layout(set = 0, binding = 0) writeonly buffer Out { vec4 qout4[]; };
layout(set = 0, binding = 1) uniform samplerBuffer qkvt;
layout(set = 0, binding = 3) uniform samplerBuffer tablet;
layout(set = 0, binding = 4) writeonly buffer KCache { vec4 kc4[]; };
layout(set = 0, binding = 5) writeonly buffer VCache { vec4 vc4[]; };
#else
layout(set = 0, binding = 0) writeonly buffer Out { float qout[]; };
#if TEXEL
layout(set = 0, binding = 1) uniform samplerBuffer qkvt;
layout(set = 0, binding = 3) uniform samplerBuffer tablet;
#define QKV(i) texelFetch(qkvt, int(i)).x
#define TABLE(i) texelFetch(tablet, int(i)).xy
#else
layout(set = 0, binding = 1) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 3) readonly buffer Table { vec2 table[]; };
#define QKV(i) qkv[i]
#endif
layout(set = 0, binding = 4) writeonly buffer KCache { float kc[]; };
layout(set = 0, binding = 5) writeonly buffer VCache { float vc[]; };
#endif
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };

layout(push_constant) uniform Params {
    uint T;
    uint P;  // positions in the table
    uint rows;  // cache rows
};

#include "grid.h"
#if !QUAD
#include "rope_pair.h"
#endif
#ifndef HEADS  // ops.rope_kv sets all three
#define HEADS 1
#define KV_HEADS 1
#define HEAD_DIM 2
#endif
// Query heads, key/value heads and the head size are compile-time constants: the divisions by
// them become multiplies and shifts (lavapipe, 30 prefill dispatches: 11.6 ms with them as push
// constants, 7.7 ms as constants with the texel reads; neither alone saved more than 10%).
#define H uint(HEADS)
#define KH uint(KV_HEADS)
#define Dh uint(HEAD_DIM)

#if QUAD
// Quad j of a head (its pairs 2j and 2j + 1) of token t, rotated at position step[0] + t.
vec4 rotate4(vec4 x, uint t, uint j) {
    vec4 cs = texelFetch(tablet, int(min(step[0] + t, P - 1u) * (Dh / 4u) + j));
    return vec4(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x, x.z * cs.z - x.w * cs.w, x.z * cs.w + x.w * cs.z);
}

void main() {
    uint w = KH * Dh / 4u;  // a cache row, in quads
    uint qw = H * Dh / 4u;
    uint ld = qw + 2u * w;  // a row of qkv
    uint qn = T * qw, kn = T * w;
    uint o = GRID_ITEM;
    if (o < qn) {
        uint t = o / qw, e = o % qw;
        qout4[o] = rotate4(texelFetch(qkvt, int(t * ld + e)), t, e % (Dh / 4u));
    } else if (o < qn + 2u * kn) {
        bool k = o < qn + kn;
        uint c = o - qn - (k ? 0u : kn);  // quad c of the k (or v) columns
        uint t = c / w, e = c % w;
        uint row = step[0] + t;
        if (row < rows) {
            vec4 x = texelFetch(qkvt, int(t * ld + qw + (k ? 0u : w) + e));
            if (k) {
                kc4[row * w + e] = rotate4(x, t, e % (Dh / 4u));
            } else {
                vc4[row * w + e] = x;
            }
        }
    }
}
#else
void main() {
    uint half_ = Dh / 2u;
    uint qp = T * H * half_;
    uint kp = T * KH * half_;
    uint w = KH * Dh;  // a cache row
    uint qw = H * Dh;
    uint ld = qw + 2u * w;  // a row of qkv
    uint total = qp + 2u * kp;  // v: T * KH * Dh elements, two per invocation
    // an invocation per pair (ops: nodes.grid_groups), no grid-stride loop (lavapipe, SmolLM2's 30
    // in a 32-token prefill: 9.0 -> 6.4 ms)
    uint o = GRID_ITEM;
    if (o < total) {
        if (o < qp) {
            RopePair r = rope_pair(o, H, Dh, step[0], P);
            uint at = r.t * (ld - qw);  // r.a, r.b count q's columns only
            vec2 y = rotate(r, QKV(r.a + at), QKV(r.b + at));
            qout[r.a] = y.x;
            qout[r.b] = y.y;
        } else if (o < qp + kp) {
            RopePair r = rope_pair(o - qp, KH, Dh, step[0], P);
            uint row = step[0] + r.t;
            if (row < rows) {
                uint at = r.t * (ld - w) + qw;
                vec2 y = rotate(r, QKV(r.a + at), QKV(r.b + at));
                kc[row * w + r.a - r.t * w] = y.x;
                kc[row * w + r.b - r.t * w] = y.y;
            }
        } else {  // a pair of v values
            uint e = 2u * (o - qp - kp);
            uint row = step[0] + e / w;
            if (row < rows) {
                uint at = (e / w) * ld + qw + w + e % w;
                vc[row * w + e % w] = QKV(at);
                vc[row * w + e % w + 1u] = QKV(at + 1u);
            }
        }
    }
}
#endif
