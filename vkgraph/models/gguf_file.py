"""GGUF files: metadata, and tensors as lazy sources over a memory map of the file (quantized
tensors as raw GGML blocks, packed on the device). The ``gguf`` package only dequantizes
(``array``, for references)."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GGUFError, MissingTensorError
from ..ggml import BLOCK_WEIGHTS, BY_GGML_TYPE, BY_TYPE_ID
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


#: struct formats of the GGUF scalar value types (uint8 .. float64); 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_DIMS = 8
_MAX_NESTING = 4
_F32 = 0  # GGML's type number of float32 tensors
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    type_id: int
    dims: tuple[int, ...]  # as the file lists them: the fastest-varying first
    offset: int  # from the start of the data section


def _parse(path: str, data: bytes | memoryview) -> tuple[dict[str, Any], list[_TensorInfo], int, str]:
    """The key/values (arrays as lists), tensor infos, the data section's offset and the byte
    order ("<" or ">") of a GGUF file (versions 2 and 3), every count and length checked
    against the bytes left before it is used: a bad file is a GGUFError naming it and the byte,
    never a loop over a count it does not hold. (The ``gguf`` package's reader took 2.0 s over
    SmolLM2's header, a numpy view per vocabulary entry; this, under 0.1 s.)"""
    size = len(data)
    pos = 0

    def bad(what: str) -> GGUFError:
        return GGUFError(f"{path}: not a readable GGUF file ({what})")

    def need(n: int, what: str) -> None:
        if n < 0 or pos + n > size:
            raise bad(f"{what} at byte {pos} runs past its {size} bytes")

    def unpack(fmt: str, what: str) -> Any:
        nonlocal pos
        n = struct.calcsize(fmt)
        need(n, what)
        (v,) = struct.unpack_from(order + fmt, data, pos)
        pos += n
        return v

    def string(what: str) -> str:
        nonlocal pos
        n = unpack("Q", f"{what} length")
        need(n, what)
        pos += n
        try:
            return str(data[pos - n:pos], "utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{path}: {what} is not UTF-8 ({exc})") from None

    def value(kind: int, what: str, depth: int = 0) -> Any:
        nonlocal pos
        if kind in _SCALARS:
            return unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return string(what)
        if kind != _ARRAY:
            raise bad(f"{what} has unknown value type {kind}")
        if depth >= _MAX_NESTING:
            raise bad(f"{what}: arrays nested deeper than {_MAX_NESTING}")
        item, count = unpack("I", f"{what} type"), unpack("Q", f"{what} length")
        if item in _SCALARS:
            nbytes = count * struct.calcsize(_SCALARS[item])
            need(nbytes, f"{what} of {count} elements")
            out = np.frombuffer(data, np.dtype(order + _SCALARS[item]), count, pos).tolist()
            pos += nbytes
            return out
        need(count * 8, f"{what} of {count} elements")  # each at least a length or a header
        if item == _STRING:  # a vocabulary: tens of thousands, read inline
            out, unpack_len = [], struct.Struct(order + "Q").unpack_from
            for i in range(count):
                need(8, f"{what} element {i} length")
                (n,) = unpack_len(data, pos)
                pos += 8
                need(n, f"{what} element {i}")
                try:
                    out.append(str(data[pos:pos + n], "utf-8"))
                except UnicodeDecodeError as exc:
                    raise GGUFError(f"{path}: {what} element {i} is not UTF-8 ({exc})") from None
                pos += n
            return out
        return [value(item, what, depth + 1) for _ in range(count)]

    order = "<"
    if size < 24:
        raise bad(f"{size} bytes, too short for its header")
    if bytes(data[:4]) != b"GGUF":
        raise bad(f"magic {bytes(data[:4])!r}")
    pos = 4
    version = unpack("I", "version")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise bad(f"version {version}; vkgraph reads versions 2 and 3")
    n_tensors, n_kv = unpack("Q", "tensor count"), unpack("Q", "key/value count")
    need(n_kv * 13, f"{n_kv} key/values")  # key length, one byte of key, type
    metadata: dict[str, Any] = {}
    alignment = _DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = string(f"key {i}")
        kind = unpack("I", f"key/value {i} type")
        metadata[key] = value(kind, f"value {i}")
        if key == "general.alignment" and kind == _UINT32:
            alignment = metadata[key]
            if alignment <= 0:
                raise bad(f"general.alignment is {alignment}")
    need(n_tensors * 28, f"{n_tensors} tensor infos")  # name length, dims count, one dim, type, offset
    tensors = []
    for i in range(n_tensors):
        name = string(f"tensor {i} name")
        n_dims = unpack("I", f"tensor {i} dims count")
        if n_dims > _MAX_DIMS:
            raise bad(f"tensor {i} has {n_dims} dimensions, at most {_MAX_DIMS}")
        need(8 * n_dims + 12, f"tensor {i} info")
        dims = struct.unpack_from(f"{order}{n_dims}Q", data, pos)
        pos += 8 * n_dims
        type_id, offset = unpack("I", f"tensor {i} type"), unpack("Q", f"tensor {i} offset")
        tensors.append(_TensorInfo(name, type_id, dims, offset))
    return metadata, tensors, -(-pos // alignment) * alignment, order


def _type_name(type_id: int) -> str:
    """GGML's name of a tensor type number ("F16"), or the number where GGML has none."""
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"number {type_id}"


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
    """An open, memory-mapped GGUF file: ``metadata`` (key: value, arrays as lists) and
    ``tensors`` (their data views of the mapping). Close it after the load (or use ``with``)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except FileNotFoundError:
            raise GGUFError(f"{path}: no such file") from None
        try:
            self.metadata, infos, start, order = _parse(self.path, memoryview(self._mmap) if self._mmap else b"")
            #: written on a big-endian machine: the metadata reads, the tensors' bytes (their floats,
            #: the blocks' scales) are not what the shaders and references take
            self.big_endian = order == ">"
            self.tensors: dict[str, GGUFTensor] = {}
            for info in infos:
                self.tensors[info.name] = self._tensor(info, start, size, np.dtype(order + "f4"))
        except BaseException:
            self.close()
            raise

    def _tensor(self, info: _TensorInfo, start: int, size: int, f32: np.dtype) -> GGUFTensor:
        fmt = BY_TYPE_ID.get(info.type_id)
        if info.type_id != _F32 and fmt is None:
            raise GGUFError(f"{self.path}: tensor {info.name!r} has type {_type_name(info.type_id)}; "
                            f"supported: {', '.join(SUPPORTED)}")
        kind = fmt.ggml_type if fmt else "F32"
        shape = tuple(reversed(info.dims))
        offset, expect = start + info.offset, _data_nbytes(kind, shape)
        if expect is None or offset + expect > size:
            raise GGUFError(f"{self.path}: tensor {info.name!r} ({kind}, shape {shape}): its data "
                            f"({expect if expect is not None else '?'} bytes at offset {offset}) does not "
                            f"lie within the {size}-byte file")
        try:
            if fmt is None:
                data = np.frombuffer(self._mmap, f32, expect // 4, offset).reshape(shape)
            else:  # uint8 rows of the file's blocks
                data = np.frombuffer(self._mmap, np.uint8, expect, offset).reshape(
                    *shape[:-1], shape[-1] // BLOCK_WEIGHTS * fmt.block_nbytes)
        except ValueError as exc:  # an empty tensor with a dimension numpy cannot hold
            raise GGUFError(f"{self.path}: tensor {info.name!r} ({kind}) has shape {shape} ({exc})") from None
        return GGUFTensor(info.name, kind, shape, data, offset)

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
        t = self._little_endian(name)
        return ArraySource(t.data, mapping=self._mmap, offset=t.offset, path=self.path)

    def _little_endian(self, name: str) -> GGUFTensor:
        t = self.tensor(name)
        if self.big_endian:
            raise GGUFError(f"{self.path}: tensor {name!r}: the file is big-endian (written on a big-endian "
                            f"machine); vkgraph reads the weights of little-endian GGUF files only")
        return t

    def array(self, name: str) -> np.ndarray:
        """The tensor as float32 (dequantized), for references."""
        t = self._little_endian(name)
        if t.ggml_type == "F32":
            return np.array(t.data, np.float32).reshape(t.shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return dequantize(np.asarray(t.data), GGMLQuantizationType[t.ggml_type]).astype(np.float32).reshape(t.shape)

    def close(self) -> None:
        self.tensors = {}
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views are still alive (a load's sources); the mapping goes when they do

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
