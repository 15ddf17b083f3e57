#version 450
// 2-D convolution, NCHW in and out, weights packed by pack_conv2d.glsl (channels-packed):
// out[n][co][oy][ox] = bias[co] + sum_{ci in co's group, ky, kx} x[n][ci][iy][ix] * W[co][ci][ky][kx]
// with iy = oy*stride_y - pad_y + ky*dil_y (same for x). One invocation per output element.

#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { vec4 w[]; };
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer Bias { float bias[]; };
#endif

#include "conv2d_params.h"

void main() {
    uint total = N * Cout * Ho * Wo;
    uint cin_g = Cin / groups;
    uint cout_g = Cout / groups;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint ox = o % Wo;
        uint oy = (o / Wo) % Ho;
        uint co = (o / (Wo * Ho)) % Cout;
        uint n = o / (Wo * Ho * Cout);
        uint c0 = (co / cout_g) * cin_g;
        float acc = 0.0;
        for (uint ky = 0u; ky < KH; ++ky) {
            int iy = int(oy * sy + ky * dy) - int(py);
            if (iy < 0 || iy >= int(H)) continue;
            for (uint kx = 0u; kx < KW; ++kx) {
                int ix = int(ox * sx + kx * dx) - int(px);
                if (ix < 0 || ix >= int(Wd)) continue;
                uint wbase = (((co / 4u) * KH + ky) * KW + kx) * cin_g;
                for (uint ci = 0u; ci < cin_g; ++ci) {
                    acc += x[((n * Cin + c0 + ci) * H + uint(iy)) * Wd + uint(ix)] * w[wbase + ci][co % 4u];
                }
            }
        }
#if HAS_BIAS
        acc += bias[co];
#endif
        outv[o] = acc;
    }
}
