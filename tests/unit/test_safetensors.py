import json
import struct

import numpy as np
import pytest

from vkgraph.errors import SafetensorsError
from vkgraph.models.safetensors import SafetensorsFile, write_safetensors


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.integers(-9, 9, 7).astype(np.int8),
               "c": rng.standard_normal(4).astype(np.float16), "empty": np.zeros((0, 3), np.float32)}
    path = tmp_path / "m.safetensors"
    write_safetensors(path, tensors, {"k": "v"})
    with SafetensorsFile(path) as st:
        assert st.metadata == {"k": "v"}
        for name, a in tensors.items():
            np.testing.assert_array_equal(st.array(name), a)
            assert st.info(name).shape == a.shape and st.info(name).dtype == a.dtype
        src = st.source("a")
        np.testing.assert_array_equal(src.read().view(np.float32).reshape(3, 5), tensors["a"])
        src.release()
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            st.info("nope")
    (data_start,) = struct.unpack_from("<Q", path.read_bytes())
    assert (8 + data_start) % 64 == 0


def _file(tmp_path, header, data=b"", raw=None):
    h = raw if raw is not None else json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return p


@pytest.mark.parametrize(
    "header,data,message",
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "past the end of the"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16, "hold 12 bytes, shape [4] x F32 needs 16"),
        ({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16, "unsupported dtype 'Q4'"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 16]}}, b"\0" * 16, "bad shape"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}}, b"\0" * 16, "bad data_offsets"),
        ({"w": {"dtype": "F32"}}, b"", "malformed entry"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, b"\0" * 24, "'a' and 'b' overlap"),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_malformed_files_are_rejected_with_the_reason(tmp_path, header, data, message):
    path = _file(tmp_path, header, data)
    with pytest.raises(SafetensorsError, match=str(path).replace(".", r"\.") + ".*" + message.replace("[", r"\[").replace("]", r"\]")):
        SafetensorsFile(path)


def test_header_larger_than_file(tmp_path):
    p = tmp_path / "t.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(SafetensorsError, match="does not fit"):
        SafetensorsFile(p)
    p.write_bytes(b"\1\2")
    with pytest.raises(SafetensorsError, match="too short"):
        SafetensorsFile(p)
    path = _file(tmp_path, None, raw=b"{not json")
    with pytest.raises(SafetensorsError, match="not JSON"):
        SafetensorsFile(path)
