#version 450
// Rotary position embedding of x[T][H*Dh] at positions step[0] + t (the position lives in a
// buffer so recorded command buffers serve every generation step). Pairs are (2i, 2i+1)
// (GGML's "normal" mode, as GGUF llama weights expect) or, with NEOX, (i, i + Dh/2). The angles'
// cos and sin come from a table computed on the CPU in float64: table[P][Dh/2] of (cos, sin).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };
layout(set = 0, binding = 3) readonly buffer Table { vec2 table[]; };

layout(push_constant) uniform Params {
    uint T;
    uint H;
    uint Dh;
    uint P;  // positions in the table
};

void main() {
    uint half_ = Dh / 2u;
    uint pairs = T * H * half_;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < pairs; o += stride) {
        uint t = o / (H * half_);
        uint i = o % half_;
        uint base = (o / half_) * Dh;
        vec2 cs = table[min(step[0] + t, P - 1u) * half_ + i];
#if NEOX
        uint a = base + i;
        uint b = base + i + half_;
#else
        uint a = base + 2u * i;
        uint b = a + 1u;
#endif
        float xa = x[a];
        float xb = x[b];
        outv[a] = xa * cs.x - xb * cs.y;
        outv[b] = xa * cs.y + xb * cs.x;
    }
}
