#version 450
// out[i] = f(a[i]). OP: 0 silu (x * sigmoid(x)), 1 relu, 2 gelu (erf form), 3 gelu (tanh form),
// 4 sigmoid, 5 tanh, 6 exp, 7 sqrt, 8 rsqrt, 9 neg, 10 abs, 11 clamp to [p0, p1], 12 x * p0 + p1,
// 13 pow(x, p0), 14 logical not (1 where x == 0, else 0), 15 log, 16 x OP2 p0 (comparison: 0 >, 1 <,
// 2 >=, 3 <=, 4 ==, 5 !=; 1.0 true, 0.0 false), 17 p0 / x, 18 p0 - x.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Params {
    uint n;
    float p0;
    float p1;
};

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

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        float v = a[i];
#if OP == 0
        outv[i] = v / (1.0 + exp(-v));
#elif OP == 1
        outv[i] = max(v, 0.0);
#elif OP == 2
        outv[i] = 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
#elif OP == 3
        outv[i] = 0.5 * v * (1.0 + tanh_safe(0.79788456080286536 * (v + 0.044715 * v * v * v)));
#elif OP == 4
        outv[i] = 1.0 / (1.0 + exp(-v));
#elif OP == 5
        outv[i] = tanh_safe(v);
#elif OP == 6
        outv[i] = exp(v);
#elif OP == 7
        outv[i] = sqrt(v);
#elif OP == 8
        outv[i] = inversesqrt(v);
#elif OP == 9
        outv[i] = -v;
#elif OP == 10
        outv[i] = abs(v);
#elif OP == 11
        outv[i] = min(max(v, p0), p1);
#elif OP == 12
        outv[i] = v * p0 + p1;
#elif OP == 13
        // pow() is undefined for x < 0: integral exponents keep their sign rule
        float r = pow(abs(v), p0);
        outv[i] = (v < 0.0 && mod(p0, 2.0) == 1.0) ? -r : (v == 0.0 && p0 == 0.0 ? 1.0 : r);
#elif OP == 14
        outv[i] = v == 0.0 ? 1.0 : 0.0;
#elif OP == 15
        outv[i] = log(v);
#elif OP == 16
#if OP2 == 0
        outv[i] = float(v > p0);
#elif OP2 == 1
        outv[i] = float(v < p0);
#elif OP2 == 2
        outv[i] = float(v >= p0);
#elif OP2 == 3
        outv[i] = float(v <= p0);
#elif OP2 == 4
        outv[i] = float(v == p0);
#else
        outv[i] = float(v != p0);
#endif
#elif OP == 17
        outv[i] = p0 / v;
#else
        outv[i] = p0 - v;
#endif
    }
}
