#version 450
// One dispatch for what a decoder layer does between its q/k/v projections and attention
// (ET-VK fuses the same: apply_rotary_emb rotates q and k together, update_cache writes the
// caches): q_out = rope(q); k_cache[step[0] + t] = rope(k)[t]; v_cache[step[0] + t] = v[t], for
// T tokens; rows past the caches' end are dropped. Rotation as rope.glsl (pairs (2i, 2i+1), or
// (i, i + Dh/2) with NEOX), angles from the table. Invocations: the q pairs, then the k pairs,
// then the v pairs (copies).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float qout[]; };
layout(set = 0, binding = 1) readonly buffer Q { float q[]; };
layout(set = 0, binding = 2) readonly buffer K { float k[]; };
layout(set = 0, binding = 3) readonly buffer V { float v[]; };
layout(set = 0, binding = 4) readonly buffer Step { uint step[]; };
layout(set = 0, binding = 5) readonly buffer Table { vec2 table[]; };
layout(set = 0, binding = 6) writeonly buffer KCache { float kc[]; };
layout(set = 0, binding = 7) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint T;
    uint H;   // query heads
    uint KH;  // key/value heads
    uint Dh;
    uint P;  // positions in the table
    uint rows;  // cache rows
};

void main() {
    uint half_ = Dh / 2u;
    uint qp = T * H * half_;
    uint kp = T * KH * half_;
    uint total = qp + 2u * kp;  // v: T * KH * Dh elements, two per invocation
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        bool isq = o < qp;
        uint p = isq ? o : o - qp;
        if (!isq && p >= kp) {  // a pair of v values
            p -= kp;
            uint w = KH * Dh;
            uint row = step[0] + (2u * p) / w;
            if (row < rows) {
                vc[row * w + (2u * p) % w] = v[2u * p];
                vc[row * w + (2u * p) % w + 1u] = v[2u * p + 1u];
            }
            continue;
        }
        uint heads = isq ? H : KH;
        uint t = p / (heads * half_);
        uint i = p % half_;
        uint base = (p / half_) * Dh;
#if NEOX
        uint a = base + i;
        uint b = base + i + half_;
#else
        uint a = base + 2u * i;
        uint b = a + 1u;
#endif
        vec2 cs = table[min(step[0] + t, P - 1u) * half_ + i];
        float xa = isq ? q[a] : k[a];
        float xb = isq ? q[b] : k[b];
        float ra = xa * cs.x - xb * cs.y;
        float rb = xa * cs.y + xb * cs.x;
        if (isq) {
            qout[a] = ra;
            qout[b] = rb;
        } else {
            uint row = step[0] + t;
            if (row < rows) {
                uint w = KH * Dh;
                kc[row * w + a - t * w] = ra;
                kc[row * w + b - t * w] = rb;
            }
        }
    }
}
