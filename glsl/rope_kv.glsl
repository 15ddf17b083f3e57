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
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };
layout(set = 0, binding = 4) writeonly buffer KCache { float kc[]; };
layout(set = 0, binding = 5) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint T;
    uint P;  // positions in the table
    uint rows;  // cache rows
};

#include "grid.h"
#include "rope_pair.h"
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
