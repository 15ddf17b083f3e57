// ET-VK's texture layouts for an NCHW tensor in an RGBA32F 3-D image:
//   width-packed (CHANNELS_PACKED 0):    texel (x, y, n*C + c)       holds w = 4x .. 4x+3 of row y
//   channels-packed (CHANNELS_PACKED 1): texel (x, y, n*ceil(C/4) + c4) holds c = 4*c4 .. 4*c4+3
// Components past W (or C) are zero.

// The NCHW index behind component i of texel p, or -1 for padding.
int nchw_index(ivec3 p, int i, uint N, uint C, uint H, uint W) {
#if CHANNELS_PACKED
    uint C4 = (C + 3u) / 4u;
    uint n = uint(p.z) / C4;
    uint c = (uint(p.z) % C4) * 4u + uint(i);
    uint w = uint(p.x);
    if (c >= C) return -1;
#else
    uint n = uint(p.z) / C;
    uint c = uint(p.z) % C;
    uint w = uint(p.x) * 4u + uint(i);
    if (w >= W) return -1;
#endif
    return int(((n * C + c) * H + uint(p.y)) * W + w);
}

// The texel and component holding NCHW element (n, c, h, w).
ivec4 texel_of(uint n, uint c, uint h, uint w, uint C) {
#if CHANNELS_PACKED
    return ivec4(w, h, n * ((C + 3u) / 4u) + c / 4u, c % 4u);
#else
    return ivec4(w / 4u, h, n * C + c, w % 4u);
#endif
}
