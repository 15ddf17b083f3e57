#version 450
// Transposed 2-D convolution (torch.nn.functional.conv_transpose2d) of NCHW `x` with
// weight[Cin][Cout/groups][KH][KW]: out[n][co][oy][ox] = bias[co] + sum over the input channels
// of co's group and the taps (ky, kx) with iy = (oy + py - ky*dy) / sy whole and inside (same
// for x) of x[n][ci][iy][ix] * w[ci][co % (Cout/groups)][ky][kx]. One invocation per output.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };
#if HAS_BIAS
layout(set = 0, binding = 3) readonly buffer Bias { float bias[]; };
#endif

layout(push_constant) uniform Params {
    uint N, Cin, H, Wd, Cout, Ho, Wo, groups;
    uint KH, KW, sy, sx, py, px, dy, dx;
};

void main() {
    uint total = N * Cout * Ho * Wo;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint cin_g = Cin / groups;
    uint cout_g = Cout / groups;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint ox = o % Wo;
        uint oy = (o / Wo) % Ho;
        uint co = (o / (Wo * Ho)) % Cout;
        uint n = o / (Wo * Ho * Cout);
        uint grp = co / cout_g;
        float acc = 0.0;
        for (uint ky = 0u; ky < KH; ++ky) {
            int ty = int(oy + py) - int(ky * dy);
            if (ty < 0 || ty % int(sy) != 0 || ty / int(sy) >= int(H)) continue;
            uint iy = uint(ty) / sy;
            for (uint kx = 0u; kx < KW; ++kx) {
                int tx = int(ox + px) - int(kx * dx);
                if (tx < 0 || tx % int(sx) != 0 || tx / int(sx) >= int(Wd)) continue;
                uint ix = uint(tx) / sx;
                for (uint c = 0u; c < cin_g; ++c) {
                    uint ci = grp * cin_g + c;
                    acc += x[((n * Cin + ci) * H + iy) * Wd + ix] * w[((ci * cout_g + co % cout_g) * KH + ky) * KW + kx];
                }
            }
        }
#if HAS_BIAS
        acc += bias[co];
#endif
        outv[o] = acc;
    }
}
