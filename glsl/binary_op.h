// binary_op(a, b, alpha): the elementwise function OP of binary.glsl, for binary.glsl and for
// elementwise_texture.glsl. OP: 0 add, 1 sub, 2 mul, 3 div, 4 pow, 5 max, 6 min, 7 >, 8 <, 9 >=,
// 10 <=, 11 ==, 12 !=, 13 logical and, 14 logical or (comparisons and logic give 1.0 or 0.0),
// 15 a / b rounded down, 16 a / b rounded toward zero, 17 silu(a) * b. alpha scales b in add and sub.

float binary_op(float av, float bv, float alpha) {
#if OP == 0
    return av + alpha * bv;
#elif OP == 1
    return av - alpha * bv;
#elif OP == 2
    return av * bv;
#elif OP == 3
    return av / bv;
#elif OP == 4
    float r = pow(abs(av), bv);
    return (av < 0.0 && mod(bv, 2.0) == 1.0) ? -r : (av == 0.0 && bv == 0.0 ? 1.0 : r);
#elif OP == 5
    return max(av, bv);
#elif OP == 6
    return min(av, bv);
#elif OP == 7
    return float(av > bv);
#elif OP == 8
    return float(av < bv);
#elif OP == 9
    return float(av >= bv);
#elif OP == 10
    return float(av <= bv);
#elif OP == 11
    return float(av == bv);
#elif OP == 12
    return float(av != bv);
#elif OP == 13
    return float(av != 0.0 && bv != 0.0);
#elif OP == 14
    return float(av != 0.0 || bv != 0.0);
#elif OP == 15
    return floor(av / bv);
#elif OP == 16
    return trunc(av / bv);
#else
    return av / (1.0 + exp(-av)) * bv;
#endif
}

vec4 binary_op4(vec4 a, vec4 b, float alpha) {
    return vec4(binary_op(a.x, b.x, alpha), binary_op(a.y, b.y, alpha), binary_op(a.z, b.z, alpha),
                binary_op(a.w, b.w, alpha));
}
