#version 450
// out[i] = f(a[i]). OP: 0 silu (x * sigmoid(x)), 1 relu, 2 gelu (erf form), 3 gelu (tanh form).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Params {
    uint n;
};

// erf(x) with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26); GLSL has no erf.
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
#else
        float inner = 0.79788456080286536 * (v + 0.044715 * v * v * v);
        // tanh through exp, clamped: GLSL's tanh overflows to NaN for large |x| on some drivers.
        float e = exp(-2.0 * clamp(inner, -15.0, 15.0));
        outv[i] = 0.5 * v * (1.0 + (1.0 - e) / (1.0 + e));
#endif
    }
}
