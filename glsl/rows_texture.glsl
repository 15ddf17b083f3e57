#version 450
// Row ops over the last dim of width-packed textures (texture_layout.h), one invocation per row
// (a texel row: texels (0.., h, z)): OP 0 softmax, 1 log-softmax, 2 layer norm (weight, bias),
// 3 RMS norm (weight). Components past W are left out of every reduction and written as zeros.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D x;
#if OP >= 2
layout(set = 0, binding = 2) readonly buffer Weight { float weight[]; };
#endif
#if OP == 2
layout(set = 0, binding = 3) readonly buffer Bias { float bias[]; };
#endif

layout(push_constant) uniform Params {
    uint W;
    float eps;
};

void main() {
    ivec3 size = imageSize(outv);
    uint rows = uint(size.y * size.z);
    int W4 = size.x;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint r = gl_GlobalInvocationID.x; r < rows; r += stride) {
        int y = int(r % uint(size.y));
        int z = int(r / uint(size.y));
        // lanes of texel t that hold elements: all but in the last texel
#define VALID(t, i) (uint(t) * 4u + uint(i) < W)
#if OP < 2
        float mx = -3.4e38;
        for (int t = 0; t < W4; ++t) {
            vec4 v = imageLoad(x, ivec3(t, y, z));
            for (int i = 0; i < 4; ++i) if (VALID(t, i)) mx = max(mx, v[i]);
        }
        float s = 0.0;
        for (int t = 0; t < W4; ++t) {
            vec4 v = imageLoad(x, ivec3(t, y, z));
            for (int i = 0; i < 4; ++i) if (VALID(t, i)) s += exp(v[i] - mx);
        }
        for (int t = 0; t < W4; ++t) {
            vec4 v = imageLoad(x, ivec3(t, y, z)) - mx;
#if OP == 0
            vec4 o = exp(v) / s;
#else
            vec4 o = v - log(s);
#endif
            for (int i = 0; i < 4; ++i) if (!VALID(t, i)) o[i] = 0.0;
            imageStore(outv, ivec3(t, y, z), o);
        }
#else
        float mean = 0.0;
#if OP == 2
        for (int t = 0; t < W4; ++t) {
            vec4 v = imageLoad(x, ivec3(t, y, z));
            for (int i = 0; i < 4; ++i) if (VALID(t, i)) mean += v[i];
        }
        mean /= float(W);
#endif
        float ss = 0.0;
        for (int t = 0; t < W4; ++t) {
            vec4 v = imageLoad(x, ivec3(t, y, z)) - mean;
            for (int i = 0; i < 4; ++i) if (VALID(t, i)) ss += v[i] * v[i];
        }
        float inv = inversesqrt(ss / float(W) + eps);
        for (int t = 0; t < W4; ++t) {
            vec4 v = (imageLoad(x, ivec3(t, y, z)) - mean) * inv;
            vec4 o = vec4(0.0);
            for (int i = 0; i < 4; ++i) {
                uint k = uint(t) * 4u + uint(i);
                if (k < W) {
#if OP == 2
                    o[i] = v[i] * weight[k] + bias[k];
#else
                    o[i] = v[i] * weight[k];
#endif
                }
            }
            imageStore(outv, ivec3(t, y, z), o);
        }
#endif
    }
}
