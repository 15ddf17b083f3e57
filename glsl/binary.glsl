#version 450
// out = a OP b with numpy broadcasting over up to 4 dims: out has dims d[4] (padded with 1 on
// the left); sa/sb are a's and b's element strides per output dim (0 where it is broadcast).
// OP: 0 add, 1 sub, 2 mul, 3 div, 4 pow, 5 max, 6 min, 7 >, 8 <, 9 >=, 10 <=, 11 ==, 12 !=,
// 13 logical and, 14 logical or (comparisons and logic give 1.0 or 0.0), 15 a / b rounded down,
// 16 a / b rounded toward zero, 17 silu(a) * b. ALPHA scales b (add, sub). FLAT: no broadcasting
// (index i everywhere); VEC4 (FLAT, n a multiple of 4, OP 0-3, 5, 6 or 17): a vec4 per index.

layout(local_size_x_id = 0) in;

#ifndef VEC4
#define VEC4 0
#endif
#if VEC4
#define T vec4
#else
#define T float
#endif
layout(set = 0, binding = 0) writeonly buffer Out { T outv[]; };
layout(set = 0, binding = 1) readonly buffer A { T a[]; };
layout(set = 0, binding = 2) readonly buffer B { T b[]; };

layout(push_constant) uniform Params {
    uvec4 d;   // vectors first: a uvec4 is 16-byte aligned in the push-constant block
    uvec4 sa;
    uvec4 sb;
    uint n;
    float alpha;
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < (VEC4 != 0 ? n / 4u : n); i += stride) {
#if FLAT  // a, b and out of one shape
        T av = a[i];
        T bv = b[i];
#else
        uvec4 c = uvec4(i / (d.y * d.z * d.w), (i / (d.z * d.w)) % d.y, (i / d.w) % d.z, i % d.w);
        float av = a[c.x * sa.x + c.y * sa.y + c.z * sa.z + c.w * sa.w];
        float bv = b[c.x * sb.x + c.y * sb.y + c.z * sb.z + c.w * sb.w];
#endif
#if OP == 0
        outv[i] = av + alpha * bv;
#elif OP == 1
        outv[i] = av - alpha * bv;
#elif OP == 2
        outv[i] = av * bv;
#elif OP == 3
        outv[i] = av / bv;
#elif OP == 4
        float r = pow(abs(av), bv);
        outv[i] = (av < 0.0 && mod(bv, 2.0) == 1.0) ? -r : (av == 0.0 && bv == 0.0 ? 1.0 : r);
#elif OP == 5
        outv[i] = max(av, bv);
#elif OP == 6
        outv[i] = min(av, bv);
#elif OP == 7
        outv[i] = float(av > bv);
#elif OP == 8
        outv[i] = float(av < bv);
#elif OP == 9
        outv[i] = float(av >= bv);
#elif OP == 10
        outv[i] = float(av <= bv);
#elif OP == 11
        outv[i] = float(av == bv);
#elif OP == 12
        outv[i] = float(av != bv);
#elif OP == 13
        outv[i] = float(av != 0.0 && bv != 0.0);
#elif OP == 14
        outv[i] = float(av != 0.0 || bv != 0.0);
#elif OP == 15
        outv[i] = floor(av / bv);
#elif OP == 16
        outv[i] = trunc(av / bv);
#else
        outv[i] = av / (1.0 + exp(-av)) * bv;
#endif
    }
}
