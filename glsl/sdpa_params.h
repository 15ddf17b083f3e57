// The push constants of the attention kernels (sdpa.glsl, sdpa_rows.glsl); ops.sdpa packs them.
layout(push_constant) uniform Params {
    uint B;
    uint T;
    uint S;
    uint H;
    uint Hkv;
    uint Dh;
    uint causal;
    uint q_pos0;
    float scale;
};
