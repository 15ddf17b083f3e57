import numpy as np
import pytest

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.errors import VkGraphError
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


CPU_KERNELS = pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "gpu-kernels"])


#: graph.fp32_linear_layout: 4x4 blocks, or on CPU renderers rows as stored (the tiled kernel's W_ROWS)
LAYOUTS = pytest.mark.parametrize("layout", ["blocks", "rows"])


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 5), (3, 64, 33), (5, 130, 67), (20, 96, 70), (20, 96, 72)])
@pytest.mark.parametrize("with_bias", [False, True])
@CPU_KERNELS
@LAYOUTS
def test_linear(device, compiler, monkeypatch, m, k, n, with_bias, cpu_kernels, layout):
    """Both fp32 kernels (on CPU renderers, K a multiple of 4: tiles of rows x tokens; else a
    block of 4 outputs per invocation) against numpy; 20 tokens end in a partial token tile.
    The tiled kernel runs on every CPU renderer here, whichever the policy gives it to, on the
    weight in 4x4 blocks or, with layout "rows", as it is: copied, not packed."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    monkeypatch.setattr(ops, "TILED_LINEAR_RENDERERS", {device.renderer})
    rng = rng_for(m, k, n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    packers = []

    def build(g, r):
        bias = g.add_tensorref(b, "b") if with_bias else None
        y = ops.linear(g, r["x"], g.add_tensorref(w, "w"), bias)
        packers.append(g.prepack_nodes[0].packer.name)
        return y

    out, _ = run(device, compiler, build, {"x": x}, graph__fp32_linear_layout=layout)
    rows = layout == "rows" and cpu_kernels and device.is_cpu and k % 4 == 0
    assert packers == ["identity" if rows else "linear_4x4"]
    expect = x @ w.T + (b if with_bias else 0)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu"])
@CPU_KERNELS
@LAYOUTS
def test_linear_activation_and_residual(device, compiler, monkeypatch, act, cpu_kernels, layout):
    """act(x @ w.T + b) + residual: fused into the tiled kernel, separate dispatches elsewhere."""
    from vkgraph.models.minilm import erf

    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    monkeypatch.setattr(ops, "TILED_LINEAR_RENDERERS", {device.renderer})
    rng = rng_for(9, 32, 36, len(act))
    x, w = rng.standard_normal((9, 32)).astype(np.float32), rng.standard_normal((36, 32)).astype(np.float32)
    b, res = rng.standard_normal(36).astype(np.float32), rng.standard_normal((9, 36)).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.linear(g, r["x"], g.add_tensorref(w, "w"), g.add_tensorref(b, "b"),
                                                           residual=r["res"], act=act), {"x": x, "res": res},
                 graph__fp32_linear_layout=layout)
    v = x.astype(np.float64) @ w.T + b
    f = {"gelu": 0.5 * v * (1 + erf(v / np.sqrt(2))),
         "gelu_tanh": 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))),
         "silu": v / (1 + np.exp(-v))}[act]
    np.testing.assert_allclose(out, f + res, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 129)])
@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
@pytest.mark.parametrize("row_broadcast", [False, True])
def test_binary(device, compiler, shape, op, fn, row_broadcast):
    rng = rng_for(*shape, len(op))
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape[-1:] if row_broadcast else shape).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: getattr(ops, op)(g, r["a"], r["b"]), {"a": a, "b": b})
    np.testing.assert_allclose(out, fn(a, b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 6, 4096])  # one float, a multiple of 4 minus the vec4 path, vec4s
@pytest.mark.parametrize("op,fn", [("add", np.add), ("div", np.divide), ("minimum", np.minimum),
                                   ("silu_mul", lambda a, b: a / (1 + np.exp(-a)) * b), ("gt", np.greater)])
def test_binary_same_shape(device, compiler, n, op, fn):
    """Operands of one shape take the flat path (vec4 per invocation where n allows and the op
    has a vec4 form)."""
    rng = rng_for(n, len(op))
    a = (rng.standard_normal((2, n)) * 3).astype(np.float32)
    b = (rng.standard_normal((2, n)) + 0.5).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.binary(g, r["a"], r["b"], op), {"a": a, "b": b})
    np.testing.assert_allclose(out, fn(a, b).astype(np.float32), rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("m,d", [(1, 1), (3, 5), (4, 64), (2, 1000), (19, 576)])
@CPU_KERNELS
def test_rms_norm(device, compiler, monkeypatch, m, d, cpu_kernels):
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rng = rng_for(m, d)
    x = rng.standard_normal((m, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.rms_norm(g, r["x"], g.add_tensorref(w, "w"), 1e-5), {"x": x})
    expect = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [None, "width_packed"])
def test_embedding(device, compiler, layout):
    """Into a buffer [T, D], or a width-packed texture [1, T, D] (D = 7: a padded texel)."""
    rng = rng_for(50, 7)
    table = rng.standard_normal((50, 7)).astype(np.float32)
    ids = np.array([3, 0, 49, 3, -1, 50, 17], np.int32)
    out, _ = run(device, compiler, lambda g, r: ops.embedding(g, r["ids"], g.add_tensorref(table, "emb"), layout,
                                                               (1, 7, 7) if layout else None), {"ids": ids})
    expect = np.where(((ids >= 0) & (ids < 50))[:, None], table[np.clip(ids, 0, 49)], 0)
    np.testing.assert_array_equal(out, expect.reshape(out.shape))


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


@pytest.mark.parametrize("planning", [True, False])
def test_intermediates_share_memory(device, compiler, planning):
    """Planned (execute.memory_planning), a chain's intermediates take the memory of those whose
    readers ran: the same answers as with memory of their own, every run, both entry points."""
    rng = rng_for(13, planning)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    c = rng.standard_normal(64).astype(np.float32)
    cfg = GraphConfig().replace(execute__memory_planning=planning, execute__initial_threshold_node_count=3,
                                execute__threshold_node_count=4)
    with ComputeGraph(cfg, device=device, compiler=compiler) as g:
        def chain(h, xin, n):
            steps = []
            for i in range(n):
                h = ops.add(g, ops.mul(g, h, g.add_tensorref(c * (i + 1), f"c{len(g.values)}")), xin)
                steps.append(h)
            return h, steps

        xr = g.add_input(x.shape, x.dtype, "x")
        out, steps = chain(xr, xr, 6)
        g.set_output(out, "out")
        with g.entry("twice"):
            xt = g.add_input(x.shape, x.dtype, "xt")
            g.set_output(chain(xt, xt, 3)[0], "out2")
        g.run_prepack()
        for trial in range(3):
            xi, e = x * (trial + 1), x * (trial + 1)
            for i in range(6):
                e = e * (c * (i + 1)) + xi
            np.testing.assert_allclose(g.execute({"x": xi})["out"], e, rtol=1e-5, atol=1e-5)
            e2 = xi
            for i in range(3):
                e2 = e2 * (c * (i + 1)) + xi
            np.testing.assert_allclose(g.execute({"xt": xi}, entry="twice")["out2"], e2, rtol=1e-5, atol=1e-5)
        places = {(g.values[h].buffer.memory, getattr(g.values[h].buffer, "offset", 0)) for h in steps[:-1]}
        assert len(places) < 5 if planning else len(places) == 5


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


def _erf(x):
    from math import erf

    return np.vectorize(erf)(x)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(device, compiler, approximate):
    a = (rng_for(333).standard_normal((3, 111)) * 4).astype(np.float32)
    a[0, :3] = [30.0, -30.0, 0.0]
    out, _ = run(device, compiler, lambda g, r: ops.gelu(g, r["a"], approximate), {"a": a})
    x = a.astype(np.float64)
    if approximate == "none":
        expect = 0.5 * x * (1 + _erf(x / np.sqrt(2)))
    else:
        expect = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("m,d", [(1, 1), (3, 7), (5, 384), (2, 1000), (19, 4)])
@CPU_KERNELS
def test_layer_norm(device, compiler, monkeypatch, m, d, cpu_kernels):
    """Both kernels (a row per invocation on CPU renderers when d is a multiple of 4, a
    workgroup per row) against numpy in float64."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rng = rng_for(m, d, 1)
    x = (rng.standard_normal((m, d)) * 3 + 5).astype(np.float32)  # a large mean tests the two-pass variance
    w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.layer_norm(g, r["x"], g.add_tensorref(w, "w"),
                                                               g.add_tensorref(b, "b"), 1e-12), {"x": x})
    x64 = x.astype(np.float64)
    mean, var = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    expect = (x64 - mean) / np.sqrt(var + 1e-12) * w + b if d > 1 else np.broadcast_to(b, (m, d))
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


def sdpa_reference(q, k, v, batch, heads, kv_heads, mask, causal, q_pos0):
    t, s = q.shape[0] // batch, k.shape[0] // batch
    dh = q.shape[1] // heads
    out = np.zeros(q.shape)
    for b in range(batch):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            qq = q[b * t:(b + 1) * t, h * dh:(h + 1) * dh].astype(np.float64)
            kk = k[b * s:(b + 1) * s, kh * dh:(kh + 1) * dh].astype(np.float64)
            vv = v[b * s:(b + 1) * s, kh * dh:(kh + 1) * dh].astype(np.float64)
            sc = qq @ kk.T / np.sqrt(dh)
            allowed = np.broadcast_to(mask[b * s:(b + 1) * s] != 0, sc.shape).copy()
            if causal:
                allowed &= np.arange(s)[None, :] <= (q_pos0 + np.arange(t))[:, None]
            sc = np.where(allowed, sc, -np.inf)
            p = np.exp(sc - sc.max(1, keepdims=True))
            out[b * t:(b + 1) * t, h * dh:(h + 1) * dh] = (p / p.sum(1, keepdims=True)) @ vv
    return out


@pytest.mark.parametrize(
    "batch,t,s,heads,kv_heads,dh,causal,q_pos0,pad",
    [(1, 5, 5, 1, 1, 8, False, 0, 0), (2, 7, 7, 12, 12, 32, False, 0, 3), (1, 9, 9, 9, 3, 64, True, 0, 0),
     (1, 1, 13, 9, 3, 64, True, 12, 0), (1, 4, 10, 4, 2, 16, True, 6, 0), (3, 3, 70, 2, 1, 5, False, 0, 1),
     (2, 6, 8, 8, 2, 16, False, 0, 2)],
)
@CPU_KERNELS
def test_sdpa(device, compiler, monkeypatch, batch, t, s, heads, kv_heads, dh, causal, q_pos0, pad, cpu_kernels):
    """Both attention kernels (on CPU renderers: a query row per invocation, one pass, a batch's
    heads that share a key/value head in one invocation; on GPUs a workgroup per row) against
    numpy."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rng = rng_for(batch, t, s, heads, kv_heads, dh, q_pos0)
    q = rng.standard_normal((batch * t, heads * dh)).astype(np.float32)
    k = rng.standard_normal((batch * s, kv_heads * dh)).astype(np.float32)
    v = rng.standard_normal((batch * s, kv_heads * dh)).astype(np.float32)
    mask = np.ones(batch * s, np.float32)
    for b in range(batch):
        mask[(b + 1) * s - pad:(b + 1) * s] = 0  # right padding per sequence
    out, _ = run(device, compiler, lambda g, r: ops.sdpa(
        g, r["q"], r["k"], r["v"], heads=heads, kv_heads=kv_heads, batch=batch, key_mask=r["mask"],
        causal=causal, q_pos0=q_pos0), {"q": q, "k": k, "v": v, "mask": mask})
    np.testing.assert_allclose(out, sdpa_reference(q, k, v, batch, heads, kv_heads, mask, causal, q_pos0),
                               rtol=1e-4, atol=1e-5)


def test_mean_pool_and_l2_normalize(device, compiler):
    rng = rng_for(3, 6, 10)
    x = rng.standard_normal((3 * 6, 10)).astype(np.float32)
    mask = (rng.random(18) > 0.3).astype(np.float32)
    mask[:6] = 0  # an all-padding sequence pools to zeros
    out, _ = run(device, compiler, lambda g, r: ops.l2_normalize(g, ops.mean_pool(g, r["x"], r["m"], 3)),
                 {"x": x, "m": mask})
    pooled = (x.reshape(3, 6, 10) * mask.reshape(3, 6, 1)).sum(1) / np.maximum(mask.reshape(3, 6).sum(1, keepdims=True), 1e-9)
    expect = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)


def rope_reference(x, pos0, heads, theta, neox):
    t, width = x.shape
    dh = width // heads
    out = x.astype(np.float64).reshape(t, heads, dh).copy()
    i = np.arange(dh // 2)
    ang = (pos0 + np.arange(t))[:, None] * theta ** (-2.0 * i / dh)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a_idx, b_idx = (i, i + dh // 2) if neox else (2 * i, 2 * i + 1)
    a, b = out[:, :, a_idx].copy(), out[:, :, b_idx].copy()
    out[:, :, a_idx], out[:, :, b_idx] = a * c - b * s, a * s + b * c
    return out.reshape(t, width)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("t,heads,dh,pos0", [(1, 1, 2, 0), (5, 3, 64, 0), (1, 9, 64, 37), (4, 2, 8, 300)])
def test_rope(device, compiler, neox, t, heads, dh, pos0):
    x = rng_for(t, heads, dh, pos0).standard_normal((t, heads * dh)).astype(np.float32)
    step = np.array([pos0, 0], np.uint32)
    table = lambda g: ops.rope_table(g, pos0 + t + 3, dh, theta=1e5)  # noqa: E731
    out, _ = run(device, compiler, lambda g, r: ops.rope(g, r["x"], r["step"], table(g), heads=heads, neox=neox),
                 {"x": x, "step": step})
    # angles in float64 on the CPU: only the float32 rounding of the table and of the products
    np.testing.assert_allclose(out, rope_reference(x, pos0, heads, 1e5, neox), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("t,heads,kv_heads,dh", [(1, 9, 3, 64), (3, 4, 2, 8), (2, 2, 2, 2)])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-layout", "gpu-layout"])
@pytest.mark.parametrize("max_groups", [0, 2], ids=["one-row", "rows-of-groups"])
def test_rope_kv_rotates_q_and_writes_the_caches(device, compiler, monkeypatch, neox, t, heads, kv_heads, dh,
                                                 cpu_kernels, max_groups):
    """rope_kv is rope(q), rope(k) into the k cache and v into the v cache at rows step[0]..:
    two executes fill rows 0..t-1 and 4..4+t-1 of 6 (rows past the end dropped); the rest of
    each cache keeps what was there. On CPU renderers qkv and the table are read as texels. An
    invocation per pair (on CPU renderers two, as vec4s, in normal mode with Dh a multiple of 4):
    past a limit of ``max_groups`` workgroups in x, on further rows."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rows = 6
    rng = rng_for(t, heads, kv_heads, dh)
    width = kv_heads * dh
    kc0, vc0 = (rng.standard_normal((rows, width)).astype(np.float32) for _ in range(2))
    feeds = [{n: rng.standard_normal((t, (heads if n == "q" else kv_heads) * dh)).astype(np.float32)
              for n in "qkv"} | {"step": np.array([pos, 0], np.uint32)} for pos in (0, 4)]
    with ComputeGraph(device=device, compiler=compiler) as g:
        g.max_groups_x = max_groups or g.max_groups_x
        kc, vc = (g.prepack_tensor(g.add_tensorref(c.copy(), name)) for c, name in ((kc0, "kc"), (vc0, "vc")))
        qkv = g.add_input((t, (heads + 2 * kv_heads) * dh), np.float32, "qkv")
        step = g.add_input((2,), np.uint32, "step")
        table = ops.rope_table(g, 8, dh, theta=1e4)
        g.set_output(ops.rope_kv(g, qkv, step, table, kc, vc, heads=heads, kv_heads=kv_heads, neox=neox), "q")
        g.set_output(kc, "kc")
        g.set_output(vc, "vc")
        assert len(g.execute_nodes) == 1
        assert set(g.execute_nodes[0].texels) == ({1, 3} if cpu_kernels and device.is_cpu else set())
        quad = cpu_kernels and device.is_cpu and not neox and dh % 4 == 0
        assert g.execute_nodes[0].defines["QUAD"] == int(quad)
        work, (x, y, _) = t * (heads + 2 * kv_heads) * dh // (4 if quad else 2), g.execute_nodes[0].groups
        assert x * y * ops.LOCAL_SIZE >= work and (y > 1) == bool(max_groups and 2 * ops.LOCAL_SIZE < work)
        g.run_prepack()
        kexp, vexp = kc0.copy(), vc0.copy()
        for f in feeds:
            out = g.execute({"qkv": np.concatenate([f["q"], f["k"], f["v"]], axis=1), "step": f["step"]})
            pos = int(f["step"][0])
            np.testing.assert_allclose(out["q"], rope_reference(f["q"], pos, heads, 1e4, neox), rtol=1e-5, atol=1e-5)
            n = min(t, rows - pos)
            kexp[pos:pos + n] = rope_reference(f["k"], pos, kv_heads, 1e4, neox)[:n]
            vexp[pos:pos + n] = f["v"][:n]
            np.testing.assert_allclose(out["kc"], kexp, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(out["vc"], vexp)


def test_rope_kv_checks_its_shapes(device, compiler):
    with ComputeGraph(device=device, compiler=compiler) as g:
        qkv = g.add_input((2, 32), np.float32, "qkv")  # 4 heads, 2 kv heads of 4
        step = g.add_input((2,), np.uint32, "step")
        table, cache = ops.rope_table(g, 4, 4), g.add_tensor((4, 8), np.float32, "c")
        with pytest.raises(ValueError, match=r"rope_kv: qkv \(2, 28\) is not \(2, \(4 \+ 2 x 2\) x 4\)"):
            ops.rope_kv(g, g.add_input((2, 28), np.float32, "short"), step, table, cache, cache, heads=4, kv_heads=2)
        with pytest.raises(ValueError, match=r"rope_kv: caches \(4, 8\) and \(4, 4\) must be \[rows, 8\]"):
            ops.rope_kv(g, qkv, step, table, cache, g.add_tensor((4, 4), np.float32), heads=4, kv_heads=2)


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "gpu-kernels"])
def test_kv_cache_attention_over_steps(device, compiler, monkeypatch, cpu_kernels):
    """Write one token's k/v per execute into a cache and attend causally with the position in
    a step buffer: the same recorded command buffers serve every step."""
    monkeypatch.setattr(ops, "CPU_KERNELS", cpu_kernels)
    rows, heads, kv_heads, dh = 16, 4, 2, 8
    rng = rng_for(rows, heads)
    qs = rng.standard_normal((6, heads * dh)).astype(np.float32)
    ks = rng.standard_normal((6, kv_heads * dh)).astype(np.float32)
    vs = rng.standard_normal((6, kv_heads * dh)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        q = g.add_input((1, heads * dh), np.float32, "q")
        k = g.add_input((1, kv_heads * dh), np.float32, "k")
        v = g.add_input((1, kv_heads * dh), np.float32, "v")
        step = g.add_input((2,), np.uint32, "step")
        kc = ops.kv_write(g, g.add_tensor((rows, kv_heads * dh), np.float32, "k_cache"), k, step)
        vc = ops.kv_write(g, g.add_tensor((rows, kv_heads * dh), np.float32, "v_cache"), v, step)
        g.set_output(ops.sdpa(g, q, kc, vc, heads=heads, kv_heads=kv_heads, causal=True, step=step), "out")
        g.run_prepack()
        for pos in range(6):
            out = g.execute({"q": qs[pos:pos + 1], "k": ks[pos:pos + 1], "v": vs[pos:pos + 1],
                             "step": np.array([pos, 0], np.uint32)})["out"]
            expect = sdpa_reference(qs[pos:pos + 1], ks[:pos + 1], vs[:pos + 1], 1, heads, kv_heads,
                                    np.ones(pos + 1, np.float32), False, 0)
            np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-5)


def test_entry_points_run_their_own_dispatches_on_shared_tensors(device, compiler):
    """Two entry points of one graph (as a decoder's step and its batched prompt): each runs only
    its own dispatches on its own inputs and returns its own outputs; a tensor one writes (a
    cache) the other reads; the profile covers the entry that ran last."""
    rows = rng_for(8, 4, 2).standard_normal((8, 4)).astype(np.float32)
    b = rng_for(4, 8, 2).standard_normal((8, 4)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        cache = g.add_tensor((8, 4), np.float32, "cache")
        a = g.add_input((1, 4), np.float32, "a")
        step = g.add_input((2,), np.uint32, "step")
        ops.kv_write(g, cache, a, step)
        g.set_output(ops.mul(g, a, a), "square")
        with g.entry("read"):
            g.set_output(ops.add(g, g.add_input((8, 4), np.float32, "b"), cache), "sum")
        assert g.entries == ["", "read"]
        g.run_prepack()
        g.encode_execute(profile=True)
        for pos in range(8):
            out = g.execute({"a": rows[pos:pos + 1], "step": np.array([pos, 0], np.uint32)})
            assert set(out) == {"square"}
            np.testing.assert_array_equal(out["square"], rows[pos:pos + 1] ** 2)
        assert {k: n for k, (_, n) in g.execute_profile().items()} == {"kv_write": 1, "binary": 1}
        out = g.execute({"b": b}, entry="read")
        assert set(out) == {"sum"}
        np.testing.assert_array_equal(out["sum"], b + rows)
        assert {k: n for k, (_, n) in g.execute_profile().items()} == {"binary": 1}
        with pytest.raises(KeyError, match="missing graph inputs: a, step"):
            g.execute({"b": b})
        with pytest.raises(KeyError, match="inputs b belong to another entry point"):
            g.execute({"a": rows[:1], "step": np.zeros(2, np.uint32), "b": b})
        with pytest.raises(KeyError, match="no entry point named 'prefill'"):
            g.execute({}, entry="prefill")


@pytest.mark.parametrize("m,d", [(1, 1), (3, 7), (2, 1000)])
def test_softmax(device, compiler, m, d):
    x = (rng_for(m, d, 9).standard_normal((m, d)) * 10).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.softmax(g, r["x"]), {"x": x})
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape_a,shape_b,transpose_b", [
    ((1, 1), (1, 1), False), ((3, 5), (5, 7), False), ((3, 5), (7, 5), True), ((2, 4, 9), (2, 9, 3), False),
    ((2, 4, 9), (2, 6, 9), True), ((17, 64), (64, 33), False)])
def test_matmul(device, compiler, shape_a, shape_b, transpose_b):
    rng = rng_for(*shape_a, *shape_b)
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.matmul(g, r["a"], r["b"], transpose_b=transpose_b), {"a": a, "b": b})
    expect = a.astype(np.float64) @ (np.swapaxes(b, -1, -2) if transpose_b else b)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_matmul_with_constant_operand(device, compiler):
    rng = rng_for(4, 6, 2)
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal((6, 2)).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.matmul(g, r["a"], g.add_tensorref(b, "b")), {"a": a})
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-6)


def conv2d_reference(x, w, b, stride, padding, dilation, groups):
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    (sy, sx), (py, px), (dy, dx) = stride, padding, dilation
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (py, py), (px, px)))
    ho = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1
    wo = (wd + 2 * px - dx * (kw - 1) - 1) // sx + 1
    out = np.zeros((n, cout, ho, wo))
    per = cout // groups
    for co in range(cout):
        c0 = (co // per) * cin_g
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, c0:c0 + cin_g, ky * dy: ky * dy + sy * (ho - 1) + 1: sy, kx * dx: kx * dx + sx * (wo - 1) + 1: sx]
                out[:, co] += np.einsum("nchw,c->nhw", patch, w[co, :, ky, kx])
    return out + (b[None, :, None, None] if b is not None else 0)


@pytest.mark.parametrize("n,cin,h,w,cout,k,stride,padding,dilation,groups,bias", [
    (1, 1, 5, 5, 1, 3, 1, 0, 1, 1, False), (2, 3, 9, 7, 5, 3, 2, 1, 1, 1, True), (1, 4, 8, 8, 6, 3, 1, 2, 2, 2, True),
    (1, 6, 7, 7, 6, 3, 1, 1, 1, 6, False), (1, 8, 4, 6, 16, 1, 1, 0, 1, 1, True), (1, 3, 11, 10, 7, (3, 5), (2, 1), (1, 2), 1, 1, False)])
def test_conv2d(device, compiler, n, cin, h, w, cout, k, stride, padding, dilation, groups, bias):
    rng = rng_for(n, cin, h, w, cout, groups)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = rng.standard_normal((cout, cin // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    out, _ = run(device, compiler, lambda g, r: ops.conv2d(
        g, r["x"], g.add_tensorref(wt, "w"), g.add_tensorref(b, "b") if bias else None,
        stride=stride, padding=padding, dilation=dilation, groups=groups), {"x": x})
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    expect = conv2d_reference(x, wt, b, pair(stride), pair(padding), pair(dilation), groups)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
@pytest.mark.parametrize("sa,sb", [((2, 1, 5), (1, 3, 5)), ((4, 1), (3,)), ((1,), (2, 3, 4, 5)), ((3, 1, 7, 1), (1, 2, 1, 6)),
                                   ((5, 6), (5, 1)), ((1, 1), (1, 1))])
def test_binary_numpy_broadcasting(device, compiler, op, fn, sa, sb):
    rng = rng_for(*sa, *sb, len(op))
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: getattr(ops, op)(g, r["a"], r["b"]), {"a": a, "b": b})
    np.testing.assert_allclose(out, fn(a, b), rtol=1e-6, atol=1e-6)


def test_binary_shapes_that_do_not_broadcast(device, compiler):
    with ComputeGraph(device=device, compiler=compiler) as g:
        a, b = g.add_input((2, 3), np.float32, "a"), g.add_input((4,), np.float32, "b")
        with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4,\) do not broadcast"):
            ops.add(g, a, b)


UNARY_REF = {
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "tanh": np.tanh, "exp": np.exp, "neg": np.negative, "abs": np.abs,
    "sqrt": lambda a: np.sqrt(np.abs(a)), "rsqrt": lambda a: 1 / np.sqrt(np.abs(a) + 0.5),
    "log": lambda a: np.log(np.abs(a) + 0.5), "logical_not": lambda a: (np.round(a) == 0).astype(np.float32),
    "sin": np.sin, "cos": np.cos, "log10": lambda a: np.log10(np.abs(a) + 0.5), "round": np.round,
    "hardswish": lambda a: a * np.clip(a + 3, 0, 6) / 6,
}


@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary_ops(device, compiler, op):
    a = rng_for(len(op), 3).standard_normal((3, 67)).astype(np.float32) * 2
    if op == "sqrt":
        a = np.abs(a)
    elif op in ("rsqrt", "log", "log10"):
        a = np.abs(a) + 0.5
    elif op == "round":
        a = np.concatenate([a, np.array([[0.5, 1.5, -2.5] * 22 + [3.5]], np.float32)])  # halves round to even
    elif op == "logical_not":
        a = np.round(a)
    ref = {"sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "log": np.log, "log10": np.log10}.get(op, UNARY_REF[op])
    out, _ = run(device, compiler, lambda g, r: ops.unary(g, r["a"], op), {"a": a})
    np.testing.assert_allclose(out, ref(a), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op,p0,p1,ref", [
    ("clamp", -0.5, 0.7, lambda a: np.clip(a, -0.5, 0.7)), ("affine", 3.0, -1.5, lambda a: a * 3 - 1.5),
    ("pow", 2.0, 0, lambda a: a ** 2), ("pow", 3.0, 0, lambda a: a ** 3), ("gt", 0.25, 0, lambda a: a > 0.25),
    ("le", -0.1, 0, lambda a: a <= -0.1), ("rsub", 2.0, 0, lambda a: 2 - a),
    ("leaky_relu", 0.1, 0, lambda a: np.where(a >= 0, a, a * 0.1)), ("hardshrink", 0.5, 0, lambda a: a * (np.abs(a) > 0.5)),
])
def test_unary_ops_with_scalars(device, compiler, op, p0, p1, ref):
    a = rng_for(7, int(p0 * 10)).standard_normal((5, 33)).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.unary(g, r["a"], op, p0, p1), {"a": a})
    np.testing.assert_allclose(out, ref(a).astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,ref", [
    ("div", np.divide), ("maximum", np.maximum), ("minimum", np.minimum), ("lt", np.less), ("eq", np.equal),
    ("logical_and", np.logical_and), ("pow", lambda a, b: np.abs(a) ** b),
    ("div_floor", lambda a, b: np.floor(a / b)), ("div_trunc", lambda a, b: np.trunc(a / b)),
])
def test_more_binary_ops(device, compiler, op, ref):
    rng = rng_for(4, len(op))
    a = np.round(rng.standard_normal((2, 3, 9)).astype(np.float32) * 2)
    b = np.round(rng.standard_normal((3, 1)).astype(np.float32) * 2) + (0.5 if op.startswith("div") else 0)
    if op == "pow":
        a = np.abs(a) + 0.5
    out, _ = run(device, compiler, lambda g, r: ops.binary(g, r["a"], r["b"], op), {"a": a, "b": b})
    np.testing.assert_allclose(out, ref(a, b).astype(np.float32), rtol=1e-5)


def test_binary_alpha_and_where(device, compiler):
    rng = rng_for(6, 10)
    a, b = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal((1, 10)).astype(np.float32)
    c = (rng.random((6, 1)) < 0.5).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.binary(g, r["a"], r["b"], "sub", 2.5), {"a": a, "b": b})
    np.testing.assert_allclose(out, a - 2.5 * b, rtol=1e-6, atol=1e-6)
    out, _ = run(device, compiler, lambda g, r: ops.where(g, r["c"], r["a"], r["b"]), {"a": a, "b": b, "c": c})
    np.testing.assert_array_equal(out, np.where(c != 0, a, b))


@pytest.mark.parametrize("layout", [None, "width_packed", "channels_packed"])
@pytest.mark.parametrize("op,ref", [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)])
@pytest.mark.parametrize("dim,count", [(0, 1), (1, 2), (2, 1)])
def test_reduce(device, compiler, op, ref, dim, count, layout):
    """Buffers, and textures: the input height-packed, the output in ``layout`` keeping the
    reduced dims as ones (keepdim)."""
    x = rng_for(3, 5, 7, dim).standard_normal((3, 5, 7)).astype(np.float32)
    axes = tuple(range(dim, dim + count))
    keep = [1 if d in axes else n for d, n in enumerate(x.shape)]
    out, _ = run(device, compiler, lambda g, r: ops.reduce(
        g, ops.to_texture(g, r["x"], "height_packed") if layout else r["x"], dim, op, count, layout,
        keep if layout else None), {"x": x})
    np.testing.assert_allclose(out, ref(x, axis=axes, keepdims=bool(layout)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reduce_takes_the_first_extreme(device, compiler, op):
    x = np.round(rng_for(4, 6, 5, len(op)).standard_normal((4, 6, 5)).astype(np.float32))  # ties
    for dim in range(3):
        out, _ = run(device, compiler, lambda g, r: ops.reduce(g, r["x"], dim, op), {"x": x})
        np.testing.assert_array_equal(out, getattr(np, op)(x, axis=dim))


def test_quantize_rounds_half_to_even_and_clamps(device, compiler):
    x = np.concatenate([rng_for(8, 40).standard_normal(40).astype(np.float32) * 3,
                        np.array([0.25, 0.75, -0.25, 100.0, -100.0], np.float32)])
    out, _ = run(device, compiler, lambda g, r: ops.unary(g, r["x"], "quantize", 2.0, 3.0, -128, 127), {"x": x})
    np.testing.assert_array_equal(out, np.clip(np.round(x * 2.0) + 3.0, -128, 127))


@pytest.mark.parametrize("interleaved,per_head,f", [(True, False, 4), (True, True, 4), (False, False, 8),
                                                    (False, False, 4)])
def test_rotary_with_angle_tensors(device, compiler, interleaved, per_head, f):
    rng = rng_for(int(interleaved), int(per_head), f)
    b, t, h, d, start = 2, 3, 2, 8, 1
    x = rng.standard_normal((b, t, h, d)).astype(np.float32)
    rows = (start + t) * (h if per_head else 1) + 1
    cos, sin = (rng.standard_normal((rows, f)).astype(np.float32) for _ in range(2))

    def build(g, r):
        step = g.prepack_tensor(g.add_tensorref(np.array([start], np.int32), "start"))
        return ops.rotary(g, r["x"], g.add_tensorref(cos, "cos"), g.add_tensorref(sin, "sin"), step, heads=h, seq=t,
                          interleaved=interleaved, per_head=per_head)

    out, _ = run(device, compiler, build, {"x": x})
    pos = start + np.arange(t)[:, None]
    row = pos * h + np.arange(h)[None] if per_head else np.broadcast_to(pos, (t, h))
    c, s_ = cos[row][None], sin[row][None]  # [1, t, h, f]
    ref = x.copy()
    if interleaved:
        xr, xi = x[..., ::2], x[..., 1::2]
        ref[..., ::2], ref[..., 1::2] = xr * c - xi * s_, xr * s_ + xi * c
    else:
        rot = np.concatenate([-x[..., f // 2:f], x[..., :f // 2]], -1)
        ref[..., :f] = x[..., :f] * c + rot * s_
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin,cout,k,stride,pad,dil,groups,out_pad", [(3, 4, 3, 2, 1, 1, 1, 1), (4, 6, 4, 2, 1, 1, 2, 0),
                                                                      (2, 3, 3, 1, 0, 2, 1, 0)])
def test_conv_transpose2d(device, compiler, cin, cout, k, stride, pad, dil, groups, out_pad):
    rng = rng_for(cin, cout, k, stride, groups)
    n, h, w = 2, 5, 4
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = rng.standard_normal((cin, cout // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ho, wo = ((s - 1) * stride - 2 * pad + dil * (k - 1) + out_pad + 1 for s in (h, w))
    out, _ = run(device, compiler, lambda g, r: ops.conv_transpose2d(
        g, r["x"], g.add_tensorref(wt, "w"), g.add_tensorref(b, "b"), (ho, wo), stride=(stride, stride),
        padding=(pad, pad), dilation=(dil, dil), groups=groups), {"x": x})
    # scatter form: every input pixel adds its kernel window into the (padded) output
    full = np.zeros((n, cout, ho + 2 * pad + stride + dil * k, wo + 2 * pad + stride + dil * k))
    cin_g, cout_g = cin // groups, cout // groups
    for iy in range(h):
        for ix in range(w):
            for ky in range(k):
                for kx in range(k):
                    oy, ox = iy * stride + ky * dil, ix * stride + kx * dil
                    for gi in range(groups):
                        xs = x[:, gi * cin_g:(gi + 1) * cin_g, iy, ix]
                        full[:, gi * cout_g:(gi + 1) * cout_g, oy, ox] += xs @ wt[gi * cin_g:(gi + 1) * cin_g, :, ky, kx]
    ref = full[:, :, pad:pad + ho, pad:pad + wo] + b[None, :, None, None]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def bilinear_reference(x, ho, wo, align, scales=None):
    n, c, h, w = x.shape

    def coords(o, size_in, size_out, scale):
        if align:
            src = o * ((size_in - 1) / (size_out - 1) if size_out > 1 else 0.0)
        else:
            src = np.maximum((o + 0.5) * (1.0 / scale if scale else size_in / size_out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(int), size_in - 1)
        return i0, np.minimum(i0 + 1, size_in - 1), src - i0

    y0, y1, ly = coords(np.arange(ho), h, ho, scales and scales[0])
    x0, x1, lx = coords(np.arange(wo), w, wo, scales and scales[1])
    top = x[:, :, y0][:, :, :, x0] * (1 - lx) + x[:, :, y0][:, :, :, x1] * lx
    bottom = x[:, :, y1][:, :, :, x0] * (1 - lx) + x[:, :, y1][:, :, :, x1] * lx
    return top * (1 - ly[:, None]) + bottom * ly[:, None]


@pytest.mark.parametrize("ho,wo,align,scales", [(8, 12, False, (2.0, 2.0)), (5, 7, True, None), (7, 9, False, None),
                                                (3, 2, False, None), (1, 1, True, None)])
def test_upsample_bilinear(device, compiler, ho, wo, align, scales):
    x = rng_for(2, 3, 4, 6).standard_normal((2, 3, 4, 6)).astype(np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.upsample_bilinear(g, r["x"], (ho, wo), align_corners=align,
                                                                      scales=scales), {"x": x})
    np.testing.assert_allclose(out, bilinear_reference(x, ho, wo, align, scales), rtol=1e-5, atol=1e-5)


def test_fill_and_negative_strides(device, compiler):
    x = rng_for(3, 7).standard_normal((3, 7)).astype(np.float32)

    def build(g, r):
        out = ops.fill(g, (5, 9), 0.5)
        ops.strided_copy(g, out, r["x"], (3, 7), (7, -1 & 0xFFFFFFFF), (9, 1), 6, 10)  # rows mirrored, inside
        return out

    out, _ = run(device, compiler, build, {"x": x})
    ref = np.full((5, 9), 0.5, np.float32)
    ref[1:4, 1:8] = x[:, ::-1]
    np.testing.assert_array_equal(out, ref)


def test_log_softmax(device, compiler):
    x = rng_for(4, 77).standard_normal((4, 77)).astype(np.float32) * 3
    out, _ = run(device, compiler, lambda g, r: ops.softmax(g, r["x"], log=True), {"x": x})
    m = x.max(1, keepdims=True)
    np.testing.assert_allclose(out, x - m - np.log(np.exp(x - m).sum(1, keepdims=True)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [None, "channels_packed"])
@pytest.mark.parametrize("max_pool", [True, False])
@pytest.mark.parametrize("k,s,p,count_pad", [((2, 2), (2, 2), (0, 0), True), ((3, 3), (2, 2), (1, 1), True),
                                             ((3, 3), (2, 2), (1, 1), False)])
def test_pool2d(device, compiler, max_pool, k, s, p, count_pad, layout):
    """Buffers, and channels-packed textures (5 channels: the second texel plane is padded)."""
    x = rng_for(2, 5, 9, 8).standard_normal((2, 5, 9, 8)).astype(np.float32)
    ho, wo = (9 + 2 * p[0] - k[0]) // s[0] + 1, (8 + 2 * p[1] - k[1]) // s[1] + 1
    out, _ = run(device, compiler, lambda g, r: ops.pool2d(g, r["x"], (ho, wo), k, s, p, max_pool=max_pool,
                                                           count_include_pad=count_pad, layout=layout), {"x": x})
    pad = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=np.nan)
    ref = np.empty((2, 5, ho, wo), np.float32)
    for i in range(ho):
        for j in range(wo):
            win = pad[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if max_pool:
                ref[:, :, i, j] = np.nanmax(win, axis=(2, 3))
            else:
                n = win[0, 0].size if count_pad else (~np.isnan(win[0, 0])).sum()
                ref[:, :, i, j] = np.nansum(win, axis=(2, 3)) / n
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_permute_strided_copy_and_views(device, compiler):
    x = rng_for(2, 3, 4, 5).standard_normal((2, 3, 4, 5)).astype(np.float32)

    def build(g, r):
        p = ops.permute(g, r["x"], [2, 0, 3, 1])  # (4, 2, 5, 3)
        v = g.add_view(p, (8, 15))
        out = g.add_tensor((8, 7), np.float32)  # columns 3..9 of every row, with stride 2 -> 6 columns + 1 copied col
        ops.strided_copy(g, out, v, (8, 6), (15, 2), (7, 1), 3, 0)
        ops.strided_copy(g, out, v, (8, 1), (15, 1), (7, 1), 0, 6)
        return out

    out, _ = run(device, compiler, build, {"x": x})
    v = x.transpose(2, 0, 3, 1).reshape(8, 15)
    np.testing.assert_array_equal(out, np.concatenate([v[:, 3:15:2], v[:, :1]], axis=1))


def test_cast(device, compiler):
    ids = rng_for(9).integers(-50, 50, (3, 9)).astype(np.int32)
    out, _ = run(device, compiler, lambda g, r: ops.unary(g, ops.cast(g, r["i"], np.float32), "affine", 0.5, 0),
                 {"i": ids})
    np.testing.assert_array_equal(out, ids * 0.5)
    out, _ = run(device, compiler, lambda g, r: ops.cast(g, r["x"], np.int32), {"x": ids.astype(np.float32) + 0.25})
    np.testing.assert_array_equal(out, ids + (ids < 0))  # toward zero


@pytest.mark.parametrize("bits,group,gn,zp,bias,high", [(4, 32, True, False, True, False), (4, 16, True, False, False, False),
                                                       (8, 64, False, False, True, False), (8, 16, False, True, False, False),
                                                       (4, 64, False, False, False, True)])
@pytest.mark.parametrize("layout", [None, "width_packed"])
def test_linear_qw(device, compiler, bits, group, gn, zp, bias, high, layout):
    """Buffers, and width-packed textures (x [1, M, K]; N = 10: the last texel of a row padded)."""
    rng = rng_for(bits, group, int(zp))
    m, n, k = 3, 10, 64
    x = rng.standard_normal((1, m, k) if layout else (m, k)).astype(np.float32)
    q = rng.integers(-8, 8, (n, k)) if bits == 4 else rng.integers(-128, 128, (n, k))
    scales = rng.random((n, k // group)).astype(np.float32) + 0.1
    zeros = rng.integers(-3, 4, scales.shape).astype(np.float32) if zp else np.zeros_like(scales)
    b = rng.standard_normal(n).astype(np.float32)
    if bits == 4:  # ET-VK's q4gsw bytes: k even in the low nibble (qcs4w: in the high one), offset 8
        u = (q + 8).astype(np.uint8)
        even, odd = (u[:, 1::2], u[:, ::2]) if high else (u[:, ::2], u[:, 1::2])
        packed = (even | (odd << 4)).astype(np.uint8)
    else:
        packed = q.astype(np.int8)
    s_dev = scales.T.copy() if gn else scales

    def build(g, r):
        return ops.linear_qw(g, r["x"], g.add_tensorref(packed, "w"), g.add_tensorref(s_dev, "s"), bits=bits,
                             group_size=group, scales_gn=gn, zero_points=g.add_tensorref(zeros, "z") if zp else None,
                             bias=g.add_tensorref(b, "b") if bias else None, high_first=high, layout=layout)

    out, _ = run(device, compiler, build, {"x": x})
    x, out = x.reshape(m, k), out.reshape(m, n)
    gidx = np.arange(k) // group
    w = (q - zeros[:, gidx]) * scales[:, gidx]
    np.testing.assert_allclose(out, x @ w.T + (b if bias else 0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bits,group,zp,high", [(4, 16, False, False), (4, 32, True, True), (8, 8, True, False)])
def test_embedding_qw(device, compiler, bits, group, zp, high):
    """Rows of a table quantized in groups (ET-VK's embedding_q4gsw, ExecuTorch's embedding_4bit)
    against numpy; ids outside the table give zero rows."""
    rng = rng_for(bits, group, int(zp), int(high))
    v, d = 11, 64
    q = rng.integers(-8, 8, (v, d)) if bits == 4 else rng.integers(-128, 128, (v, d))
    scales = rng.random((v, d // group)).astype(np.float32) + 0.1
    zeros = rng.integers(-3, 4, scales.shape).astype(np.float32) if zp else np.zeros_like(scales)
    if bits == 4:
        u = (q + 8).astype(np.uint8)
        even, odd = (u[:, 1::2], u[:, ::2]) if high else (u[:, ::2], u[:, 1::2])
        packed = (even | (odd << 4)).astype(np.uint8)
    else:
        packed = q.astype(np.int8)
    ids = np.array([3, 0, 10, -1, 11, 3, 7], np.int32)

    def build(g, r):
        return ops.embedding_qw(g, r["ids"], g.add_tensorref(packed, "w"), g.add_tensorref(scales, "s"), bits=bits,
                                group_size=group, zero_points=g.add_tensorref(zeros, "z") if zp else None,
                                high_first=high)

    out, _ = run(device, compiler, build, {"ids": ids})
    gidx = np.arange(d) // group
    table = (q - zeros[:, gidx]) * scales[:, gidx]
    expect = np.where(((ids >= 0) & (ids < v))[:, None], table[np.clip(ids, 0, v - 1)], 0)
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-6)


def test_execute_profile_times_every_dispatch(device, compiler):
    x = rng_for(8, 33).standard_normal((8, 33)).astype(np.float32)
    with ComputeGraph(GraphConfig(), device=device, compiler=compiler) as g:
        r = g.add_input(x.shape, x.dtype, "x")
        y = ops.unary(g, ops.binary(g, ops.unary(g, r, "exp"), r, "mul"), "tanh")
        g.set_output(ops.softmax(g, y), "out")
        g.run_prepack()
        g.encode_execute(profile=True)
        with pytest.raises(VkGraphError, match="no execute has completed yet"):
            g.execute_profile()  # the timestamps were never written: never wait for them
        out = g.execute({"x": x})["out"]
        prof = g.execute_profile()
    e = np.tanh(np.exp(x) * x)
    np.testing.assert_allclose(out, np.exp(e) / np.exp(e).sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert {k: n for k, (_, n) in prof.items()} == {"unary": 2, "binary": 1, "softmax": 1}
    assert all(sec >= 0 for sec, _ in prof.values()) and sum(sec for sec, _ in prof.values()) > 0


def test_affine_by_infinity_divides_by_zero(device, compiler):
    """div.Scalar by 0 lowers to x * inf (pte/lower.py): inf, -inf and nan, as torch's x / 0."""
    x = np.array([[1.5, -2.0, 0.0, 3.0]], np.float32)
    out, _ = run(device, compiler, lambda g, r: ops.unary(g, r["x"], "affine", float("inf"), 0.0), {"x": x})
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, x * np.float32(np.inf))
