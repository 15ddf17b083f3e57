// unary_op(v, p0, p1, p2, p3): the elementwise function OP of unary.glsl (the list below), for
// unary.glsl and for kernels that apply it to their results (linear_tiled.glsl's ACT).
// OP: 0 silu (x * sigmoid(x)), 1 relu, 2 gelu (erf form), 3 gelu (tanh form),
// 4 sigmoid, 5 tanh, 6 exp, 7 sqrt, 8 rsqrt, 9 neg, 10 abs, 11 clamp to [p0, p1], 12 x * p0 + p1,
// 13 pow(x, p0), 14 logical not (1 where x == 0, else 0), 15 log, 16 x OP2 p0 (comparison: 0 >, 1 <,
// 2 >=, 3 <=, 4 ==, 5 !=; 1.0 true, 0.0 false), 17 p0 / x, 18 p0 - x, 19 sin, 20 cos, 21 log10,
// 22 round (half to even), 23 hardswish, 24 leaky relu (slope p0), 25 hardshrink (lambda p0),
// 26 quantize: clamp(round(x * p0) + p1, p2, p3) (an int8 value, kept as a float).

// erf(x) with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26); GLSL has no erf.
// tanh through exp, clamped: GLSL's tanh overflows to NaN for large |x| on some drivers.
float tanh_safe(float x) {
    float e = exp(-2.0 * clamp(x, -15.0, 15.0));
    return (1.0 - e) / (1.0 + e);
}

float erf_approx(float x) {
    float s = sign(x);
    float a = abs(x);
    float t = 1.0 / (1.0 + 0.3275911 * a);
    float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return s * (1.0 - poly * exp(-a * a));
}

// sin and cos to about 1 ulp for |x| up to ~8000 (Cody-Waite reduction by pi/4 and minimax
// polynomials, as Cephes' sinf/cosf): the built-ins may err by 2^-11 (SwiftShader's do).
float sincos_precise(float x, bool want_cos) {
    float sgn = (!want_cos && x < 0.0) ? -1.0 : 1.0;
    float a = abs(x);
    int j = int(a * 1.27323954473516);  // 4 / pi
    j += j & 1;
    float y = float(j);
    float r = ((a - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    j &= 7;
    if (j > 3) {
        sgn = -sgn;
        j -= 4;
    }
    if (want_cos && j > 1) sgn = -sgn;
    float z = r * r;
    bool use_cos_poly = want_cos ? (j == 0 || j == 3) : (j == 1 || j == 2);
    float p = use_cos_poly
        ? ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0
        : ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    return sgn * p;
}

float unary_op(float v, float p0, float p1, float p2, float p3) {
#if OP == 0
    return v / (1.0 + exp(-v));
#elif OP == 1
    return max(v, 0.0);
#elif OP == 2
    return 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
#elif OP == 3
    return 0.5 * v * (1.0 + tanh_safe(0.79788456080286536 * (v + 0.044715 * v * v * v)));
#elif OP == 4
    return 1.0 / (1.0 + exp(-v));
#elif OP == 5
    return tanh_safe(v);
#elif OP == 6
    return exp(v);
#elif OP == 7
    return sqrt(v);
#elif OP == 8
    return inversesqrt(v);
#elif OP == 9
    return -v;
#elif OP == 10
    return abs(v);
#elif OP == 11
    return min(max(v, p0), p1);
#elif OP == 12
    return v * p0 + p1;
#elif OP == 13
    // pow() is undefined for x < 0: integral exponents keep their sign rule
    float r = pow(abs(v), p0);
    return (v < 0.0 && mod(p0, 2.0) == 1.0) ? -r : (v == 0.0 && p0 == 0.0 ? 1.0 : r);
#elif OP == 14
    return v == 0.0 ? 1.0 : 0.0;
#elif OP == 15
    return log(v);
#elif OP == 16
#if OP2 == 0
    return float(v > p0);
#elif OP2 == 1
    return float(v < p0);
#elif OP2 == 2
    return float(v >= p0);
#elif OP2 == 3
    return float(v <= p0);
#elif OP2 == 4
    return float(v == p0);
#else
    return float(v != p0);
#endif
#elif OP == 17
    return p0 / v;
#elif OP == 18
    return p0 - v;
#elif OP == 19
    return sincos_precise(v, false);
#elif OP == 20
    return sincos_precise(v, true);
#elif OP == 21
    return log2(v) * 0.30102999566398120;
#elif OP == 22
    return roundEven(v);
#elif OP == 23
    return v * clamp(v + 3.0, 0.0, 6.0) / 6.0;
#elif OP == 24
    return v >= 0.0 ? v : v * p0;
#elif OP == 25
    return abs(v) > p0 ? v : 0.0;
#else
    return clamp(roundEven(v * p0) + p1, p2, p3);
#endif
}
