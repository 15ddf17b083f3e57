#version 450
// Packer "conv2d_c4": conv weights W[Cout][Cin_g][KH][KW] -> channels-packed
// P[Cout4][KH][KW][Cin_g][4]: for every kernel tap and input channel, the weights of 4
// consecutive output channels side by side (zero past Cout). Raw 32-bit words.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint Cout;
    uint Cin_g;
    uint KH;
    uint KW;
};

void main() {
    uint total = ((Cout + 3u) / 4u) * KH * KW * Cin_g * 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint cc = o % 4u;
        uint ci = (o / 4u) % Cin_g;
        uint kx = (o / (4u * Cin_g)) % KW;
        uint ky = (o / (4u * Cin_g * KW)) % KH;
        uint co = (o / (4u * Cin_g * KW * KH)) * 4u + cc;
        dst[o] = co < Cout ? src[((co * Cin_g + ci) * KH + ky) * KW + kx] : 0u;
    }
}
