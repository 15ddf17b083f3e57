"""GGUF files through the ``gguf`` package: metadata, and tensors as lazy sources over the
package's memory map (quantized tensors as raw GGML blocks, packed on the device)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MissingTensorError, VkGraphError
from ..graph.values import ArraySource, file_identity

#: GGML types vkgraph reads, and the packer format of the quantized ones.
SUPPORTED = {"F32": "", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}


class GGUFError(VkGraphError, ValueError):
    """A GGUF file is malformed or uses something unsupported; names the file and the reason."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str
    shape: tuple[int, ...]  # logical, row-major: (rows, columns) for a matrix
    data: np.ndarray  # F32: float32 of `shape`; quantized: uint8 rows of raw blocks
    offset: int  # absolute file offset of the data

    @property
    def quant(self) -> str:
        return SUPPORTED[self.ggml_type]


class GGUFFile:
    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = str(path)
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
            self.tensors[t.name] = GGUFTensor(t.name, kind, shape, t.data, int(t.data_offset))
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
        return ArraySource(t.data, mapping=self._mmap, offset=t.offset,
                           identity=file_identity(self.path, t.offset, t.data.nbytes))

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
