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
])
def test_numpy_kernels(name, args, expect):
    np.testing.assert_array_equal(kernels.kernel(name)(*args), expect)


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
