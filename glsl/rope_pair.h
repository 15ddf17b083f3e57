// A RoPE pair of a [T][heads * Dh] tensor at positions step0 + t (rope.glsl, rope_kv.glsl):
// pair p's token t and element indices a and b, (2i, 2i+1) (GGML's "normal" mode, as GGUF llama
// weights expect) or, with NEOX, (i, i + Dh/2); its (cos, sin) from table[P][Dh/2] (computed
// on the CPU in float64). Include after a readonly `vec2 table[]`, or a TABLE(i) macro reading it.

struct RopePair {
    uint t;
    uint a;
    uint b;
    vec2 cs;
};

RopePair rope_pair(uint p, uint heads, uint Dh, uint step0, uint P) {
    uint half_ = Dh / 2u;
    uint i = p % half_;
    uint base = (p / half_) * Dh;
    RopePair r;
    r.t = p / (heads * half_);
#if NEOX
    r.a = base + i;
    r.b = base + i + half_;
#else
    r.a = base + 2u * i;
    r.b = r.a + 1u;
#endif
#ifdef TABLE
    r.cs = TABLE(min(step0 + r.t, P - 1u) * half_ + i);
#else
    r.cs = table[min(step0 + r.t, P - 1u) * half_ + i];
#endif
    return r;
}

// (xa, xb) rotated by the pair's angle.
vec2 rotate(RopePair r, float xa, float xb) {
    return vec2(xa * r.cs.x - xb * r.cs.y, xa * r.cs.y + xb * r.cs.x);
}
