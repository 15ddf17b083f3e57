"""Tensors bigger than one storage-buffer binding (maxStorageBufferRange): packed and read in
row windows. Most cases lower the graph's binding limit so small tensors take the same path: to
4096 bytes, or a multiple where the device's binding offsets are coarser (a window starts at a
multiple of minStorageBufferOffsetAlignment: 16 bytes on lavapipe, 256 on SwiftShader), with the
tensors' rows widened by the same factor so that they split alike."""

import numpy as np
import pytest
from gguf.quants import dequantize, quantize

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.errors import UnsupportedFeatureError
from vkgraph.graph import ComputeGraph

from .test_prepack import ref_linear_4x4
from .test_quant import QTYPES, ref_packed

def widen(device) -> int:
    """How much wider rows and the binding limit are on this device than at 16-byte offsets."""
    return max(1, device.limits["minStorageBufferOffsetAlignment"] // 16)


def small_limit_graph(device, compiler, **cfg):
    g = ComputeGraph(GraphConfig().replace(**cfg), device=device, compiler=compiler)
    g.max_binding_nbytes = 4096 * widen(device)
    return g


@pytest.mark.parametrize("n,k,bias", [(37, 70, True), (64, 33, False), (5, 200, True)])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "gpu-kernels"])
def test_fp32_linear_in_windows(device, compiler, monkeypatch, n, k, bias, cpu_kernels):
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rng = np.random.default_rng(n + k)
    k *= widen(device)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    with small_limit_graph(device, compiler, prepack__host_packing="never") as g:  # the packing shader's windows
        wd = g.prepack_tensor(g.add_tensorref(w, "w"), "linear_4x4")
        xin = g.add_input(x.shape, np.float32, "x")
        g.set_output(ops.linear(g, xin, wd, g.add_tensorref(b, "b") if bias else None), "y")
        report = g.run_prepack()
        assert report.packing_dispatches > 1  # the weight was packed in several windows
        assert g.prepack_nodes[0].dispatch_kinds(g) == [k % 4 == 0] * report.packing_dispatches  # source texels
        np.testing.assert_array_equal(g.read_tensor(wd), ref_linear_4x4(w).reshape(-1).view(np.uint8))
        y = g.execute({"x": x})["y"]
        tiled = cpu_kernels and device.is_cpu and device.renderer in ops.TILED_LINEAR_RENDERERS and k % 4 == 0
        kernel = "linear_tiled" if tiled else "linear_4x4"
        assert sum(1 for node in g.execute_nodes if node.shader == kernel) > 1
    np.testing.assert_allclose(y, x @ w.T + (b if bias else 0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [1, 10])
def test_fp32_linear_rows_in_windows(device, compiler, m):
    """graph.fp32_linear_layout = "rows" on a CPU renderer: the weight goes to the device as it
    is, copied (no packing dispatch), and the tiled kernel reads it in row windows, one token at
    a time and in tiles."""
    if not (ops.CPU_KERNELS and device.is_cpu and device.renderer in ops.TILED_LINEAR_RENDERERS):
        pytest.skip("rows are read by the CPU renderers' tiled fp32 kernel only")
    rng = np.random.default_rng(m)
    n, k = 45, 36 * widen(device)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with ComputeGraph(GraphConfig().replace(graph__fp32_linear_layout="rows"), device=device, compiler=compiler) as g:
        g.max_binding_nbytes = 4096 * widen(device)
        xin = g.add_input(x.shape, np.float32, "x")
        g.set_output(ops.linear(g, xin, g.add_tensorref(w, "w")), "y")
        report = g.run_prepack()
        assert report.packing_dispatches == 0 and [n.packer.name for n in g.prepack_nodes] == ["identity"]
        assert sum(1 for node in g.execute_nodes if node.shader == "linear_tiled") > 1
        y = g.execute({"x": x})["y"]
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", list(QTYPES))
def test_quantized_linear_and_embedding_in_windows(device, compiler, fmt):
    """Blocks that start mid-word (Q4_0, Q8_0); on lavapipe rows of 3 blocks, so that rows end
    mid-word too and windows start only at rows whose offsets are aligned."""
    rng = np.random.default_rng(len(fmt))
    n, k = 300, 96 * widen(device)
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), QTYPES[fmt])
    deq = dequantize(raw, QTYPES[fmt]).astype(np.float32)
    x = rng.standard_normal((2, k)).astype(np.float32)
    ids = np.array([299, 0, -5, 150, 300, 7], np.int32)
    with small_limit_graph(device, compiler) as g:
        wd = g.prepack_tensor(g.add_tensorref(raw, "blk.w", quant=fmt))
        xin, idin = g.add_input(x.shape, np.float32, "x"), g.add_input(ids.shape, np.int32, "ids")
        g.set_output(ops.linear(g, xin, wd), "y")
        g.set_output(ops.embedding(g, idin, wd), "e")
        assert g.run_prepack().packing_dispatches == 0  # copied as it is
        assert sum(1 for node in g.execute_nodes if node.shader == "linear_quant") > 1
        np.testing.assert_array_equal(g.read_tensor(wd), ref_packed(raw))
        out = g.execute({"x": x, "ids": ids})
    np.testing.assert_allclose(out["y"], x.astype(np.float64) @ deq.T, rtol=1e-4, atol=1e-4)
    valid = (ids >= 0) & (ids < n)
    np.testing.assert_array_equal(out["e"], np.where(valid[:, None], deq[np.clip(ids, 0, n - 1)], 0))


def test_fp32_embedding_in_windows(device, compiler):
    table = np.random.default_rng(3).standard_normal((500, 24 * widen(device))).astype(np.float32)
    ids = np.array([499, 0, 250, -1, 500, 42, 42], np.int32)
    with small_limit_graph(device, compiler) as g:
        idin = g.add_input(ids.shape, np.int32, "ids")
        g.set_output(ops.embedding(g, idin, g.add_tensorref(table, "emb")), "e")
        g.run_prepack()
        e = g.execute({"ids": ids})["e"]
        assert sum(1 for node in g.execute_nodes if node.shader == "embedding") > 1
    valid = (ids >= 0) & (ids < 500)
    np.testing.assert_array_equal(e, np.where(valid[:, None], table[np.clip(ids, 0, 499)], 0))


def test_unwindowable_tensors_are_refused_before_any_gpu_work(device, compiler):
    x = widen(device)
    with small_limit_graph(device, compiler) as g:
        ref = g.add_tensorref(np.ones((40, 40 * x), np.float32), "big.T")
        with pytest.raises(UnsupportedFeatureError, match=f"'big.T' needs {6400 * x} bytes in one binding"):
            g.prepack_tensor(ref, "transposed")
        wide = g.add_tensorref(np.ones((5, 300 * x), np.float32), "too.wide")  # one 4-row block > the limit
        with pytest.raises(UnsupportedFeatureError, match=f"'too.wide' needs {9600 * x} bytes .*4 rows of {1200 * x} bytes"):
            g.prepack_tensor(wide, "linear_4x4")
        assert not g.prepack_nodes


@pytest.mark.slow
def test_weight_beyond_max_storage_buffer_range(device, compiler):
    """A real fp32 weight larger than the device's maxStorageBufferRange (128 MiB on lavapipe)."""
    most = device.limits["maxStorageBufferRange"]
    if most > 1 << 28:
        # Windows themselves are tested on every device with a lowered max_binding_nbytes (above).
        pytest.skip(f"maxStorageBufferRange is {most} bytes: a real weight above it is too big for CI")
    k = 4100
    n = most // (k * 4) + 8  # just over the limit, and not a multiple of 4 rows
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((2, k), dtype=np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        assert w.nbytes > most
        xin = g.add_input(x.shape, np.float32, "x")
        g.set_output(ops.linear(g, xin, g.add_tensorref(w, "lm_head")), "y")
        report = g.run_prepack()
        assert report.packing_dispatches == 2
        y = g.execute({"x": x})["y"]
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=2e-3)
