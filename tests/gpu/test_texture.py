"""Texture storage (RGBA32F 3-D images): the standard packer's layouts, conv2d on textures, and
conversions between textures and buffers."""

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
    w4 = -(-w // 4)
    t = np.zeros((n, c, h, w4 * 4), np.float32)
    t[..., :w] = x4
    return t.reshape(n * c, h, w4, 4)


SHAPES = [(7,), (3, 5), (2, 6, 9), (2, 5, 3, 7), (1, 4, 2, 8)]


@pytest.mark.parametrize("layout", ["channels_packed", "width_packed"])
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


@pytest.mark.parametrize("layout", ["channels_packed", "width_packed"])
def test_runtime_to_texture_and_back(device, compiler, layout):
    x = np.random.default_rng(5).standard_normal((2, 5, 3, 6)).astype(np.float32)
    with ComputeGraph(device=device, compiler=compiler) as g:
        xin = g.add_input(x.shape, np.float32, "x")
        t = ops.to_texture(g, xin, layout)
        other = ops.to_texture(g, t, "width_packed" if layout == "channels_packed" else "channels_packed")
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
