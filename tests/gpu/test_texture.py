"""Texture storage (RGBA32F 3-D images): the standard packer's layouts (width-, height- and
channels-packed), conv2d on textures, and conversions between textures and buffers."""

import numpy as np
import pytest

from vkgraph import ops
from vkgraph.config import GraphConfig
from vkgraph.graph import ComputeGraph

from .test_ops import conv2d_reference


def texels_reference(x, layout):
    """The texels (z, y, x, rgba) ET-VK's layouts give an NCHW array (leading dims padded with 1)."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    n, c, h, w = x4.shape
    if layout == "channels_packed":
        c4 = -(-c // 4)
        t = np.zeros((n, c4 * 4, h, w), np.float32)
        t[:, :c] = x4
        return t.reshape(n, c4, 4, h, w).transpose(0, 1, 3, 4, 2).reshape(n * c4, h, w, 4)
    if layout == "height_packed":
        h4 = -(-h // 4)
        t = np.zeros((n, c, h4 * 4, w), np.float32)
        t[:, :, :h] = x4
        return t.reshape(n * c, h4, 4, w).transpose(0, 1, 3, 2)
    w4 = -(-w // 4)
    t = np.zeros((n, c, h, w4 * 4), np.float32)
    t[..., :w] = x4
    return t.reshape(n * c, h, w4, 4)


SHAPES = [(7,), (3, 5), (2, 6, 9), (2, 5, 3, 7), (1, 4, 2, 8)]
LAYOUTS = ["channels_packed", "width_packed", "height_packed"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_standard_packer_layouts(device, compiler, layout, shape):
    x = np.random.default_rng(len(shape) * 10 + sum(shape)).standard_normal(shape).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        t = g.prepack_tensor(g.add_tensorref(x, "w"), f"texture3d_{layout}")
        assert g.values[t].storage == "texture3d" and g.values[t].image is None  # bound lazily
        g.set_output(ops.relu(g, t), "relu")  # a buffer-only op reads the texture after a conversion
        g.set_output(t, "back")
        report = g.run_prepack()
        assert report.packing_dispatches == 1
        expect = texels_reference(x, layout)
        np.testing.assert_array_equal(g.read_tensor(t).view(np.float32).reshape(expect.shape), expect)
        out = g.execute()
    np.testing.assert_array_equal(out["back"], x)
    np.testing.assert_array_equal(out["relu"], np.maximum(x, 0))


@pytest.mark.parametrize("n,cin,h,w,cout,k,stride,padding,dilation,groups,bias", [
    (2, 3, 9, 7, 5, 3, 2, 1, 1, 1, True), (1, 4, 8, 8, 6, 3, 1, 2, 2, 2, True), (1, 6, 7, 7, 6, 3, 1, 1, 1, 6, False),
    (1, 8, 4, 6, 16, 1, 1, 0, 1, 1, True)])
def test_conv2d_on_textures(device, compiler, n, cin, h, w, cout, k, stride, padding, dilation, groups, bias):
    rng = np.random.default_rng(n + cin + cout + groups)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    cfg = GraphConfig().replace(graph__storage="texture3d")
    with ComputeGraph(cfg, device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        y = ops.conv2d(g, xin, g.add_tensorref(wt, "w"), g.add_tensorref(b, "b") if bias else None,
                       stride=stride, padding=padding, dilation=dilation, groups=groups)
        assert g.values[y].storage == "texture3d" and g.values[y].layout == "channels_packed"
        y2 = ops.conv2d(g, y, g.add_tensorref(np.eye(cout, dtype=np.float32)[:, :, None, None], "id"))  # texture in
        g.set_output(y, "y")
        g.set_output(y2, "y2")
        g.run_prepack()
        out = g.execute({"x": x})
        assert any(node.shader == "conv2d_texture" for node in g.execute_nodes)
    expect = conv2d_reference(x, wt, b, (stride,) * 2, (padding,) * 2, (dilation,) * 2, groups)
    np.testing.assert_allclose(out["y"], expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["y2"], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_runtime_to_texture_and_back(device, compiler, layout):
    x = np.random.default_rng(5).standard_normal((2, 5, 3, 6)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        t = ops.to_texture(g, xin, layout)
        other = ops.to_texture(g, t, LAYOUTS[(LAYOUTS.index(layout) + 1) % 3])
        g.set_output(ops.mul(g, other, g.add_tensorref(np.full(6, 2, np.float32), "two")), "y")
        g.run_prepack()
        y = g.execute({"x": x})["y"]
    np.testing.assert_array_equal(y, 2 * x)


def test_texture_extent_limit_is_clear(device, compiler):
    from vkgraph.errors import UnsupportedFeatureError

    most = device.limits["maxImageDimension3D"]
    with ComputeGraph(device=device, compiler=compiler) as g:
        ref = g.add_tensorref(np.ones((1, 4, 1, most + 1), np.float32), "too.wide")
        with pytest.raises(UnsupportedFeatureError, match=f"'too.wide:texture3d_channels_packed'.*at most {most}"):
            g.prepack_tensor(ref, "texture3d_channels_packed")
        assert not g.prepack_nodes


ELEMENTWISE = [  # (name, input shapes, build(g, inputs, layout), numpy reference)
    ("sigmoid", [(2, 5, 3, 7)], lambda g, x, lay: ops.unary(g, x[0], "sigmoid", layout=lay),
     lambda a: 1 / (1 + np.exp(-a))),
    ("clamp", [(3, 6, 5)], lambda g, x, lay: ops.unary(g, x[0], "clamp", -0.4, 0.9, layout=lay),
     lambda a: np.clip(a, -0.4, 0.9)),
    ("gt", [(9, 6)], lambda g, x, lay: ops.unary(g, x[0], "gt", 0.2, layout=lay), lambda a: (a > 0.2)),
    ("sub_alpha", [(2, 3, 1, 5), (4, 1)], lambda g, x, lay: ops.binary(g, x[0], x[1], "sub", 1.5, layout=lay),
     lambda a, b: a - 1.5 * b),
    ("mul_row", [(5, 1, 6), (7, 6)], lambda g, x, lay: ops.binary(g, x[0], x[1], "mul", layout=lay), np.multiply),
    ("div_same", [(3, 5, 6)] * 2, lambda g, x, lay: ops.binary(g, x[0], x[1], "div", layout=lay), np.divide),
    ("where", [(2, 1, 7), (3, 7), (2, 3, 1)],
     lambda g, x, lay: ops.where(g, ops.unary(g, x[0], "gt", 0.0), x[1], x[2], layout=lay),
     lambda c, a, b: np.where(c > 0, a, b)),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,shapes,build,ref", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_ops_on_textures(device, compiler, layout, name, shapes, build, ref):
    """glsl/elementwise_texture.glsl: each input a texture in another layout than the output's
    (read a component at a time, broadcast), or the same (a texel at a time); the output's
    texels are the reference's, padding zero."""
    rng = np.random.default_rng(len(name) + LAYOUTS.index(layout))
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if name == "div_same":
        xs[1] = np.abs(xs[1]) + 0.5
    with ComputeGraph(device=device, compiler=compiler) as g:
        ins = [g.add_input(x.shape, np.float32, f"x{k}") for k, x in enumerate(xs)]
        texs = [ops.to_texture(g, r, layout if k == 0 else LAYOUTS[(LAYOUTS.index(layout) + k) % 3])
                for k, r in enumerate(ins)]
        y = build(g, texs, layout)
        assert g.values[y].storage == "texture3d" and g.values[y].layout == layout
        g.set_output(y, "y")
        g.run_prepack()
        out = g.execute({f"x{k}": x for k, x in enumerate(xs)})["y"]
        expect = ref(*xs).astype(np.float32)
        texels = texels_reference(expect, layout)
        np.testing.assert_allclose(g.read_tensor(y).view(np.float32).reshape(texels.shape), texels, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(out, expect, rtol=2e-6, atol=1e-6)
    assert any(n.shader == "elementwise_texture" for n in g.execute_nodes)


def test_elementwise_texture_packs_a_constant_operand(device, compiler):
    """A constant read by an op on textures is packed into the output's layout by the standard
    packer (a prepack node), once however many ops read it."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xt = ops.to_texture(g, g.add_input(x.shape, np.float32, "x"), "width_packed")
        c = g.add_tensorref(w, "w")
        y = ops.binary(g, ops.binary(g, xt, c, "add", layout="width_packed"), c, "mul", layout="width_packed")
        g.set_output(y, "y")
        report = g.run_prepack()
        assert [n.packer.name for n in g.prepack_nodes] == ["texture3d_width_packed"] and report.packing_dispatches == 1
        out = g.execute({"x": x})["y"]
    np.testing.assert_allclose(out, (x + w) * w, rtol=1e-6, atol=1e-6)


GATHERS = [  # (name, input shape, output shape, strides, base) over the input's contiguous elements
    ("reshape", (2, 3, 10), (6, 5, 2), (10, 2, 1), 0),
    ("permute", (2, 3, 5), (5, 2, 3), (1, 15, 5), 0),
    ("slice_step", (4, 9), (4, 3), (9, 3), 1),
    ("select", (3, 4, 6), (3, 6), (24, 1), 12),
    ("expand", (3, 1, 5), (2, 3, 4, 5), (0, 5, 0, 1), 0),
    ("flip", (3, 7), (3, 7), (7, -1), 6),
]


@pytest.mark.parametrize("source", ["buffer", "texture"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,shape,out_shape,strides,base", GATHERS, ids=[c[0] for c in GATHERS])
def test_gather_into_textures(device, compiler, layout, source, name, shape, out_shape, strides, base):
    """glsl/gather_texture.glsl: reshapes, permutes, slices, selects, expands and flips into a
    texture, from a buffer or from a texture in another layout."""
    x = np.random.default_rng(len(name) + len(shape)).standard_normal(shape).astype(np.float32)
    index = base + sum(np.arange(n).reshape([-1 if d == k else 1 for d in range(len(out_shape))]) * s
                       for k, (n, s) in enumerate(zip(out_shape, strides)))
    expect = x.reshape(-1)[index]
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        if source == "texture":
            xin = ops.to_texture(g, xin, LAYOUTS[(LAYOUTS.index(layout) + 1) % 3])
        y = ops.gather(g, xin, out_shape, strides, base, layout=layout)
        g.set_output(y, "y")
        g.run_prepack()
        out = g.execute({"x": x})["y"]
        texels = texels_reference(expect, layout)
        np.testing.assert_array_equal(g.read_tensor(y).view(np.float32).reshape(texels.shape), texels)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 9), (2, 2, 3, 4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_on_width_packed_textures(device, compiler, shape, with_bias):
    """glsl/linear_texture.glsl: x [..., K] (a width-packed texture, or a buffer converted) times
    4x4-packed fp32 weights into a width-packed texture [..., N]."""
    rng = np.random.default_rng(sum(shape) + with_bias)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((6, shape[-1])).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        bias = g.add_tensorref(b, "b") if with_bias else None
        y1 = ops.linear(g, ops.to_texture(g, xin, "width_packed"), g.add_tensorref(w, "w"), bias, layout="width_packed")
        y2 = ops.linear(g, xin, g.add_tensorref(w, "w2"), bias, layout="width_packed")
        assert g.values[y1].storage == g.values[y2].storage == "texture3d"
        g.set_output(y1, "y1")
        g.set_output(y2, "y2")
        g.run_prepack()
        out = g.execute({"x": x})
    expect = x @ w.T + (b if with_bias else 0)
    np.testing.assert_allclose(out["y1"], expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["y2"], expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape,source", [((5, 7), "width_packed"), ((2, 3, 10), "channels_packed"), ((2, 2, 3, 9), "buffer")])
def test_row_ops_on_width_packed_textures(device, compiler, kind, shape, source):
    """glsl/rows_texture.glsl: a row per invocation over the last dim, padding left out of the
    reductions (a width not a multiple of 4) and written as zeros."""
    rng = np.random.default_rng(len(kind) + len(shape))
    x = (rng.standard_normal(shape) * 3 - 1).astype(np.float32)
    w, b = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        if source != "buffer":
            xin = ops.to_texture(g, xin, source)
        if kind in ("softmax", "log_softmax"):
            y = ops.softmax(g, xin, log=kind == "log_softmax", layout="width_packed")
        elif kind == "layer_norm":
            y = ops.layer_norm(g, xin, g.add_tensorref(w, "w"), g.add_tensorref(b, "b"), 1e-5, layout="width_packed")
        else:
            y = ops.rms_norm(g, xin, g.add_tensorref(w, "w"), 1e-6, layout="width_packed")
        g.set_output(y, "y")
        g.run_prepack()
        out = g.execute({"x": x})["y"]
        texels = g.read_tensor(y).view(np.float32).reshape(texels_reference(x, "width_packed").shape)
    x64 = x.astype(np.float64)
    if kind in ("softmax", "log_softmax"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        expect = e / e.sum(-1, keepdims=True)
        expect = np.log(expect) if kind == "log_softmax" else expect
    elif kind == "layer_norm":
        expect = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w + b
    else:
        expect = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out, expect, rtol=2e-5, atol=2e-5)
    if shape[-1] % 4:
        assert not texels[..., -1, shape[-1] % 4:].any()  # padding written as zeros


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 6)), ((3, 4, 9), (3, 9, 5)), ((2, 3, 4, 6), (1, 1, 6, 7)), ((1, 4, 5), (2, 5, 3))])
def test_matmul_on_width_packed_textures(device, compiler, sa, sb):
    """glsl/matmul_texture.glsl: batched a @ b, an operand with one batch broadcast, b a runtime
    texture in another layout or a constant packed width-packed."""
    rng = np.random.default_rng(sum(sa) + sum(sb))
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        ain = ops.to_texture(g, g.add_input(a.shape, np.float32, "a"), "width_packed")
        bin_ = ops.to_texture(g, g.add_input(b.shape, np.float32, "b"), "height_packed")
        g.set_output(ops.matmul(g, ain, bin_, layout="width_packed"), "y")
        g.set_output(ops.matmul(g, ain, g.add_tensorref(b, "bc"), layout="width_packed"), "yc")
        g.run_prepack()
        out = g.execute({"a": a, "b": b})
    np.testing.assert_allclose(out["y"], a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["yc"], a @ b, rtol=1e-5, atol=1e-5)


def test_an_entry_point_may_run_first_on_textures_another_made(device, compiler):
    """Entry point ``twice`` reads a texture that the default entry point writes; run first, it
    finds the image in its layout: the warm-up moved every image there before any execute."""
    x = np.random.default_rng(6).standard_normal((1, 4, 3, 8)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        t = ops.to_texture(g, g.add_input(x.shape, np.float32, "x"), "channels_packed")
        g.set_output(ops.mul(g, t, g.add_tensorref(np.full(8, 3, np.float32), "three")), "y")
        with g.entry("twice"):
            g.set_output(ops.add(g, t, t), "y2")
        g.run_prepack()
        assert g.execute({}, entry="twice")["y2"].shape == x.shape  # t not written yet: any values
        np.testing.assert_array_equal(g.execute({"x": x})["y"], 3 * x)
        np.testing.assert_array_equal(g.execute({}, entry="twice")["y2"], 2 * x)
