#version 450
// A texture (layout in texture_layout.h) back into an NCHW buffer. One invocation per element.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform readonly image3D src;
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };

layout(push_constant) uniform Params {
    uint N;
    uint C;
    uint H;
    uint W;
};

#include "texture_layout.h"

void main() {
    uint total = N * C * H * W;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint w = o % W;
        uint h = (o / W) % H;
        uint c = (o / (W * H)) % C;
        uint n = o / (W * H * C);
        ivec4 t = texel_of(n, c, h, w, C);
        dst[o] = imageLoad(src, t.xyz)[t.w];
    }
}
