#version 450
// One dispatch for what a decoder layer does between its q/k/v projections and attention
// (ET-VK fuses the same: apply_rotary_emb rotates q and k together, update_cache writes the
// caches): q_out = rope(q); k_cache[step[0] + t] = rope(k)[t]; v_cache[step[0] + t] = v[t], for
// T tokens; rows past the caches' end are dropped. Pairs and angles as rope_pair.h says.
// q, k and v are the columns of one tensor qkv [T][(H + 2 KH) Dh] (the projections' one linear
// over their stacked weights), side by side in that order.
// Invocations: the q pairs, then the k pairs, then the v pairs (copies).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float qout[]; };
layout(set = 0, binding = 1) readonly buffer QKV { float qkv[]; };
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };
layout(set = 0, binding = 3) readonly buffer Table { vec2 table[]; };
layout(set = 0, binding = 4) writeonly buffer KCache { float kc[]; };
layout(set = 0, binding = 5) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint T;
    uint H;   // query heads
    uint KH;  // key/value heads
    uint Dh;
    uint P;  // positions in the table
    uint rows;  // cache rows
};

#include "rope_pair.h"

void main() {
    uint half_ = Dh / 2u;
    uint qp = T * H * half_;
    uint kp = T * KH * half_;
    uint w = KH * Dh;  // a cache row
    uint qw = H * Dh;
    uint ld = qw + 2u * w;  // a row of qkv
    uint total = qp + 2u * kp;  // v: T * KH * Dh elements, two per invocation
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        if (o < qp) {
            RopePair r = rope_pair(o, H, Dh, step[0], P);
            uint at = r.t * (ld - qw);  // r.a, r.b count q's columns only
            vec2 y = rotate(r, qkv[r.a + at], qkv[r.b + at]);
            qout[r.a] = y.x;
            qout[r.b] = y.y;
        } else if (o < qp + kp) {
            RopePair r = rope_pair(o - qp, KH, Dh, step[0], P);
            uint row = step[0] + r.t;
            if (row < rows) {
                uint at = r.t * (ld - w) + qw;
                vec2 y = rotate(r, qkv[r.a + at], qkv[r.b + at]);
                kc[row * w + r.a - r.t * w] = y.x;
                kc[row * w + r.b - r.t * w] = y.y;
            }
        } else {  // a pair of v values
            uint e = 2u * (o - qp - kp);
            uint row = step[0] + e / w;
            if (row < rows) {
                uint at = (e / w) * ld + qw + w + e % w;
                vc[row * w + e % w] = qkv[at];
                vc[row * w + e % w + 1u] = qkv[at + 1u];
            }
        }
    }
}
