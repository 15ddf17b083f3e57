"""GGUF files through the ``gguf`` package: metadata, and tensors as lazy sources over the
package's memory map (quantized tensors as raw GGML blocks, packed on the device)."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GGUFError, MissingTensorError
from ..ggml import BLOCK_WEIGHTS, BY_GGML_TYPE
from ..graph.values import ArraySource

#: GGML types vkgraph reads: F32 and the block formats of vkgraph/ggml.py.
SUPPORTED = ("F32", *BY_GGML_TYPE)



@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str
    shape: tuple[int, ...]  # logical, row-major: (rows, columns) for a matrix
    data: np.ndarray  # F32: float32 of `shape`; quantized: uint8 rows of raw blocks
    offset: int  # absolute file offset of the data

    @property
    def raw_shape(self) -> tuple[int, ...]:
        """The shape of the bytes in the file: ``shape`` for F32, uint8 rows of blocks otherwise."""
        return self.data.shape

    @property
    def raw_dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def quant(self) -> str:
        """The packer format of a quantized tensor ("q4_0", ...), "" for F32."""
        return BY_GGML_TYPE[self.ggml_type].name if self.ggml_type in BY_GGML_TYPE else ""


#: Bytes of each GGUF scalar value type (uint8 .. float64); 8 = string, 9 = array.
_SCALAR_NBYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8
_MAX_NESTING = 4


def _prescan(path: str, data: bytes | memoryview) -> None:
    """Walk the header, key/values and tensor infos with every count checked against the bytes
    left, so that the ``gguf`` package's reader never sees a count it would loop over or
    allocate for (its reader does not check them: a huge array length makes it run for ever)."""
    size = len(data)
    pos = 0

    def need(n: int, what: str) -> None:
        if n < 0 or pos + n > size:
            raise GGUFError(f"{path}: not a readable GGUF file ({what} at byte {pos} runs past its {size} bytes)")

    def unpack(fmt: str, what: str) -> int:
        nonlocal pos
        n = struct.calcsize(fmt)
        need(n, what)
        (v,) = struct.unpack_from(order + fmt, data, pos)
        pos += n
        return v

    def string(what: str) -> None:
        nonlocal pos
        n = unpack("Q", f"{what} length")
        need(n, what)
        pos += n

    def value(kind: int, what: str, depth: int = 0) -> None:
        nonlocal pos
        if kind in _SCALAR_NBYTES:
            need(_SCALAR_NBYTES[kind], what)
            pos += _SCALAR_NBYTES[kind]
        elif kind == _STRING:
            string(what)
        elif kind == _ARRAY:
            if depth >= _MAX_NESTING:
                raise GGUFError(f"{path}: not a readable GGUF file ({what}: arrays nested deeper than {_MAX_NESTING})")
            item, count = unpack("I", f"{what} type"), unpack("Q", f"{what} length")
            smallest = _SCALAR_NBYTES.get(item, 8 if item == _STRING else 12)
            need(count * smallest, f"{what} of {count} elements")
            if item in _SCALAR_NBYTES:
                pos += count * smallest
            else:
                for _ in range(count):
                    value(item, what, depth + 1)
        else:
            raise GGUFError(f"{path}: not a readable GGUF file ({what} has unknown value type {kind})")

    order = "<"
    if bytes(data[:4]) != b"GGUF":
        raise GGUFError(f"{path}: not a readable GGUF file (magic {bytes(data[:4])!r})")
    pos = 4
    version = unpack("I", "version")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
    n_tensors, n_kv = unpack("Q", "tensor count"), unpack("Q", "key/value count")
    need(n_kv * 13, f"{n_kv} key/values")  # key length, one byte of key, type
    for i in range(n_kv):
        string(f"key {i}")
        value(unpack("I", f"key/value {i} type"), f"value {i}")
    need(n_tensors * 28, f"{n_tensors} tensor infos")  # name length, dims count, one dim, type, offset
    for i in range(n_tensors):
        string(f"tensor {i} name")
        dims = unpack("I", f"tensor {i} dims count")
        if dims > _MAX_DIMS:
            raise GGUFError(f"{path}: not a readable GGUF file (tensor {i} has {dims} dimensions, at most {_MAX_DIMS})")
        need(8 * dims + 12, f"tensor {i} info")
        pos += 8 * dims + 12


def _data_nbytes(kind: str, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor's data, or None when its shape cannot hold its type (a quantized row
    must be whole blocks)."""
    count = 1
    for n in shape:
        count *= n
    if kind == "F32":
        return 4 * count
    if not shape or shape[-1] % BLOCK_WEIGHTS:
        return None
    return count // BLOCK_WEIGHTS * BY_GGML_TYPE[kind].block_nbytes


class GGUFFile:
    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = str(path)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < 24:
                    raise GGUFError(f"{path}: not a readable GGUF file ({size} bytes, too short for its header)")
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    _prescan(self.path, m)
        except FileNotFoundError:
            raise GGUFError(f"{path}: no such file") from None
        try:
            self._reader = GGUFReader(path)
        except FileNotFoundError:
            raise GGUFError(f"{path}: no such file") from None
        except (ValueError, IndexError, KeyError, struct.error, OverflowError, TypeError) as exc:
            raise GGUFError(f"{path}: not a readable GGUF file ({exc or type(exc).__name__})") from None
        self.metadata: dict[str, Any] = {}
        for key, f in self._reader.fields.items():
            try:
                self.metadata[key] = f.contents()
            except (ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
                raise GGUFError(f"{path}: metadata {key!r} is unreadable ({exc})") from None
        self.tensors: dict[str, GGUFTensor] = {}
        for t in self._reader.tensors:
            kind = t.tensor_type.name
            if kind not in SUPPORTED:
                raise GGUFError(f"{path}: tensor {t.name!r} has type {kind}; supported: {', '.join(SUPPORTED)}")
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))
            offset, expect = int(t.data_offset), _data_nbytes(kind, shape)
            if expect is None or t.data.nbytes != expect or offset + expect > size:
                raise GGUFError(f"{path}: tensor {t.name!r} ({kind}, shape {shape}): its data "
                                f"({expect if expect is not None else '?'} bytes at offset {offset}) does not "
                                f"lie within the {size}-byte file")
            self.tensors[t.name] = GGUFTensor(t.name, kind, shape, t.data, offset)
        self._mmap = getattr(self._reader.data, "_mmap", None)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata {key!r} is missing")
        return self.metadata[key]

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(f"{self.path}: no tensor named {name!r}") from None

    def source(self, name: str) -> ArraySource:
        """A lazy source over the file mapping; its pages are dropped after release()."""
        t = self.tensor(name)
        return ArraySource(t.data, mapping=self._mmap, offset=t.offset, path=self.path)

    def array(self, name: str) -> np.ndarray:
        """The tensor as float32 (dequantized), for references."""
        t = self.tensor(name)
        if t.ggml_type == "F32":
            return np.array(t.data, np.float32).reshape(t.shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return dequantize(np.asarray(t.data), GGMLQuantizationType[t.ggml_type]).astype(np.float32).reshape(t.shape)

    def close(self) -> None:
        self.tensors.clear()
        self._mmap = None
        self._reader = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
