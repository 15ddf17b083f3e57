#version 450
// The standard packer: an NCHW buffer into a texture (layout in texture_layout.h). One
// invocation per texel. Also converts runtime buffers into textures.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1, rgba32f) uniform writeonly image3D dst;

layout(push_constant) uniform Params {
    uint N;
    uint C;
    uint H;
    uint W;
};

#include "texture_layout.h"

void main() {
    ivec3 size = imageSize(dst);
    uint texels = uint(size.x * size.y * size.z);
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < texels; o += stride) {
        ivec3 p = ivec3(o % uint(size.x), (o / uint(size.x)) % uint(size.y), o / uint(size.x * size.y));
        vec4 v = vec4(0.0);
        for (int i = 0; i < 4; ++i) {
            int idx = nchw_index(p, i, N, C, H, W);
            if (idx >= 0) v[i] = src[idx];
        }
        imageStore(dst, p, v);
    }
}
