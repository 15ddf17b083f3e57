#version 450
// 2-D convolution on channels-packed textures (texture_layout.h): one invocation per output
// texel (4 output channels at one pixel); weights packed by pack_conv2d.glsl, so one vec4 holds
// the weights of those 4 output channels for one input channel and kernel tap.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D x;
layout(set = 0, binding = 2) readonly buffer W { vec4 w[]; };
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer Bias { float bias[]; };
#endif

#include "conv2d_params.h"

void main() {
    uint Co4 = (Cout + 3u) / 4u;
    uint Ci4 = (Cin + 3u) / 4u;
    uint total = N * Co4 * Ho * Wo;
    uint cin_g = Cin / groups;
    uint cout_g = Cout / groups;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint ox = o % Wo;
        uint oy = (o / Wo) % Ho;
        uint z = o / (Wo * Ho);
        uint n = z / Co4;
        uint co4 = z % Co4;
        vec4 acc = vec4(0.0);
        for (uint ky = 0u; ky < KH; ++ky) {
            int iy = int(oy * sy + ky * dy) - int(py);
            if (iy < 0 || iy >= int(H)) continue;
            for (uint kx = 0u; kx < KW; ++kx) {
                int ix = int(ox * sx + kx * dx) - int(px);
                if (ix < 0 || ix >= int(Wd)) continue;
                uint wbase = ((co4 * KH + ky) * KW + kx) * cin_g;
                for (uint cc = 0u; cc < 4u; ++cc) {
                    uint co = co4 * 4u + cc;
                    if (co >= Cout) break;
                    uint c0 = (co / cout_g) * cin_g;  // first input channel of co's group
                    float s = 0.0;
                    for (uint ci = 0u; ci < cin_g; ++ci) {
                        uint c = c0 + ci;
                        s += imageLoad(x, ivec3(ix, iy, n * Ci4 + c / 4u))[c % 4u] * w[wbase + ci][cc];
                    }
                    acc[cc] += s;
                }
            }
        }
#if HAS_BIAS
        for (uint cc = 0u; cc < 4u; ++cc) {
            uint co = co4 * 4u + cc;
            if (co < Cout) acc[cc] += bias[co];
        }
#endif
        imageStore(outv, ivec3(ox, oy, z), acc);
    }
}
