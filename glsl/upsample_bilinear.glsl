#version 450
// Bilinear resize of NCHW x [NC][H][W] to [NC][Ho][Wo], as torch's upsample_bilinear2d: the source
// coordinate of output pixel o is o * scale (ALIGN_CORNERS) or (o + 0.5) * scale - 0.5 clamped at 0,
// with scale_y / scale_x from the caller; the two nearest source pixels per axis are blended.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform Params {
    uint NC;
    uint H;
    uint W;
    uint Ho;
    uint Wo;
    float scale_y;
    float scale_x;
};

float source(uint o, float scale) {
#if ALIGN_CORNERS
    return float(o) * scale;
#else
    return max((float(o) + 0.5) * scale - 0.5, 0.0);
#endif
}

void main() {
    uint total = NC * Ho * Wo;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint ox = i % Wo;
        uint oy = (i / Wo) % Ho;
        uint c = i / (Wo * Ho);
        float sy = source(oy, scale_y);
        float sx = source(ox, scale_x);
        uint y0 = min(uint(sy), H - 1u);
        uint x0 = min(uint(sx), W - 1u);
        uint y1 = min(y0 + 1u, H - 1u);
        uint x1 = min(x0 + 1u, W - 1u);
        float ly = sy - float(y0);
        float lx = sx - float(x0);
        uint base = c * H * W;
        float top = mix(x[base + y0 * W + x0], x[base + y0 * W + x1], lx);
        float bottom = mix(x[base + y1 * W + x0], x[base + y1 * W + x1], lx);
        outv[i] = mix(top, bottom, ly);
    }
}
