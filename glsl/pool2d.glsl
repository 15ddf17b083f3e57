#version 450
// 2-D pooling of NCHW x [N*C, H, W] into y [N*C, HO, WO]. MAX 1: max pooling (padding never
// wins); MAX 0: average, dividing by the window inside the padded input (COUNT_PAD 1), the
// window inside the input (COUNT_PAD 0) or `divisor` when it is non-zero. TEXTURE 1: x and y
// channels-packed textures (texture_layout.h), NC counting texel planes (N * ceil(C / 4)): the
// same windows, four channels at a time.

layout(local_size_x_id = 0) in;

#ifndef MAX
#define MAX 0
#endif
#ifndef COUNT_PAD
#define COUNT_PAD 1
#endif

#if TEXTURE
#define T vec4
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D y;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D x;
#define LOAD(nc, iy, ix) imageLoad(x, ivec3(ix, iy, int(nc)))
#else
#define T float
layout(set = 0, binding = 0) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
#define LOAD(nc, iy, ix) x[(nc * H + uint(iy)) * W + uint(ix)]
#endif

layout(push_constant) uniform Params {
    uint NC, H, W, HO, WO, KH, KW, SY, SX, PY, PX, DY, DX, divisor;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < NC * HO * WO; i += stride) {
        uint nc = i / (HO * WO);
        int oy = int((i / WO) % HO);
        int ox = int(i % WO);
        T acc = T(MAX == 1 ? -1.0 / 0.0 : 0.0);
        uint inside = 0u;
        uint padded = 0u;
        for (uint ky = 0u; ky < KH; ++ky) {
            int iy = oy * int(SY) - int(PY) + int(ky * DY);
            for (uint kx = 0u; kx < KW; ++kx) {
                int ix = ox * int(SX) - int(PX) + int(kx * DX);
                // average pooling counts padding up to the padded edge only (as torch)
                if (iy < int(H + PY) && ix < int(W + PX)) padded++;
                if (iy < 0 || ix < 0 || iy >= int(H) || ix >= int(W)) continue;
                T v = LOAD(nc, iy, ix);
                acc = MAX == 1 ? max(acc, v) : acc + v;
                inside++;
            }
        }
#if MAX == 0
        acc /= float(divisor != 0u ? divisor : (COUNT_PAD == 1 ? padded : inside));
#endif
#if TEXTURE
        imageStore(y, ivec3(ox, oy, int(nc)), acc);
#else
        y[i] = acc;
#endif
    }
}
