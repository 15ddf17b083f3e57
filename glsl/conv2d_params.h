// The push constants of conv2d.glsl and conv2d_texture.glsl (ops.conv2d packs them):
// input N x Cin x H x Wd, output Cout x Ho x Wo, groups, kernel KH x KW, stride (sy, sx),
// padding (py, px), dilation (dy, dx).
layout(push_constant) uniform Params {
    uint N; uint Cin; uint H; uint Wd;
    uint Cout; uint Ho; uint Wo; uint groups;
    uint KH; uint KW; uint sy; uint sx;
    uint py; uint px; uint dy; uint dx;
};
