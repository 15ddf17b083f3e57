#version 450
// out[o][i] = reduce over r of in[o][r][i] for `in` seen as [outer, R, inner] (its elements in
// NCHW order). OP: 0 sum, 1 mean, 2 max, 3 min, 4 any (1.0 if any element is non-zero),
// 5 argmax, 6 argmin (the first index of the extreme, as a float; a NaN counts as the extreme,
// as torch). IN_TEXTURE / OUT_TEXTURE: `in` / `out` are textures of sizes si / so in any layout
// (texture_layout.h; out: one invocation per texel), else buffers (out: one per element).
#extension GL_GOOGLE_include_directive : require
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

#if OUT_TEXTURE
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
#else
layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
#endif
#if IN_TEXTURE
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D inv;
#else
layout(set = 0, binding = 1) readonly buffer In { float inv[]; };
#endif

layout(push_constant) uniform Params {
    uvec4 so;  // textures: sizes (N, C, H, W) and packed dims
    uvec4 si;
    uint outer;
    uint R;
    uint inner;
    uint packed_out;
    uint packed_in;
};

float in_at(uint f) {
#if IN_TEXTURE
    uvec4 e = uvec4(f / (si.y * si.z * si.w), (f / (si.z * si.w)) % si.y, (f / si.w) % si.z, f % si.w);
    ivec4 t = texel_of(e, si, packed_in);
    return imageLoad(inv, t.xyz)[t.w];
#else
    return inv[f];
#endif
}

// The reduction for output element i (of outer * inner).
float reduced(uint i) {
    uint base = (i / inner) * R * inner + i % inner;
#if OP == 5 || OP == 6
    float best = in_at(base);
    uint at = 0u;
    for (uint r = 1u; r < R && !isnan(best); ++r) {
        float v = in_at(base + r * inner);
#if OP == 5
        if (v > best || isnan(v)) {
#else
        if (v < best || isnan(v)) {
#endif
            best = v;
            at = r;
        }
    }
    return float(at);
#else
#if OP == 2
    float acc = -1.0 / 0.0;
#elif OP == 3
    float acc = 1.0 / 0.0;
#else
    float acc = 0.0;
#endif
    for (uint r = 0u; r < R; ++r) {
        float v = in_at(base + r * inner);
#if OP == 2
        acc = max(acc, v);
#elif OP == 3
        acc = min(acc, v);
#elif OP == 4
        acc = max(acc, float(v != 0.0));
#else
        acc += v;
#endif
    }
#if OP == 1
    acc /= float(R);
#endif
    return acc;
#endif
}

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
#if OUT_TEXTURE
    ivec3 size = imageSize(outv);
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        vec4 v = vec4(0.0);
        uvec4 e;
        for (uint i = 0u; i < 4u; ++i) {
            if (element_of(q, i, so, packed_out, e)) v[i] = reduced(nchw_offset(e, so));
        }
        imageStore(outv, q, v);
    }
#else
    for (uint i = gl_GlobalInvocationID.x; i < outer * inner; i += stride) {
        outv[i] = reduced(i);
    }
#endif
}
