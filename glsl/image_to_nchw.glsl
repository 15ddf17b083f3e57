#version 450
// A texture (layouts in texture_layout.h) back into an NCHW buffer. One invocation per element.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform readonly image3D src;
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };

layout(push_constant) uniform Params {
    uvec4 s;  // N, C, H, W
    uint packed;
};

#include "texture_layout.h"

void main() {
    uint total = s.x * s.y * s.z * s.w;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uvec4 e = uvec4(o / (s.w * s.z * s.y), (o / (s.w * s.z)) % s.y, (o / s.w) % s.z, o % s.w);
        ivec4 t = texel_of(e, s, packed);
        dst[o] = imageLoad(src, t.xyz)[t.w];
    }
}
