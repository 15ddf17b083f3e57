#version 450
// Rotary position embedding of x[T][H*Dh] at positions step[0] + t (the position lives in a
// buffer so recorded command buffers serve every generation step); pairs and angles as
// rope_pair.h says.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer Step { uint step[]; };
layout(set = 0, binding = 3) readonly buffer Table { vec2 table[]; };

layout(push_constant) uniform Params {
    uint T;
    uint H;
    uint Dh;
    uint P;  // positions in the table
};

#include "rope_pair.h"

void main() {
    uint pairs = T * H * (Dh / 2u);
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < pairs; o += stride) {
        RopePair r = rope_pair(o, H, Dh, step[0], P);
        vec2 y = rotate(r, x[r.a], x[r.b]);
        outv[r.a] = y.x;
        outv[r.b] = y.y;
    }
}
