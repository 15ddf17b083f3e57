import numpy as np
import pytest

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph


def run(device, compiler, build, inputs, **cfg):
    """Build a graph with ``build(g, input_refs) -> output ref``, prepack, execute once."""
    with ComputeGraph(GraphConfig().replace(**cfg), device=device, compiler=compiler) as g:
        refs = {name: g.add_input(a.shape, a.dtype, name) for name, a in inputs.items()}
        g.set_output(build(g, refs), "out")
        g.run_prepack()
        return g.execute(inputs)["out"], g.execute_command_buffers


def rng_for(*shape):
    return np.random.default_rng(abs(hash(shape)) % 2**32)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 5), (3, 64, 33), (5, 130, 67)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(device, compiler, m, k, n, with_bias):
    rng = rng_for(m, k, n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)

    def build(g, r):
        bias = g.add_tensorref(b, "b") if with_bias else None
        return ops.linear(g, r["x"], g.add_tensorref(w, "w"), bias)

    out, _ = run(device, compiler, build, {"x": x})
    expect = x @ w.T + (b if with_bias else 0)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 129)])
@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
@pytest.mark.parametrize("row_broadcast", [False, True])
def test_binary(device, compiler, shape, op, fn, row_broadcast):
    rng = rng_for(*shape, len(op))
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape[-1:] if row_broadcast else shape).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: getattr(ops, op)(g, r["a"], r["b"]), {"a": a, "b": b})
    np.testing.assert_allclose(out, fn(a, b), rtol=1e-6, atol=1e-6)


def test_binary_with_constant_operand(device, compiler):
    rng = rng_for(4, 9)
    a = rng.standard_normal((4, 9)).astype(np.float32)
    c = rng.standard_normal(9).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.mul(g, r["a"], g.add_tensorref(c, "scale")), {"a": a})
    np.testing.assert_allclose(out, a * c, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_silu_and_relu(device, compiler, n):
    a = rng_for(n).standard_normal((1, n)).astype(np.float32) * 4
    out, _ = run(device, compiler, lambda g, r: ops.silu(g, r["a"]), {"a": a})
    np.testing.assert_allclose(out, a / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)
    out, _ = run(device, compiler, lambda g, r: ops.relu(g, r["a"]), {"a": a})
    np.testing.assert_array_equal(out, np.maximum(a, 0))


@pytest.mark.parametrize("m,d", [(1, 1), (3, 5), (4, 64), (2, 1000)])
def test_rms_norm(device, compiler, m, d):
    rng = rng_for(m, d)
    x = rng.standard_normal((m, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.rms_norm(g, r["x"], g.add_tensorref(w, "w"), 1e-5), {"x": x})
    expect = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_embedding(device, compiler):
    rng = rng_for(50, 7)
    table = rng.standard_normal((50, 7)).astype(np.float32)
    ids = np.array([3, 0, 49, 3, -1, 50, 17], np.int32)
    out, _ = run(device, compiler, lambda g, r: ops.embedding(g, r["ids"], g.add_tensorref(table, "emb")), {"ids": ids})
    expect = np.where(((ids >= 0) & (ids < 50))[:, None], table[np.clip(ids, 0, 49)], 0)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("initial,steady,max_cmds,cmds", [(64, 128, 0, 1), (2, 3, 0, 5), (2, 3, 2, 2), (1, 1, 0, 12)])
def test_execute_split_and_resubmit(device, compiler, initial, steady, max_cmds, cmds):
    """A chain of 12 dispatches split into command buffers gives the same answer, every run."""
    rng = rng_for(12, initial, steady)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    c = rng.standard_normal(8).astype(np.float32)

    def build(g, r):
        h = r["x"]
        for i in range(6):
            h = ops.add(g, ops.mul(g, h, g.add_tensorref(c, f"c{i}")), r["x"])
        return h

    cfg = dict(execute__initial_threshold_node_count=initial, execute__threshold_node_count=steady,
               execute__max_cmds=max_cmds)
    with ComputeGraph(GraphConfig().replace(**cfg), device=device, compiler=compiler) as g:
        g.set_output(build(g, {"x": g.add_input(x.shape, x.dtype, "x")}), "out")
        g.run_prepack()
        expect = x.copy()
        for _ in range(6):
            expect = expect * c + x
        for trial in range(3):
            xi = x * (trial + 1)
            e = xi.copy()
            for _ in range(6):
                e = e * c + xi
            np.testing.assert_allclose(g.execute({"x": xi})["out"], e, rtol=1e-5, atol=1e-5)
        assert g.execute_command_buffers == cmds


def test_bad_inputs_are_named(device, compiler):
    with ComputeGraph(device=device, compiler=compiler) as g:
        x = g.add_input((2, 3), np.float32, "x")
        with pytest.raises(ValueError, match=r"linear: input \(2, 3\) and weight \(4, 5\)"):
            ops.linear(g, x, g.add_tensorref(np.ones((4, 5), np.float32), "w"))
        g.set_output(ops.relu(g, x), "y")
        with pytest.raises(Exception, match="prepack the graph"):
            g.execute({"x": np.ones((2, 3), np.float32)})
        g.run_prepack()
        with pytest.raises(ValueError, match=r"input 'x' needs shape \(2, 3\) and dtype float32"):
            g.execute({"x": np.ones((3, 2), np.float32)})
        with pytest.raises(KeyError, match="missing graph inputs: x"):
            g.execute({})
