#version 450
// A texture gathered by strides (layouts in texture_layout.h), one invocation per output texel:
// output element e = (n, c, h, w) is element base + e . strides of the source read as its NCHW
// elements in order (strides wrap modulo 2^32: a negative stride flips). The source is a buffer
// (SRC_TEXTURE 0) or a texture of sizes si in any layout (SRC_TEXTURE 1). One kernel for
// reshapes, permutes, slices, selects, expands, flips and buffer-to-texture copies, and the
// standard packer (texture3d_*: an NCHW constant into a texture). Bindings as every packer's:
// source 0, destination 1 (push constants: vkgraph/graph/values.py gather_params).
#extension GL_GOOGLE_include_directive : require
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

#if SRC_TEXTURE
layout(set = 0, binding = 0, rgba32f) uniform readonly image3D src;
#else
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
#endif
layout(set = 0, binding = 1, rgba32f) uniform writeonly image3D outv;

layout(push_constant) uniform Params {
    uvec4 so;       // output sizes (N, C, H, W)
    uvec4 si;       // source sizes (a texture source)
    uvec4 strides;  // source elements per step of n, c, h, w of the output
    uint base;
    uint packed_out;
    uint packed_src;
};

void main() {
    ivec3 size = imageSize(outv);
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        vec4 v = vec4(0.0);
        uvec4 e;
        for (uint i = 0u; i < 4u; ++i) {
            if (!element_of(q, i, so, packed_out, e)) continue;
            uint f = base + e.x * strides.x + e.y * strides.y + e.z * strides.z + e.w * strides.w;
#if SRC_TEXTURE
            uvec4 es = uvec4(f / (si.y * si.z * si.w), (f / (si.z * si.w)) % si.y, (f / si.w) % si.z, f % si.w);
            ivec4 t = texel_of(es, si, packed_src);
            v[i] = imageLoad(src, t.xyz)[t.w];
#else
            v[i] = src[f];
#endif
        }
        imageStore(outv, q, v);
    }
}
