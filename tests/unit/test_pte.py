"""The .pte readers and the op table, without a device: exported fixtures read back, and bad
files get a PteFormatError naming the file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from vkgraph.errors import PteFormatError, UnsupportedOpError
from vkgraph.pte import list_ops, load_program
from vkgraph.pte import kernels
from vkgraph.pte.reader import PteFile

PROGRAMS = Path(__file__).resolve().parents[1] / "data" / "programs"
FP32 = ["mlp", "encoder", "convnet", "elementwise", "tiny_llama"]
QUANT = ["quant_mlp", "q4w_mlp", "q8w_mlp", "int8wo_mlp"]


def unsupported_program(tmp_path) -> Path:
    """mlp.pte with its relu renamed to an op no one implements (same length: the flatbuffer stays valid)."""
    raw = (PROGRAMS / "mlp.pte").read_bytes()
    assert raw.count(b"aten.relu.default") == 1
    p = tmp_path / "unsupported.pte"
    p.write_bytes(raw.replace(b"aten.relu.default", b"aten.relx.default"))
    return p


def test_fixtures_are_small():
    assert sum(p.stat().st_size for p in PROGRAMS.iterdir()) < 5 * 2**20


def test_mlp_program_reads_back():
    with PteFile(PROGRAMS / "mlp.pte") as f:
        plan = f.plan("forward")
        assert [plan.values[i].value.sizes for i in plan.inputs] == [(4, 32)]
        assert [plan.values[i].value.sizes for i in plan.outputs] == [(4, 10), (4, 10)]
        assert [i.kind for i in plan.instructions] == ["delegate"]
        g = f.vkgraph(plan.delegates[0])
        names = [op.name for op in g.chain]
        assert names.count("aten.linear.default") == 4 and "aten.native_layer_norm.default" in names
        # the first linear's weight is fc1.weight [64, 32]: its bytes are a region of the file
        linear = next(op for op in g.chain if op.name == "aten.linear.default")
        w = g.values[linear.args[1]].value
        assert w.dims == (64, 32) and w.dtype == np.float32 and w.constant_id >= 0
        off, n = g.constants[w.constant_id]
        assert n == 64 * 32 * 4 and off + n <= f.nbytes
        arr = f.array(off, n, np.float32, w.dims)
        assert np.isfinite(arr).all() and arr.std() > 0  # real weights, not zeros


def test_programs_with_cpu_kernels_between_delegates():
    with PteFile(PROGRAMS / "convnet.pte") as f:
        plan = f.plan()
        assert [i.kind for i in plan.instructions] == ["delegate", "kernel", "delegate"]
        assert plan.operators == ["aten::mean.out"]


def test_list_ops_marks_what_is_supported(tmp_path):
    by_name = {u.name: u.supported for u in list_ops(unsupported_program(tmp_path))}
    assert by_name["aten.relx.default"] is False and by_name["aten.linear.default"] is True
    assert all(u.supported for name in FP32 + QUANT for u in list_ops(PROGRAMS / f"{name}.pte"))
    kernels = [u for u in list_ops(PROGRAMS / "int8wo_mlp.pte") if u.where == "kernel"]
    assert {u.name for u in kernels} == {"aten::permute_copy.out", "dim_order_ops::_to_dim_order_copy.out"}


def test_unsupported_op_fails_before_a_device_is_opened(monkeypatch, tmp_path):
    import vkgraph.pte.program as program

    def no_device(*a, **k):
        raise AssertionError("a device was opened")

    monkeypatch.setattr(program, "Device", no_device)
    with pytest.raises(UnsupportedOpError, match=r"unsupported.pte: delegate 0, node \d+ \(aten.relx.default\): "
                                                 "the op is not supported"):
        load_program(unsupported_program(tmp_path))


def _bad(tmp_path, raw: bytes) -> Path:
    p = tmp_path / "bad.pte"
    p.write_bytes(raw)
    return p


def test_truncated_program(tmp_path):
    raw = (PROGRAMS / "mlp.pte").read_bytes()
    p = _bad(tmp_path, raw[: len(raw) - 100])
    with pytest.raises(PteFormatError, match=r"bad.pte: .*runs past the end of the file"):
        PteFile(p)
    with pytest.raises(PteFormatError, match="too short"):
        PteFile(_bad(tmp_path, raw[:20]))


def test_wrong_identifier(tmp_path):
    raw = bytearray((PROGRAMS / "mlp.pte").read_bytes())
    raw[4:8] = b"ET99"
    with pytest.raises(PteFormatError, match=r"bad.pte: not an ExecuTorch program .*ET99"):
        PteFile(_bad(tmp_path, bytes(raw)))


def _delegate_offset(name: str) -> int:
    with PteFile(PROGRAMS / name) as f:
        return f.plan().delegates[0].offset


def test_bad_delegate_header(tmp_path):
    raw = bytearray((PROGRAMS / "mlp.pte").read_bytes())
    off = _delegate_offset("mlp.pte")
    raw[off + 4:off + 8] = b"XX00"
    with PteFile(_bad(tmp_path, bytes(raw))) as f, pytest.raises(PteFormatError, match="no 'VH00' header"):
        f.vkgraph(f.plan().delegates[0])
    raw[off + 4:off + 8] = b"VH00"
    struct.pack_into("<I", raw, off + 14, 2**31)  # flatbuffer size far past the blob
    with PteFile(_bad(tmp_path, bytes(raw))) as f, pytest.raises(PteFormatError, match="header is inconsistent"):
        f.vkgraph(f.plan().delegates[0])


def test_constant_out_of_range(tmp_path):
    """A VkBytes length beyond the delegate's data: found by the reader, not by a crash."""
    raw = bytearray((PROGRAMS / "mlp.pte").read_bytes())
    with PteFile(PROGRAMS / "mlp.pte") as f:
        d = f.plan().delegates[0]
        g = f.vkgraph(d)
        off, n = g.constants[0]
    # the length field of constant 0 holds n: rewrite the one occurrence inside the blob's flatbuffer
    needle = struct.pack("<Q", n)
    at = [i for i in range(d.offset, d.offset + d.nbytes - 8) if raw[i:i + 8] == needle]
    assert at, "constant length not found in the flatbuffer"
    for i in at:
        raw[i:i + 8] = struct.pack("<Q", 2**40)
    with PteFile(_bad(tmp_path, bytes(raw))) as f, pytest.raises(PteFormatError, match="constant"):
        f.vkgraph(f.plan().delegates[0])


def test_missing_file_names_it(tmp_path):
    with pytest.raises(PteFormatError, match="nope.pte: cannot read the file"):
        PteFile(tmp_path / "nope.pte")


@pytest.mark.parametrize("name,args,expect", [
    ("aten::mean.out", (np.arange(6.0).reshape(2, 3), [1], True, None), [[1.0], [4.0]]),
    ("aten.slice_copy.Tensor", (np.arange(10), 0, 2, 9, 3), [2, 5, 8]),
    ("aten.expand_copy.default", (np.array([[1], [2]]), [2, -1, 3]), np.array([[[1] * 3, [2] * 3]] * 2)),
    ("aten.where.self", (np.array([True, False]), np.array([1, 2]), np.array([3, 4])), [1, 4]),
    ("aten::var.correction_out", (np.array([[1.0, 2.0, 4.0], [0.0, 0.0, 3.0]]), [1], None, True), [[7 / 3], [3.0]]),
    ("aten::max.dim_max", (np.array([[1, 5, 2], [7, 0, 7]]), 1, False), ([5, 7], [1, 0])),
    ("aten::min.other_out", (np.array([1, 5]), np.array([3, 2])), [1, 2]),
    ("aten::topk.values", (np.array([[3, 1, 4, 1, 5]]), 2, 1, True, True), ([[5, 4]], [[4, 2]])),
    ("aten::sort.values", (np.array([3, 1, 2]), 0, True), ([3, 2, 1], [0, 2, 1])),
    ("aten::cumsum.out", (np.array([[1, 2, 3]]), 1, None), [[1, 3, 6]]),
    ("aten::remainder.Scalar_out", (np.array([-1.5, 2.5]), 2.0), [0.5, 0.5]),
    ("aten::fmod.Scalar_out", (np.array([-1.5, 2.5]), 2.0), [-1.5, 0.5]),
    ("aten::elu.out", (np.array([-1.0, 2.0]), 1.0, 1, 1), [np.expm1(-1.0), 2.0]),
    ("aten::logsumexp.out", (np.array([[0.0, np.log(3.0)]]), [1], False), [np.log(4.0)]),
    ("aten::constant_pad_nd.out", (np.array([[1, 2, 3]]), [1, -1], 9), [[9, 1, 2]]),
    ("aten::_adaptive_avg_pool2d.out", (np.arange(6.0).reshape(1, 1, 2, 3), [1, 2]), [[[[2.0, 3.0]]]]),  # overlapping windows
])
def test_numpy_kernels(name, args, expect):
    """Portable kernels a program runs between its delegates (or its constant folding uses);
    several outputs come back as a tuple."""
    got = kernels.kernel(name)(*args)
    if isinstance(expect, tuple):
        assert isinstance(got, tuple) and len(got) == len(expect)
        for g, e in zip(got, expect):
            np.testing.assert_allclose(g, e)
    else:
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expect, np.float64), rtol=1e-12)


def test_numpy_convolution_matches_a_direct_sum():
    """aten::convolution (grouped, strided, dilated, padded; and transposed) against the sum it is."""
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((6, 2, 3, 2)), rng.standard_normal(6)
    y = kernels.kernel("aten::convolution.out")(x, w, b, [2, 1], [1, 0], [1, 2], False, [0, 0], 2)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)))
    expect = np.zeros((2, 6, 3, 3))
    for n, co, i, j in np.ndindex(*expect.shape):
        c0 = co // 3 * 2
        expect[n, co, i, j] = b[co] + sum(xp[n, c0 + c, i * 2 + ky, j + kx * 2] * w[co, c, ky, kx]
                                         for c in range(2) for ky in range(3) for kx in range(2))
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)
    # transposed: y[n, o, i*s + k*d - p] += x[n, c, i] w[c, o, k], cropped (1-D, output padding 1)
    x1, w1 = rng.standard_normal((1, 2, 4)), rng.standard_normal((2, 3, 3))
    y1 = kernels.kernel("aten::convolution.out")(x1, w1, None, [2], [1], [1], True, [1], 1)
    full = np.zeros((1, 3, 3 * 2 + 3 + 1))
    for c, o, i, k in np.ndindex(2, 3, 4, 3):
        full[0, o, i * 2 + k] += x1[0, c, i] * w1[c, o, k]
    np.testing.assert_allclose(y1, full[:, :, 1:1 + 8], rtol=1e-5, atol=1e-5)


def test_readme_coverage_table_is_the_op_table():
    """README's table of supported ops lists exactly the ops of vkgraph/pte/lower.py's OPS."""
    import re

    from vkgraph.pte.lower import OPS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("Supported ET-VK ops"):readme.index("Quantized weights stay quantized")]
    listed = {n for n in re.findall(r"`([A-Za-z_]\w*(?:\.\w+)+)`", section) if not n.endswith(".py")}
    assert listed == set(OPS), f"missing {sorted(set(OPS) - listed)}, extra {sorted(listed - set(OPS))}"


def test_list_of_value_indices_out_of_range(tmp_path):
    """A program IntList holds value indices: one past the values is the file's fault, said so."""
    raw = bytearray((PROGRAMS / "convnet.pte").read_bytes())
    with PteFile(PROGRAMS / "convnet.pte") as f:
        plan = f.plan()
        (i,) = [k for k, v in enumerate(plan.values) if v.kind == "int_list"]
        items = plan.values[i].value
    needle = struct.pack("<2q", *items)
    assert raw.count(needle) == 1
    at = raw.index(needle)
    raw[at:at + 8] = struct.pack("<q", 999)
    with pytest.raises(PteFormatError, match=r"bad.pte: program: value \d+ \(int_list\) refers to value 999"):
        PteFile(_bad(tmp_path, bytes(raw)))
