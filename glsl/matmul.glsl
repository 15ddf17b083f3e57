#version 450
// c[b][m][n] = sum_k a[b][m][k] * b[b][k][n] (or b[b][n][k] with TRANSPOSE_B); both operands
// are runtime tensors. One invocation per output element.

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) writeonly buffer C { float c[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer Bm { float bm[]; };

layout(push_constant) uniform Params {
    uint batch;
    uint M;
    uint N;
    uint K;
};

void main() {
    uint total = batch * M * N;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < total; o += stride) {
        uint bi = o / (M * N);
        uint m = (o / N) % M;
        uint n = o % N;
        uint a_base = (bi * M + m) * K;
        float acc = 0.0;
        for (uint k = 0u; k < K; ++k) {
#if TRANSPOSE_B
            acc += a[a_base + k] * bm[(bi * N + n) * K + k];
#else
            acc += a[a_base + k] * bm[(bi * K + k) * N + n];
#endif
        }
        c[o] = acc;
    }
}
