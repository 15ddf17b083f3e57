"""Graph values: CPU constants (:class:`TensorRef`) and device tensors (:class:`Tensor`), referenced
by integer refs into the graph's value table, and the host staging of graph inputs and outputs."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import xxhash

from ..errors import VkGraphError
from ..runtime import Buffer, Image3D

ValueRef = int


#: Content fingerprints (packed-weight cache keys) of file-backed tensors: tensors up to WHOLE
#: bytes are hashed whole, larger ones by BLOCK-byte samples, one per MiB (at least 16, at most
#: 256): all but one evenly spaced from the first byte, and the last BLOCK bytes.
FINGERPRINT_WHOLE = 64 << 10
FINGERPRINT_BLOCK = 4 << 10


def fingerprint(data: np.ndarray, sampled: bool) -> str:
    """xxh3-128 of ``data``'s length and bytes: all of them, or (``sampled``, for tensors read
    through a file mapping) the samples described at :data:`FINGERPRINT_WHOLE`, which touch a
    few pages of each tensor instead of all of them, keeping a warm load fast."""
    n = data.nbytes
    h = xxhash.xxh3_128(n.to_bytes(8, "little"))
    if not sampled or n <= FINGERPRINT_WHOLE:
        h.update(data)
        return "xxh3:" + h.hexdigest()
    blocks = min(256, max(16, n >> 20))
    step = (n - FINGERPRINT_BLOCK) // (blocks - 1)
    # blocks - 1 evenly spaced from the first byte (rows of a reshape), and the last bytes
    h.update(np.ascontiguousarray(data[:(blocks - 1) * step].reshape(blocks - 1, step)[:, :FINGERPRINT_BLOCK]))
    h.update(data[n - FINGERPRINT_BLOCK:])
    return f"xxh3-sampled{blocks}:" + h.hexdigest()


class ByteSource(Protocol):
    """Where a TensorRef's bytes come from. ``read()`` may be called once per prepack node;
    ``release()`` is called after the last one, so file pages can be dropped from memory.
    ``fingerprint()`` names the bytes by content (packed-weight cache keys)."""

    nbytes: int

    def read(self) -> np.ndarray: ...  # uint8, C-contiguous

    def release(self) -> None: ...

    def fingerprint(self) -> str: ...


class ArraySource:
    """Bytes of a numpy array (or a view of a memory map). ``release()`` drops the reference,
    and for a view of a file mapping tells the kernel the pages are no longer needed."""

    def __init__(self, array: np.ndarray, mapping: mmap.mmap | None = None, offset: int = 0, path: str = "",
                 importable: bool = False):
        self._array: np.ndarray | None = np.ascontiguousarray(array)
        self.nbytes = self._array.nbytes
        self._mapping = mapping
        self._offset = offset
        #: the file's pages may become the tensor's device memory (``pages()``): the mapping is
        #: private and stays open while the tensor lives
        self.importable = importable
        #: the pages are a tensor's device memory now (set by the prepack that imported them):
        #: release() leaves them alone
        self.lent = False
        #: (file, offset) of bytes read through a file mapping: lets the packed-weight cache
        #: remember their fingerprint for as long as the file is unchanged
        self.origin: tuple[str, int] | None = (os.path.abspath(path), offset) if path else None

    @property
    def rereadable(self) -> bool:
        """Whether ``read()`` still works after ``release()`` (file mappings: pages fault back in)."""
        return self._mapping is not None

    def read(self) -> np.ndarray:
        if self._array is None:
            if self._mapping is None:
                raise ValueError("the source was released after its last prepack node")
            try:  # released view of a file mapping: map the bytes again (the pages fault back in)
                return np.frombuffer(self._mapping, np.uint8, self.nbytes, self._offset)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"the source's file mapping is gone ({exc})") from None
        return self._array.reshape(-1).view(np.uint8)

    def fingerprint(self) -> str:
        """In-memory arrays are hashed whole; views of a file mapping are sampled."""
        return fingerprint(self.read(), sampled=self._mapping is not None)

    def pages(self) -> memoryview | None:
        """The whole pages of the file mapping that hold these bytes, for a device to import as
        the tensor's memory: only for an ``importable`` source that starts on a page, whose last
        page the mapping holds. Whoever imports them sets :attr:`lent`."""
        page = mmap.PAGESIZE
        if not self.importable or self._mapping is None or self._offset % page or not self.nbytes:
            return None
        end = self._offset + -(-self.nbytes // page) * page
        if end > len(self._mapping):
            return None
        return memoryview(self._mapping)[self._offset:end]

    def release(self) -> None:
        self._array = None
        if self._mapping is not None and self.nbytes and not self.lent:
            # Drop this tensor's pages from the process: they are clean file pages, so the
            # kernel can discard them (a later read would fault them back in from the file).
            page = mmap.PAGESIZE
            start = self._offset - self._offset % page
            end = self._offset + self.nbytes
            try:
                self._mapping.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (ValueError, OSError):
                pass  # the mapping was closed, or madvise is unsupported: nothing to release


class LazySource:
    """Bytes produced by a callable only when the prepack node is encoded."""

    def __init__(self, nbytes: int, load: Callable[[], np.ndarray], release: Callable[[], None] | None = None):
        self.nbytes = nbytes
        self._load = load
        self._release = release

    def read(self) -> np.ndarray:
        data = np.ascontiguousarray(self._load()).reshape(-1).view(np.uint8)
        if data.nbytes != self.nbytes:
            raise ValueError(f"lazy source produced {data.nbytes} bytes, expected {self.nbytes}")
        return data

    rereadable = True  # read() calls the loader again

    def fingerprint(self) -> str:
        return fingerprint(self.read(), sampled=False)

    def release(self) -> None:
        if self._release is not None:
            self._release()


def shape_only_source(name: str, nbytes: int) -> LazySource:
    """The source of a tensor known by its shape only (a recording graph's): reading it fails."""

    def unreadable() -> np.ndarray:
        raise VkGraphError(f"tensor {name!r} has a shape but no bytes: a shape-only model cannot be loaded")

    return LazySource(nbytes, unreadable)


@dataclass
class TensorRef:
    """A CPU constant: name, shape, dtype and a source of bytes. A quantized weight has
    ``quant`` set (``"q4_0"``, ``"q4_1"``, ``"q8_0"``) and holds its raw GGML blocks as uint8
    rows: ``shape`` is (rows, bytes per row)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    source: ByteSource
    readers: int = 0  # prepack nodes that still have to read it
    quant: str = ""

    @property
    def nbytes(self) -> int:
        return self.source.nbytes


#: ET-VK's texture layouts and the dim each packs four of into a texel (glsl/texture_layout.h).
PACKED_DIM = {"width_packed": 0, "height_packed": 1, "channels_packed": 2}
TEXTURE_LAYOUTS = tuple(PACKED_DIM)


@dataclass
class Tensor:
    """A device tensor. ``layout`` names how its bytes are arranged (``"contiguous"`` or a packed
    layout such as ``"linear_4x4"``); ``nbytes`` is the packed size. ``buffer`` is bound lazily:
    weights just before their packing dispatch, everything else when execute is encoded."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str = "contiguous"
    nbytes: int = 0
    constant: bool = False  # a prepacked weight
    buffer: Buffer | None = None
    storage: str = "buffer"  # or "texture3d": an RGBA32F 3-D image, `layout` one of TEXTURE_LAYOUTS
    image: Image3D | None = None
    view_of: int | None = None  # a view: the ValueRef of the tensor whose buffer it shares
    state: bool = False  # kept from one execute to the next (a key/value cache): never shares memory

    def __post_init__(self) -> None:
        if self.storage == "texture3d":
            self.nbytes = int(np.prod(self.extents(), dtype=np.int64)) * 16
        elif not self.nbytes:
            self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def sizes(self) -> tuple[int, int, int, int]:
        """NCHW sizes, missing leading dims as 1 (as ET-VK does)."""
        return (1,) * (4 - len(self.shape)) + tuple(self.shape)[-4:]  # type: ignore[return-value]

    def extents(self) -> tuple[int, int, int]:
        """Texels of the texture: width-packed (ceil(W/4), H, N*C), height-packed (W, ceil(H/4),
        N*C), channels-packed (W, H, N*ceil(C/4))."""
        n, c, h, w = self.sizes()
        if self.layout == "width_packed":
            return ((w + 3) // 4, h, n * c)
        if self.layout == "height_packed":
            return (w, (h + 3) // 4, n * c)
        return (w, h, n * ((c + 3) // 4))

    def texture_params(self) -> bytes:
        """Push constants that describe this texture to glsl/texture_layout.h: sizes, packed dim."""
        return struct.pack("<5I", *self.sizes(), PACKED_DIM[self.layout])

    @property
    def resource(self) -> Buffer | Image3D | None:
        return self.image if self.storage == "texture3d" else self.buffer


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous tensor of ``shape``."""
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= int(dim)
    return strides[::-1]


def gather_params(out: Tensor, src: Tensor, strides: Sequence[int] | None = None, base: int = 0) -> bytes:
    """Push constants of glsl/gather_texture.glsl: texture ``out``'s element ``e`` is element
    ``base + e . strides`` of ``src`` (a buffer or a texture; default strides: a copy of a
    contiguous src of out's element count). Strides wrap modulo 2^32 (negative ones flip)."""
    wrap = [int(s) & 0xFFFFFFFF for s in (contiguous_strides(out.shape) if strides is None else strides)]
    on_texture = src.storage == "texture3d"
    return struct.pack("<15I", *out.sizes(), *src.sizes(), *([0] * (4 - len(wrap)) + wrap), int(base) & 0xFFFFFFFF,
                       PACKED_DIM[out.layout], PACKED_DIM[src.layout] if on_texture else 0)


@dataclass
class IOStaging:
    """Host-visible staging for a graph input or output of entry point ``entry``."""

    tensor: ValueRef
    name: str
    entry: str = ""
    buffer: Buffer | None = None
