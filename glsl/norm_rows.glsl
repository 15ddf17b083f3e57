#version 450
// Normalization over the last dimension D (a multiple of 4) of M rows, one row per invocation:
// the CPU renderers' form of layer_norm.glsl and rms_norm.glsl (whose workgroup reductions cost
// a barrier per step there). LAYER 1: y = (x - mean) / sqrt(var + eps) * w + b (mean and
// variance in two passes); LAYER 0: y = x / sqrt(mean(x^2) + eps) * w. x, w and b are read as
// RGBA32F uniform texel buffers (lavapipe runs a storage-buffer load inside a loop lane by lane).
#ifndef LAYER
#define LAYER 0
#endif

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Y { vec4 y4[]; };
layout(set = 0, binding = 1) uniform samplerBuffer xt;
layout(set = 0, binding = 2) uniform samplerBuffer wt;
#if LAYER
layout(set = 0, binding = 3) uniform samplerBuffer bt;
#endif

layout(push_constant) uniform Params {
    uint M;
    uint D;
    float eps;
};

void main() {
    uint d4s = D / 4u;
    for (uint m = gl_GlobalInvocationID.x; m < M; m += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        uint base = m * d4s;
        float mean = 0.0;
#if LAYER
        vec4 s = vec4(0.0);
        for (uint i = 0u; i < d4s; ++i) s += texelFetch(xt, int(base + i));
        mean = (s.x + s.y + s.z + s.w) / float(D);
#endif
        vec4 q = vec4(0.0);
        for (uint i = 0u; i < d4s; ++i) {
            vec4 c = texelFetch(xt, int(base + i)) - mean;
            q += c * c;
        }
        float inv = inversesqrt((q.x + q.y + q.z + q.w) / float(D) + eps);
        for (uint i = 0u; i < d4s; ++i) {
            vec4 v = (texelFetch(xt, int(base + i)) - mean) * inv * texelFetch(wt, int(i));
#if LAYER
            v += texelFetch(bt, int(i));
#endif
            y4[base + i] = v;
        }
    }
}
