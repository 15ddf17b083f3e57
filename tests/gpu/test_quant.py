"""GGML block formats: packers and quantized linear/embedding against gguf's own dequantizer."""

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize

from vkgraph import ops
from vkgraph.graph import ComputeGraph
from vkgraph.ggml import FORMATS, int8_blocks

QTYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}


def quantized(fmt, n, k, seed):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = quantize(w, QTYPES[fmt])  # uint8 [n, k / 32 * block bytes]
    return raw, dequantize(raw, QTYPES[fmt]).astype(np.float32)


def ref_packed(raw):
    """The packed layout in numpy: the file's blocks as they are, zero-padded to whole words."""
    flat = raw.reshape(-1)
    return np.concatenate([flat, np.zeros(-flat.nbytes % 4, np.uint8)])


def ref_planes(fmt, raw):
    """Blocks in planes (CPU renderers' linears): every block's quants (16 bytes of nibbles or 32
    int8), then every block's head as a 32-bit word (d and Q4_1's m, or d and two zero bytes),
    zero-padded to 16 bytes."""
    f = FORMATS[fmt]
    blocks = raw.reshape(-1, f.block_nbytes)
    heads = np.zeros((blocks.shape[0], 4), np.uint8)
    heads[:, :f.head_nbytes] = blocks[:, :f.head_nbytes]
    flat = np.concatenate([blocks[:, f.head_nbytes:].reshape(-1), heads.reshape(-1)])
    return np.concatenate([flat, np.zeros(-flat.nbytes % 16, np.uint8)])


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (150, 64, 1), (5, 64, 3), (33, 96, 19), (64, 576, 9)])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
def test_pack_linear_and_embedding(device, compiler, monkeypatch, fmt, n, k, m, cpu_kernels):
    """Both layouts of the quantized linear (on CPU renderers: tiles of rows x tokens per
    invocation and texel buffers; on GPUs: a row per invocation) against gguf's dequantizer,
    for one token (decode; 150 rows on 2 CPU threads: 12 an invocation, the last invocation 6),
    fewer than a tile's tokens, and several tiles with a partial one."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    raw, deq = quantized(fmt, n, k, n * k)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    ids = np.array([0, n - 1, n // 2, -1, n], np.int32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        src = g.add_tensorref(raw, "blk.0.w", quant=fmt)
        w = g.prepack_tensor(src)
        assert g.values[w].shape == (n, k) and g.values[w].layout == fmt
        xin = g.add_input(x.shape, np.float32, "x")
        idin = g.add_input(ids.shape, np.int32, "ids")
        g.set_output(ops.linear(g, xin, w), "y")
        g.set_output(ops.embedding(g, idin, w), "e")  # one packed table serves both (tied weights)
        g.set_output(ops.linear(g, xin, src), "ys")  # from the source: in planes where CPU kernels read it
        tied = ops.tied_table(g, src)  # the same planes, which an embedding reads too
        g.set_output(ops.embedding(g, idin, tied), "et")
        g.set_output(ops.linear(g, xin, tied), "yt")
        planes = [nd for nd in g.prepack_nodes if nd.packer.name == f"{fmt}_planes"]
        assert len(planes) == (cpu_kernels and device.is_cpu)
        g.run_prepack()
        np.testing.assert_array_equal(g.read_tensor(w), ref_packed(raw))
        for nd in planes:
            np.testing.assert_array_equal(g.read_tensor(nd.dst), ref_planes(fmt, raw))
        out = g.execute({"x": x, "ids": ids})
    for key in ("y", "ys", "yt"):
        np.testing.assert_allclose(out[key], x.astype(np.float64) @ deq.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    valid = (ids >= 0) & (ids < n)
    for key in ("e", "et"):
        np.testing.assert_array_equal(out[key], np.where(valid[:, None], deq[np.clip(ids, 0, n - 1)], 0))


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "gpu-kernels"])
@pytest.mark.parametrize("fmt", ["fp32", *FORMATS])
def test_tiles_on_rows_of_workgroups(device, compiler, monkeypatch, fmt, cpu_kernels):
    """Tile kernels (a batch of tokens: the CPU renderers' kernels, and GPUs' for GGML weights,
    LINEAR_TOKENS_GPU tokens a row) give each tile an invocation of its own, no grid-stride loop:
    past the device's x limit of workgroups the tiles go on in further rows (here a limit of 2
    workgroups), each tile once, plain, gated and with a residual."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    n, k, m = 320, 96, 19
    if fmt == "fp32":
        w = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
        u = np.random.default_rng(2).standard_normal((n, k)).astype(np.float32)
        deq, deq_u = w, u
    else:
        (w, deq), (u, deq_u) = quantized(fmt, n, k, 1), quantized(fmt, n, k, 2)
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    res = np.random.default_rng(4).standard_normal((m, n)).astype(np.float32)
    quant = "" if fmt == "fp32" else fmt
    with ComputeGraph(device=device, compiler=compiler) as g:
        g.max_groups_x = 2
        xin, rin = g.add_input(x.shape, np.float32, "x"), g.add_input(res.shape, np.float32, "res")
        wr, ur = g.add_tensorref(w, "w", quant=quant), g.add_tensorref(u, "u", quant=quant)
        g.set_output(ops.linear(g, xin, wr, residual=rin), "y")
        if quant:
            g.set_output(ops.gated_linear(g, xin, wr, ur), "gated")
        tiles = [nd for nd in g.execute_nodes if nd.shader in ("linear_quant", "linear_tiled") and nd.defines["TOKENS"] > 1]
        assert all(nd.groups[0] <= 2 and nd.groups[1] > 1 for nd in tiles)
        cpu = cpu_kernels and device.is_cpu
        assert bool(tiles) == (quant != "" or (cpu and device.renderer in ops.TILED_LINEAR_RENDERERS))
        g.run_prepack()
        out = g.execute({"x": x, "res": res})
    x64 = x.astype(np.float64)
    refs = {"y": x64 @ deq.T + res}
    if quant:
        gate, up = x64 @ deq.T, x64 @ deq_u.T
        refs["gated"] = gate / (1 + np.exp(-gate)) * up
    for key, ref in refs.items():  # float32 sums of 96 products of unit normals: errors scale with the largest
        np.testing.assert_allclose(out[key], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("split", [1, 4, 16, 64])
def test_gpu_gemv_rows_shared_by_invocations(device, compiler, monkeypatch, fmt, split):
    """GPUs' one-token kernel with GEMV_SPLIT_GPU invocations a row, each taking every split-th
    block (35 blocks a row here: some take one more; at 64 a row, 29 take none), their sums added
    in shared memory: plain, gated with the RMS norm fused in, and with a residual, in two
    workgroups that loop over the 150 rows (the last rows of the last pass past N): numpy's
    result."""
    monkeypatch.setattr(ops, "CPU_KERNELS", False)
    monkeypatch.setattr(ops, "GEMV_SPLIT_GPU", split)
    n, k, eps = 150, 1120, 1e-5
    (w, deq), (u, deq_u) = quantized(fmt, n, k, 1), quantized(fmt, n, k, 2)
    rng = np.random.default_rng(3)
    x = (2 * rng.standard_normal((1, k)) + 0.5).astype(np.float32)
    res = rng.standard_normal((1, n)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        g.max_groups_x = 2
        xin, rin = g.add_input(x.shape, np.float32, "x"), g.add_input(res.shape, np.float32, "res")
        wr, ur = g.add_tensorref(w, "w", quant=fmt), g.add_tensorref(u, "u", quant=fmt)
        g.set_output(ops.linear(g, xin, wr), "y")
        g.set_output(ops.gated_linear(g, xin, wr, ur, norm=(g.add_tensorref(gamma, "norm"), eps)), "gated")
        g.set_output(ops.linear(g, xin, wr, residual=rin), "yr")
        assert [(nd.defines["SPLIT"], nd.groups) for nd in g.execute_nodes] == [(split, (2, 1, 1))] * 3
        g.run_prepack()
        out = g.execute({"x": x, "res": res})
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt(np.mean(x64 ** 2) + eps) * gamma
    gate, up = xn @ deq.T, xn @ deq_u.T
    refs = {"y": x64 @ deq.T, "gated": gate / (1 + np.exp(-gate)) * up, "yr": x64 @ deq.T + res}
    for key, ref in refs.items():
        np.testing.assert_allclose(out[key], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("split", [3, 128])
def test_gpu_gemv_split_must_fit_a_workgroup(device, compiler, monkeypatch, split):
    """A GEMV_SPLIT_GPU the shader cannot take (not a power of two, or more than a workgroup's
    invocations: no row would fit) is named before anything is recorded."""
    monkeypatch.setattr(ops, "CPU_KERNELS", False)
    monkeypatch.setattr(ops, "GEMV_SPLIT_GPU", split)
    w, _ = quantized("q4_0", 8, 64, 1)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input((1, 64), np.float32, "x")
        with pytest.raises(ValueError, match=f"GEMV_SPLIT_GPU must be a power of two of at most 64, got {split}"):
            ops.linear(g, xin, g.add_tensorref(w, "w", quant="q4_0"))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("host", ["never", "cpu-renderer"])
def test_blocks_are_copied(device, compiler, fmt, host):
    """GGML blocks have no packing shader: written straight into host-visible device memory, or
    copied from staging (with prepack.host_packing either way); an odd number of 34- or 18-byte
    blocks ends mid-word, and the last word is zero-padded."""
    from vkgraph.config import GraphConfig

    raw, _ = quantized(fmt, 33, 96, 7)
    assert raw.nbytes % 4 == (2 if fmt != "q4_1" else 0)
    with ComputeGraph(GraphConfig().replace(prepack__host_packing=host), device=device, compiler=compiler) as g:
        w = g.prepack_tensor(g.add_tensorref(raw, "w", quant=fmt))
        report = g.run_prepack()
        assert report.packing_dispatches == 0
        np.testing.assert_array_equal(g.read_tensor(w), ref_packed(raw))


@pytest.mark.parametrize("m", [1, 11])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
def test_linear_with_residual(device, compiler, monkeypatch, m, cpu_kernels):
    """A skip connection added in the quantized linear's dispatch (an activation first, in its own
    dispatch); fp32 weights add it after on GPUs."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    raw, deq = quantized("q4_1", 40, 64, 7)
    dense = np.random.default_rng(8).standard_normal((40, 64)).astype(np.float32)
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 64)).astype(np.float32)
    res = rng.standard_normal((m, 40)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin, rin = g.add_input(x.shape, np.float32, "x"), g.add_input(res.shape, np.float32, "r")
        g.set_output(ops.linear(g, xin, g.add_tensorref(raw, "wq", quant="q4_1"), residual=rin), "yq")
        g.set_output(ops.linear(g, xin, g.add_tensorref(dense, "wf"), residual=rin), "yf")
        g.set_output(ops.linear(g, xin, g.add_tensorref(raw, "wq3", quant="q4_1"), residual=rin, act="relu"), "yr")
        with pytest.raises(ValueError, match="activation 'clamp' is not one of"):
            ops.linear(g, xin, g.add_tensorref(dense, "wf2"), act="clamp")
        with pytest.raises(ValueError, match=rf"residual \({m}, 39\) is not the output's \({m}, 40\)"):
            ops.linear(g, xin, g.add_tensorref(raw, "wq2", quant="q4_1"), residual=g.add_tensor((m, 39), np.float32))
        g.run_prepack()
        out = g.execute({"x": x, "r": res})
    np.testing.assert_allclose(out["yq"], res + x.astype(np.float64) @ deq.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["yf"], res + x.astype(np.float64) @ dense.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["yr"], res + np.maximum(x.astype(np.float64) @ deq.T, 0), rtol=1e-4, atol=1e-4)


def silu(v):
    return v / (1 + np.exp(-v))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (33, 96, 19), (64, 576, 9)])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
@pytest.mark.parametrize("gated_gemv", [True, False], ids=["one-dispatch", "two-linears"])
def test_gated_linear(device, compiler, monkeypatch, fmt, n, k, m, cpu_kernels, gated_gemv):
    """silu(x @ gate.T) * (x @ up.T) in one dispatch for GGML weights of one format and shape
    (one token and tiles, both layouts), except one token on a CPU renderer not in
    GATED_GEMV_RENDERERS: two linears and silu_mul; fp32 weights, or a gate and an up of
    different formats, as two linears and silu_mul: numpy's result either way."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    monkeypatch.setattr(ops, "GATED_GEMV_RENDERERS", {device.renderer} if gated_gemv else set())
    fused = gated_gemv or m > 1 or not (cpu_kernels and device.is_cpu)
    (gq, gd), (uq, ud) = quantized(fmt, n, k, 1), quantized(fmt, n, k, 2)
    other = "q8_0" if fmt != "q8_0" else "q4_0"
    oq, od = quantized(other, n, k, 3)
    gf, uf = (np.random.default_rng(s).standard_normal((n, k)).astype(np.float32) for s in (4, 5))
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(gq, "g", quant=fmt), g.add_tensorref(uq, "u", quant=fmt)), "y")
        if fused:
            assert [d.shader for d in g.execute_nodes] == ["linear_quant"] and g.execute_nodes[0].weights == 2
        else:
            assert [(d.shader, d.weights) for d in g.execute_nodes] == [("linear_quant", 1)] * 2 + [("binary", 1)]
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(gf, "gf"), g.add_tensorref(uf, "uf")), "yf")
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(gq, "g2", quant=fmt), g.add_tensorref(oq, "o", quant=other)), "ym")
        assert len(g.execute_nodes) > 3
        g.run_prepack()
        out = g.execute({"x": x})
    x64 = x.astype(np.float64)
    for key, gate, up in (("y", gd, ud), ("yf", gf, uf), ("ym", gd, od)):
        ref = silu(x64 @ gate.T) * (x64 @ up.T)  # products of two sums of k terms: error to their scale
        np.testing.assert_allclose(out[key], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("m", [1, 19])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
def test_stacked_linear(device, compiler, monkeypatch, m, cpu_kernels):
    """x times weights stacked row after row (a layer's q, k, v): GGML weights of one format as
    one weight packed from their sources' bytes and one dispatch; other mixes as a linear per
    weight copied into its columns; numpy's result either way."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    k = 96
    parts = [quantized("q4_1", n, k, n) for n in (40, 8, 8)]
    q8 = quantized("q8_0", 8, k, 3)
    dense = np.random.default_rng(4).standard_normal((16, k)).astype(np.float32)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        refs = [g.add_tensorref(raw, f"w{i}", quant="q4_1") for i, (raw, _) in enumerate(parts)]
        g.set_output(ops.stacked_linear(g, xin, refs), "y")
        assert [n.shader for n in g.execute_nodes] == ["linear_quant"] and len(g.prepack_nodes) == 1
        assert g.values[g.prepack_nodes[0].src].name == "w0+w1+w2"
        mixed = [g.add_tensorref(parts[0][0], "m0", quant="q4_1"), g.add_tensorref(q8[0], "m1", quant="q8_0"),
                 g.add_tensorref(dense, "m2")]
        g.set_output(ops.stacked_linear(g, xin, mixed), "ym")
        g.run_prepack()
        stacked = np.concatenate([raw for raw, _ in parts])
        np.testing.assert_array_equal(g.read_tensor(g.prepack_nodes[0].dst),
                                      ref_planes("q4_1", stacked) if cpu_kernels and device.is_cpu else ref_packed(stacked))
        out = g.execute({"x": x})
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out["y"], x64 @ np.concatenate([d for _, d in parts]).T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["ym"], x64 @ np.concatenate([parts[0][1], q8[1], dense]).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 19])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
def test_linears_with_rms_norm(device, compiler, monkeypatch, fmt, m, cpu_kernels):
    """``norm=``: x RMS-normalized inside the GGML linear's dispatch one token at a time (alone, with
    a residual, gated, stacked; both layouts), in a dispatch of its own before tiles of tokens and
    before an fp32 linear: numpy's rms_norm then matmul either way; a norm weight of the wrong
    size is named."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    n, k, eps = 40, 96, 1e-5
    (wq, wd), (gq, gd), (uq, ud) = (quantized(fmt, n, k, s) for s in (1, 2, 3))
    parts = [quantized(fmt, rows, k, 10 + rows) for rows in (24, 8)]
    dense = np.random.default_rng(4).standard_normal((n, k)).astype(np.float32)
    rng = np.random.default_rng(m)
    x = (3 * rng.standard_normal((m, k)) + 1).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin, rin = g.add_input(x.shape, np.float32, "x"), g.add_input(res.shape, np.float32, "r")
        norm = (g.add_tensorref(gamma, "norm"), eps)
        g.set_output(ops.linear(g, xin, g.add_tensorref(wq, "w", quant=fmt), norm=norm), "y")
        g.set_output(ops.linear(g, xin, g.add_tensorref(wq, "w2", quant=fmt), residual=rin, norm=norm), "yr")
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(gq, "g", quant=fmt), g.add_tensorref(uq, "u", quant=fmt),
                                      norm=norm), "yg")
        g.set_output(ops.stacked_linear(g, xin, [g.add_tensorref(raw, f"s{i}", quant=fmt) for i, (raw, _) in enumerate(parts)],
                                        norm=norm), "ys")
        # one token at a time the norm is in the linear's dispatch; tiles of tokens (a batch) run
        # it once before. One token of a gated linear on a renderer outside GATED_GEMV_RENDERERS:
        # two linears (each normalizing) and silu_mul
        fused = m == 1
        split = int(fused and cpu_kernels and device.is_cpu and device.renderer not in ops.GATED_GEMV_RENDERERS)
        others = [d.shader for d in g.execute_nodes if d.shader != "linear_quant"]
        assert len(g.execute_nodes) - len(others) == 4 + split
        assert others == (["binary"] * split if fused else [others[0]] * 4)
        g.set_output(ops.linear(g, xin, g.add_tensorref(dense, "wf"), norm=norm), "yf")
        assert g.execute_nodes[-2].shader in ("rms_norm", "norm_rows")
        with pytest.raises(ValueError, match=r"rms_norm: weight \(95,\) does not match dimension 96"):
            ops.linear(g, xin, g.add_tensorref(wq, "w3", quant=fmt), norm=(g.add_tensorref(gamma[:95], "bad"), eps))
        g.run_prepack()
        out = g.execute({"x": x, "r": res})
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * gamma
    gated = silu(xn @ gd.T) * (xn @ ud.T)
    for key, ref in (("y", xn @ wd.T), ("yr", res + xn @ wd.T), ("ys", xn @ np.concatenate([d for _, d in parts]).T),
                     ("yf", xn @ dense.T), ("yg", gated)):
        np.testing.assert_allclose(out[key], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=key)


def test_quant_mismatch_is_named(device, compiler):
    from vkgraph.errors import PrepackMismatchError

    with ComputeGraph(device=device, compiler=compiler) as g:
        bad = g.add_tensorref(np.zeros((4, 21), np.uint8), "blk.3.ffn_up.weight", quant="q4_1")
        with pytest.raises(PrepackMismatchError, match="'blk.3.ffn_up.weight'.*21 bytes is not whole 20-byte blocks"):
            g.prepack_tensor(bad)
        plain = g.add_tensorref(np.zeros((4, 20), np.uint8), "plain")
        with pytest.raises(PrepackMismatchError, match="'plain'.*not quantized, not q4_1"):
            g.prepack_tensor(plain, "q4_1")


def test_planes_larger_than_a_binding_are_refused(device, compiler):
    """A weight in planes is read whole (the heads follow every block's quants): one packed into
    planes by hand that a binding cannot hold is refused by name, before any GPU work."""
    raw, _ = quantized("q8_0", 64, 64, 1)
    with ComputeGraph(device=device, compiler=compiler) as g:
        src = g.add_tensorref(raw, "blk.0.big", quant="q8_0")
        w = g.prepack_tensor(src, "q8_0_planes")
        g.max_binding_nbytes = 1024
        xin = g.add_input((1, 64), np.float32, "x")
        with pytest.raises(ValueError, match="blk.0.big"):
            ops.linear(g, xin, w)
        with pytest.raises(ValueError, match="blk.0.big"):
            ops.embedding(g, g.add_input((2,), np.int32, "ids"), w)


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
def test_one_token_linears_read_storage_where_that_runs_faster(device, compiler, monkeypatch, cpu_kernels):
    """CPU renderers' layout: on the renderers in GEMV_STORAGE_RENDERERS (SwiftShader) a one-token
    linear reads its weight from a storage buffer, a tile of tokens still as texels; on the
    others both as texels. The GPU layout (a row per invocation, one token or a tile of them)
    reads storage buffers only."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    raw, deq = quantized("q4_1", 40, 96, 1)
    with ComputeGraph(device=device, compiler=compiler) as g:
        w = g.add_tensorref(raw, "w", quant="q4_1")
        for m in (1, 9):
            g.set_output(ops.linear(g, g.add_input((m, 96), np.float32, f"x{m}"), w), f"y{m}")
        texel = {nd.defines["TOKENS"] > 1: nd.defines["TEXEL"] for nd in g.execute_nodes if nd.shader == "linear_quant"}
        xs = {m: np.random.default_rng(m).standard_normal((m, 96)).astype(np.float32) for m in (1, 9)}
        g.run_prepack()
        out = g.execute({f"x{m}": x for m, x in xs.items()})
    if cpu_kernels and device.is_cpu:
        assert texel == {False: int(device.renderer not in ops.GEMV_STORAGE_RENDERERS), True: 1}
    else:
        assert texel == {False: 0, True: 0}
    for m, x in xs.items():
        ref = x.astype(np.float64) @ deq.T
        assert np.abs(out[f"y{m}"] - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("reads", ["word-heads", "picked-heads", "storage"])
def test_planes_each_way_they_are_read(device, compiler, monkeypatch, fmt, m, reads):
    """Weights in planes against gguf's dequantizer, one token and a tile of several, plain and
    gated, read each way a device's texel limits may leave: quants as texels and heads through
    word views of the same buffers, heads picked out of the quants' texels (where a word view
    that long is refused), or storage buffers (where a texel buffer cannot hold the weight)."""
    if not device.is_cpu:
        pytest.skip("planes are the CPU renderers' layout")
    texel_ok = ops._texel_ok
    refuse = {"word-heads": (), "picked-heads": (4,), "storage": (4, 16)}[reads]
    monkeypatch.setattr(ops, "GEMV_STORAGE_RENDERERS", set())  # every way, on every renderer
    monkeypatch.setattr(ops, "_texel_ok", lambda g, b, n, size: size not in refuse and texel_ok(g, b, n, size))
    (raw, deq), (raw_u, deq_u) = quantized(fmt, 40, 96, m), quantized(fmt, 40, 96, m + 1)
    x = np.random.default_rng(m).standard_normal((m, 96)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        w = ops.tied_table(g, g.add_tensorref(raw, "w", quant=fmt))
        assert g.values[w].layout == f"{fmt}_planes"
        g.set_output(ops.linear(g, xin, w), "y")
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(raw, "g", quant=fmt),
                                      g.add_tensorref(raw_u, "u", quant=fmt)), "gated")
        linears = [nd for nd in g.execute_nodes if nd.shader == "linear_quant"]
        assert {bool(nd.defines["HEAD_AT"]) for nd in linears} == {reads == "word-heads"}
        assert {nd.defines["TEXEL"] for nd in linears} == {int(reads != "storage")}
        g.run_prepack()
        out = g.execute({"x": x})
    x64 = x.astype(np.float64)
    gate, up = x64 @ deq.T, x64 @ deq_u.T
    np.testing.assert_allclose(out["y"], gate, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["gated"], gate / (1 + np.exp(-gate)) * up, rtol=1e-4, atol=1e-4)


def ref_q8_pairs(x, gamma=None, eps=0.0):
    """glsl/q8_pairs.glsl's output in numpy (float32, as the shader): x [m, k] (RMS-normalized
    with ``gamma``) as int8 in blocks of 32, d = max|x| / 127; two tokens a word (token 2p's int8
    in the low 16 bits, 2p + 1's above), then each pair's blocks' (d0, d0 * sum q0, d1, d1 * sum q1)."""
    x = x.astype(np.float32)
    if gamma is not None:
        x = x * (1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + eps)).astype(np.float32) * gamma
    m, k = x.shape
    if m % 2:
        x = np.concatenate([x, np.zeros((1, k), np.float32)])
    q, d = int8_blocks(x)
    d = d[..., 0]
    words = (q[0::2] + (q[1::2] << 16)).reshape(-1)
    scales = np.stack([d[0::2], d[0::2] * q[0::2].sum(-1), d[1::2], d[1::2] * q[1::2].sum(-1)], -1).astype(np.float32)
    return np.concatenate([words, scales.reshape(-1).view(np.int32)])


@pytest.mark.parametrize("fmt,m", [("q4_0", 19), ("q4_1", 7), ("q4_1", 1), ("q8_0", 7)])
def test_int8_activations(device, compiler, fmt, m):
    """With graph.int8_activations a batch's tiles of Q4 weights (CPU renderers) multiply x as
    int8 in blocks of 32, quantized (and RMS-normalized first where the linear has a norm) by a
    q8_pairs dispatch: its words and scales as numpy's, and the linears (plain, with a residual,
    gated, stacked, normalized) as numpy's on those int8 values, a partial tile and an odd token
    among them; tiles run over rows of workgroups past the x limit (2 here). One token, Q8_0 and
    GPUs (no tiles) multiply float32."""
    from vkgraph.config import GraphConfig
    from vkgraph.ggml import int8_activations

    n, k, eps = 40, 96, 1e-5
    (wq, wd), (gq, gd), (uq, ud) = (quantized(fmt, n, k, s) for s in (1, 2, 3))
    parts = [quantized(fmt, rows, k, 10 + rows) for rows in (24, 8)]
    rng = np.random.default_rng(m)
    x = (3 * rng.standard_normal((m, k)) + 1).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    cfg = GraphConfig().replace(graph__int8_activations=True, execute__memory_planning=False)  # keep x's int8 forms
    with ComputeGraph(cfg, device=device, compiler=compiler) as g:
        g.max_groups_x = 2
        xin, rin = g.add_input(x.shape, np.float32, "x"), g.add_input(res.shape, np.float32, "r")
        norm = (g.add_tensorref(gamma, "norm"), eps)
        g.set_output(ops.linear(g, xin, g.add_tensorref(wq, "w", quant=fmt)), "y")
        g.set_output(ops.linear(g, xin, g.add_tensorref(wq, "w2", quant=fmt), residual=rin, norm=norm), "yr")
        g.set_output(ops.gated_linear(g, xin, g.add_tensorref(gq, "g", quant=fmt), g.add_tensorref(uq, "u", quant=fmt)), "yg")
        g.set_output(ops.stacked_linear(g, xin, [g.add_tensorref(raw, f"s{i}", quant=fmt) for i, (raw, _) in enumerate(parts)],
                                        norm=norm), "ys")
        int8 = device.is_cpu and m > 1 and fmt != "q8_0"
        linears = [nd for nd in g.execute_nodes if nd.shader == "linear_quant"]
        quantizes = [nd for nd in g.execute_nodes if nd.shader == "q8_pairs"]
        split = int(m == 1 and device.is_cpu and device.renderer not in ops.GATED_GEMV_RENDERERS)  # gated: two
        assert len(linears) == 4 + split and {nd.defines["Q8X"] for nd in linears} == {int(int8)}
        assert [nd.defines["NORM"] for nd in quantizes] == ([0, 1, 0, 1] if int8 else [])
        if int8:
            assert {nd.defines["TOKENS"] for nd in linears} == {min(m, ops.LINEAR_TOKENS_INT8)}
        g.run_prepack()
        out = g.execute({"x": x, "r": res})
        for nd, gm in zip(quantizes, [None, gamma, None, gamma]):  # the int8 words exactly, the scales to rounding
            got, want, words = g.read_tensor(nd.args[0]).view(np.int32), ref_q8_pairs(x, gm, eps), (m + 1) // 2 * k
            np.testing.assert_array_equal(got[:words], want[:words])
            np.testing.assert_allclose(got[words:].view(np.float32), want[words:].view(np.float32), rtol=1e-6)
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * gamma
    if int8:
        x64, xn = (int8_activations(v).astype(np.float64) for v in (x64, xn))
    refs = {"y": x64 @ wd.T, "yr": res + xn @ wd.T, "yg": silu(x64 @ gd.T) * (x64 @ ud.T),
            "ys": xn @ np.concatenate([d for _, d in parts]).T}
    for key, ref in refs.items():
        np.testing.assert_allclose(out[key], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=key)
