#version 450
// Strided copy of up to 6 dims: for every index (i0..i5) of `size`,
//   out[out_base + sum(i_d * out_stride[d])] = in[in_base + sum(i_d * in_stride[d])].
// One kernel for permute, slice, select, expand, repeat, cat (one dispatch per input), clone.
// ELEM 0: 32-bit words (float or int bits: the copy does not look at them).

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) buffer Out { uint outv[]; };
layout(set = 0, binding = 1) readonly buffer In { uint inv[]; };

layout(push_constant) uniform Params {
    uint n;
    uint in_base;
    uint out_base;
    uint pad_;
    uint size[6];
    uint in_stride[6];
    uint out_stride[6];
};

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint rest = i;
        uint src = in_base;
        uint dst = out_base;
        for (int d = 5; d >= 0; --d) {
            uint c = rest % size[d];
            rest /= size[d];
            src += c * in_stride[d];
            dst += c * out_stride[d];
        }
        outv[dst] = inv[src];
    }
}
