// Workgroup-wide reductions through shared memory, over LOCAL_SIZE invocations (a power of two,
// declared by the includer as `layout(constant_id = 0) const uint LOCAL_SIZE` and used as
// local_size_x). Every invocation of the workgroup must make the call (it has barriers).

shared float reduce_scratch[LOCAL_SIZE];

float workgroup_reduce(float v, bool take_max) {
    uint t = gl_LocalInvocationID.x;
    reduce_scratch[t] = v;
    barrier();
    for (uint half_ = LOCAL_SIZE / 2u; half_ > 0u; half_ /= 2u) {
        if (t < half_) {
            float other = reduce_scratch[t + half_];
            reduce_scratch[t] = take_max ? max(reduce_scratch[t], other) : reduce_scratch[t] + other;
        }
        barrier();
    }
    float r = reduce_scratch[0];
    barrier();  // everyone has read the result before the scratch is reused
    return r;
}

float workgroup_sum(float v) { return workgroup_reduce(v, false); }
float workgroup_max(float v) { return workgroup_reduce(v, true); }
