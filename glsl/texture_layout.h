// ET-VK's texture layouts for an NCHW tensor of sizes s = (N, C, H, W) in an RGBA32F 3-D image.
// `packed` names the dim whose 4 consecutive elements share a texel (vkgraph/graph/values.py
// PACKED_DIM): 0 width, 1 height, 2 channels.
//   width-packed:    texel (w / 4, h, n * C + c)               component w % 4
//   height-packed:   texel (w, h / 4, n * C + c)               component h % 4
//   channels-packed: texel (w, h, n * ceil(C / 4) + c / 4)     component c % 4
// Components past the packed dim's size are padding (vkgraph writes zeros there).

// The texel (xyz) and component (w) holding element e = (n, c, h, w).
ivec4 texel_of(uvec4 e, uvec4 s, uint packed) {
    if (packed == 2u) return ivec4(e.w, e.z, e.x * ((s.y + 3u) / 4u) + e.y / 4u, e.y % 4u);
    if (packed == 1u) return ivec4(e.w, e.z / 4u, e.x * s.y + e.y, e.z % 4u);
    return ivec4(e.w / 4u, e.z, e.x * s.y + e.y, e.w % 4u);
}

// The element (n, c, h, w) behind component i of texel p; false for padding.
bool element_of(ivec3 p, uint i, uvec4 s, uint packed, out uvec4 e) {
    uvec3 q = uvec3(p);
    if (packed == 2u) {
        uint c4 = (s.y + 3u) / 4u;
        e = uvec4(q.z / c4, (q.z % c4) * 4u + i, q.y, q.x);
        return e.y < s.y;
    }
    if (packed == 1u) {
        e = uvec4(q.z / s.y, q.z % s.y, q.y * 4u + i, q.x);
        return e.z < s.z;
    }
    e = uvec4(q.z / s.y, q.z % s.y, q.y, q.x * 4u + i);
    return e.w < s.w;
}

// The NCHW (row-major) index of element e.
uint nchw_offset(uvec4 e, uvec4 s) {
    return ((e.x * s.y + e.y) * s.z + e.z) * s.w + e.w;
}

// Texel o of an image of `size` texels, x fastest (kernels loop o over texel_count(size)).
uint texel_count(ivec3 size) {
    return uint(size.x * size.y * size.z);
}

ivec3 texel_position(uint o, ivec3 size) {
    return ivec3(o % uint(size.x), (o / uint(size.x)) % uint(size.y), o / uint(size.x * size.y));
}
