import numpy as np
import pytest

from vkgraph.runtime import PipelineCache
from vkgraph.tools.smoke import axpby

from .kernels import run_kernel


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 100_003])
@pytest.mark.parametrize("local_size", [1, 64, 256])
def test_axpby_matches_numpy(device, compiler, n, local_size):
    rng = np.random.default_rng(n * 7 + local_size)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    alpha, beta = rng.uniform(-3, 3, size=2)
    res = axpby(device, x, y, alpha, beta, local_size=local_size, compiler=compiler)
    expect = np.float32(alpha) * x + np.float32(beta) * y
    np.testing.assert_allclose(res.y, expect, rtol=1e-6, atol=1e-6)


def test_axpby_specialization_changes_result(device, compiler):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4096, dtype=np.float32)
    y = rng.standard_normal(4096, dtype=np.float32)
    a = axpby(device, x, y, 1.0, beta=0.0, compiler=compiler).y
    b = axpby(device, x, y, 1.0, beta=2.0, compiler=compiler).y
    np.testing.assert_allclose(a, x, rtol=1e-6)
    np.testing.assert_allclose(b, x + 2 * y, rtol=1e-6, atol=1e-6)


def test_axpby_with_pipeline_cache(device, compiler):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(777, dtype=np.float32)
    y = rng.standard_normal(777, dtype=np.float32)
    with PipelineCache(device) as cache:
        res = axpby(device, x, y, -0.5, 3.0, compiler=compiler, pipeline_cache=cache)
    np.testing.assert_allclose(res.y, -0.5 * x + 3.0 * y, rtol=1e-6, atol=1e-6)


PUSH_SRC = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer OutU { uint u[4]; };
layout(set = 0, binding = 1) buffer OutF { float f[4]; };
layout(push_constant) uniform P { uvec4 pu; vec4 pf; };
void main() { u[0] = pu.x; u[1] = pu.y; u[2] = pu.z; u[3] = pu.w; f[0] = pf.x; f[1] = pf.y; f[2] = pf.z; f[3] = pf.w; }
"""


def test_push_constants_reach_the_shader(device, compiler):
    rng = np.random.default_rng(3)
    pu = rng.integers(1, 2**32, size=4, dtype=np.uint32)
    pf = rng.standard_normal(4).astype(np.float32)
    push = pu.tobytes() + pf.tobytes()
    out_u, out_f = run_kernel(
        device, compiler.compile_source(PUSH_SRC), [np.zeros(4, np.uint32), np.zeros(4, np.float32)], push=push
    )
    np.testing.assert_array_equal(out_u, pu)
    np.testing.assert_array_equal(out_f, pf)


SPEC_SRC = """
#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int I = 0;
layout(constant_id = 2) const uint U = 0u;
layout(constant_id = 3) const float F = 0.0;
layout(constant_id = 4) const bool B = false;
layout(set = 0, binding = 0) buffer Out { int ints[]; };
layout(set = 0, binding = 1) buffer OutF { float floats[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    // Each invocation writes its slot, so the workgroup size (constant 0) is observable.
    ints[4 * i + 0] = I;
    ints[4 * i + 1] = int(U);
    ints[4 * i + 2] = B ? 1 : 0;
    ints[4 * i + 3] = int(gl_WorkGroupSize.x);
    floats[i] = F;
}
"""


@pytest.mark.parametrize("wg,i,u,f,b", [(1, -7, 3_000_000_000, 2.5, True), (32, 123456, 1, -0.125, False)])
def test_specialization_constants_of_every_type(device, compiler, wg, i, u, f, b):
    n = wg * 2
    ints, floats = run_kernel(
        device,
        compiler.compile_source(SPEC_SRC),
        [np.full(4 * n, -1, np.int32), np.full(n, np.nan, np.float32)],
        spec={0: wg, 1: i, 2: u, 3: f, 4: b},
        groups=(2, 1, 1),
    )
    expect = np.tile(np.array([i, np.uint32(u).view(np.int32), int(b), wg], np.int32), n)
    np.testing.assert_array_equal(ints, expect)
    np.testing.assert_array_equal(floats, np.full(n, f, np.float32))

