#version 450
// out = a @ b on width-packed textures (texture_layout.h): a [..., M, K], b [..., K, N], out
// [..., M, N], leading dims flattened into z (a or b with one batch is broadcast). One
// invocation per output texel (4 columns of one row); padding of b is zero, so is out's.
#extension GL_GOOGLE_include_directive : require
#include "texture_layout.h"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D outv;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D a;
layout(set = 0, binding = 2, rgba32f) uniform readonly image3D b;

layout(push_constant) uniform Params {
    uint K;
    uint a_batched;  // 0: a has one batch for all
    uint b_batched;
};

void main() {
    ivec3 size = imageSize(outv);
    uint K4 = (K + 3u) / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < texel_count(size); o += stride) {
        ivec3 q = texel_position(o, size);
        int za = a_batched != 0u ? q.z : 0;
        int zb = b_batched != 0u ? q.z : 0;
        vec4 acc = vec4(0.0);
        for (uint k4 = 0u; k4 < K4; ++k4) {
            vec4 av = imageLoad(a, ivec3(int(k4), q.y, za));
            for (uint kk = 0u; kk < 4u; ++kk) {
                uint k = k4 * 4u + kk;
                if (k < K) acc += av[kk] * imageLoad(b, ivec3(q.x, int(k), zb));
            }
        }
        imageStore(outv, q, acc);
    }
}
