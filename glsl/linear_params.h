// The push constants of the linear kernels (linear_4x4.glsl, linear_tiled.glsl,
// linear_quant.glsl): y[m][n0 + n] for the N weight rows bound (a window starting at row n0 of
// the whole weight), M tokens, K inputs, ldy y's row length. ops.linear packs them.
layout(push_constant) uniform Params {
    uint M;
    uint N;
    uint K;
    uint n0;
    uint ldy;
#if defined(NORM) && NORM
    float eps;  // linear_quant.glsl's RMSNorm
#endif
};
