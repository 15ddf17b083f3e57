"""Read and write safetensors files. Reading memory-maps the file and hands out lazy sources:
bytes are touched only when a prepack node copies them, and released afterwards.

Format: u64 little-endian header size N, N bytes of JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data (offsets relative to it).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import MissingTensorError, SafetensorsError
from ..graph.values import ArraySource

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
NAMES = {np.dtype(v): k for k, v in DTYPES.items() if v is not None}
MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute, in the file
    nbytes: int


class SafetensorsFile:
    """An open, memory-mapped safetensors file. Close it after the load (or use ``with``)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SafetensorsError(f"{path}: {size} bytes is too short for a safetensors header")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.tensors, self.metadata = self._parse(size)
        except BaseException:
            self._mm.close()
            raise

    def _parse(self, size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
        (n,) = struct.unpack_from("<Q", self._mm, 0)
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{self.path}: header of {n} bytes does not fit in the {size}-byte file")
        try:
            header = json.loads(bytes(self._mm[8:8 + n]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"{self.path}: header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header is not a JSON object")
        base = 8 + n
        metadata = header.pop("__metadata__", {}) or {}
        tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, entry in header.items():
            try:
                dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise SafetensorsError(f"{self.path}: tensor {name!r}: malformed entry {entry!r}") from None
            if dtype_name not in DTYPES or DTYPES[dtype_name] is None:
                raise SafetensorsError(f"{self.path}: tensor {name!r}: unsupported dtype {dtype_name!r}")
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise SafetensorsError(f"{self.path}: tensor {name!r}: bad shape {shape!r}")
            dtype = np.dtype(DTYPES[dtype_name])
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
                raise SafetensorsError(f"{self.path}: tensor {name!r}: bad data_offsets {[begin, end]!r}")
            if end - begin != nbytes:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r}: data_offsets hold {end - begin} bytes, "
                    f"shape {shape} x {dtype_name} needs {nbytes}")
            if base + end > size:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r} ends at byte {base + end}, past the end of the "
                    f"{size}-byte file (truncated?)")
            tensors[name] = TensorInfo(name, dtype, tuple(shape), base + begin, nbytes)
            spans.append((begin, end, name))
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise SafetensorsError(f"{self.path}: tensors {n0!r} and {n1!r} overlap")
        return tensors, metadata

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(f"{self.path}: no tensor named {name!r}") from None

    def source(self, name: str) -> ArraySource:
        """A lazy source: a view of the mapping, dropped from memory after it is released."""
        t = self.info(name)
        view = np.frombuffer(self._mm, dtype=t.dtype, count=t.nbytes // t.dtype.itemsize, offset=t.offset)
        return ArraySource(view.reshape(t.shape), mapping=self._mm, offset=t.offset, path=self.path)

    def array(self, name: str) -> np.ndarray:
        """A copy of the tensor."""
        t = self.info(name)
        return np.frombuffer(self._mm, dtype=t.dtype, count=t.nbytes // t.dtype.itemsize,
                             offset=t.offset).reshape(t.shape).copy()

    def close(self) -> None:
        try:
            self._mm.close()
        except BufferError:
            pass  # views are still alive; the mapping goes when they do

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_safetensors(path: str | Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (C order) to ``path`` atomically; data starts 64-byte aligned."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, a in tensors.items():
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for a in tensors.values():
                f.write(np.ascontiguousarray(a).tobytes())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
