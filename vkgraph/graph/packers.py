"""Packers: how a TensorRef's bytes become a packed device tensor.

A packer describes the destination (shape, layout, packed size), validates that source and
destination agree before any GPU work, and names the packing shader (None: no shader).
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, ClassVar

import numpy as np

from ..errors import PrepackMismatchError
from ..ggml import BLOCK_WEIGHTS, FORMATS
from ..runtime.device import Device, host_cores
from .values import TEXTURE_LAYOUTS, Tensor, TensorRef, gather_params


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


#: a host form splits a weight of at least this many bytes over the CPU's cores: numpy lets go of
#: the GIL while it copies, and the first touch of the destination (and of a memory-mapped
#: source) faults pages in parallel too
HOST_SPLIT_MIN_NBYTES = 512 << 10
_pool: ThreadPoolExecutor | None = None


def host_split(total: int, nbytes: int, part: Callable[[int, int], None]) -> None:
    """``part(lo, hi)`` over ``[0, total)``: in one call, or for ``nbytes`` of at least
    HOST_SPLIT_MIN_NBYTES in one slice per core, run on a shared thread pool."""
    global _pool
    parts = min(host_cores(), total) if nbytes >= HOST_SPLIT_MIN_NBYTES else 1
    if parts <= 1:
        part(0, total)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(host_cores(), thread_name_prefix="vkgraph-pack")
    bounds = [total * i // parts for i in range(parts + 1)]
    futures = [_pool.submit(part, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    wait(futures)  # every slice done before an error leaves: the caller may free ``out`` then
    for future in futures:
        future.result()


class Packer:
    """Base packer: the destination has the source's shape and bytes."""

    name: ClassVar[str] = ""
    shader: ClassVar[str | None] = None
    layout: ClassVar[str] = "contiguous"
    push_nbytes: ClassVar[int] = 8
    defines: dict[str, object] = {}
    storage: ClassVar[str] = "buffer"
    #: whether :meth:`pack_host` can pack on the CPU (straight into host-visible device memory)
    host_form: ClassVar[bool] = False

    def device_defines(self, device: Device) -> dict[str, object]:
        """The packing shader's defines that depend on the device its pipeline is made for."""
        return {}

    def texel_source(self, src: TensorRef) -> bool:
        """Whether the packing shader can read this source as RGBA32UI texels (define TEXEL:
        binding 0 a uniform texel buffer) where the device allows a texel buffer that large."""
        return False

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        """Pack the source bytes ``data`` into ``out`` (the destination's bytes) on the CPU,
        exactly as the packing shader does (large weights in slices on all cores, host_split)."""
        raise NotImplementedError(f"packer {self.name!r} has no host form")

    def dst_shape(self, src: TensorRef) -> tuple[int, ...]:
        return src.shape

    def packed_nbytes(self, src: TensorRef) -> int:
        return _numel(src.shape) * src.dtype.itemsize

    def push_constants(self, src: TensorRef) -> bytes:
        return b""

    def work_items(self, dst: Tensor) -> int:
        """Invocations the packing shader needs (one per 32-bit word written)."""
        return dst.nbytes // 4

    def make_dst(self, src: TensorRef, name: str) -> Tensor:
        return Tensor(name, self.dst_shape(src), src.dtype, self.layout, self.packed_nbytes(src), constant=True)

    def row_layout(self, src: TensorRef) -> tuple[int, int, int, int] | None:
        """(rows, source bytes per row, packed bytes per row, rows packed together) when the
        packer can pack a window of rows at a time (tensors beyond one binding); else None."""
        return None

    def window_push(self, src: TensorRef, r0: int, r1: int) -> bytes:
        """Push constants for packing rows [r0, r1) bound at their offsets."""
        raise NotImplementedError

    def window_work(self, src: TensorRef, r0: int, r1: int) -> int:
        raise NotImplementedError

    def validate_source(self, src: TensorRef) -> None:
        """Raise :class:`PrepackMismatchError` naming the tensor unless this packer accepts src."""
        declared = _numel(src.shape) * src.dtype.itemsize
        if src.nbytes != declared:
            self._mismatch(src, f"its source holds {src.nbytes} bytes but shape {src.shape} x "
                                f"{src.dtype} needs {declared}")

    def validate(self, src: TensorRef, dst: Tensor) -> None:
        """Raise :class:`PrepackMismatchError` naming the tensor unless src and dst agree."""
        self.validate_source(src)
        if dst.dtype.itemsize != src.dtype.itemsize:
            self._mismatch(src, f"element size {src.dtype.itemsize} B (source {src.dtype}) != "
                                f"{dst.dtype.itemsize} B (destination {dst.dtype})")
        if tuple(dst.shape) != tuple(self.dst_shape(src)):
            self._mismatch(src, f"destination dims {tuple(dst.shape)} != {tuple(self.dst_shape(src))} "
                                f"expected by packer {self.name!r} for source dims {src.shape}")
        if dst.nbytes != self.packed_nbytes(src):
            self._mismatch(src, f"destination holds {dst.nbytes} bytes, packer {self.name!r} "
                                f"writes {self.packed_nbytes(src)}")

    def _mismatch(self, src: TensorRef, why: str) -> None:
        raise PrepackMismatchError(f"cannot prepack tensor {src.name!r} with packer {self.name!r}: {why}")


class IdentityPacker(Packer):
    """Same bytes, same layout: no shader. Written straight into the destination's memory when
    device-local memory is host-visible, one vkCmdCopyBuffer from staging otherwise."""

    name = "identity"
    host_form = True

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        out[:data.nbytes] = data


class _Words2D(Packer):
    """Packers that move 32-bit words of a 2-D matrix."""

    def validate_source(self, src: TensorRef) -> None:
        if len(src.shape) != 2:
            self._mismatch(src, f"needs a 2-D source, got dims {src.shape}")
        if src.dtype.itemsize != 4:
            self._mismatch(src, f"needs 4-byte elements, got {src.dtype}")
        super().validate_source(src)


class TransposedPacker(_Words2D):
    """``dst[c][r] = src[r][c]``."""

    name = "transposed"
    shader = "pack_transpose"
    host_form = True

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        rows, cols = src.shape
        w, dst = data.view(np.uint32).reshape(rows, cols), out.view(np.uint32).reshape(cols, rows)

        def part(lo: int, hi: int) -> None:  # destination rows (source columns)
            dst[lo:hi] = w[:, lo:hi].T
        host_split(cols, data.nbytes, part)

    def dst_shape(self, src: TensorRef) -> tuple[int, ...]:
        rows, cols = src.shape
        return (cols, rows)

    def push_constants(self, src: TensorRef) -> bytes:
        return struct.pack("<II", *src.shape)


class Linear4x4Packer(_Words2D):
    """An fp32 linear weight ``[N, K]`` in zero-padded 4x4 blocks (see glsl/pack_linear_4x4.glsl)."""

    name = "linear_4x4"
    shader = "pack_linear_4x4"
    layout = "linear_4x4"
    host_form = True
    BLOCKS = 8  # 4x4 blocks an invocation packs (SwiftShader's packing a quarter faster than with one)
    defines = {"BLOCKS": BLOCKS}

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        n, k = src.shape
        n4, k4 = (n + 3) // 4, (k + 3) // 4
        w = data.view(np.uint32).reshape(n, k)
        blocks = out.view(np.uint32)[:n4 * k4 * 16].reshape(n4, k4, 4, 4)  # [n4][k4][kk][nn]

        def part(lo: int, hi: int) -> None:  # block rows
            rows = w[lo * 4:hi * 4]
            if rows.shape != ((hi - lo) * 4, k4 * 4):  # zero padding rows and columns
                padded = np.zeros(((hi - lo) * 4, k4 * 4), np.uint32)
                padded[:rows.shape[0], :k] = rows
                rows = padded
            blocks[lo:hi] = rows.reshape(hi - lo, 4, k4, 4).transpose(0, 2, 3, 1)
        host_split(n4, data.nbytes, part)

    def packed_nbytes(self, src: TensorRef) -> int:
        n, k = src.shape
        return ((n + 3) // 4) * ((k + 3) // 4) * 16 * 4

    def texel_source(self, src: TensorRef) -> bool:
        return src.shape[1] % 4 == 0  # a block row's 4 words are one texel

    def device_defines(self, device: Device) -> dict[str, object]:
        # STORE64 (glsl/pack_linear_4x4.glsl): a block in two 32-byte stores of 64-bit words, on
        # lavapipe at 512 bits (16 lanes), which stores lane by lane, a store per component; at
        # 256 bits the four 16-byte stores ran faster (calibrate.pack_gbps, Intel Xeon host, five
        # fresh processes each: 512 bits 1.103 against 0.838 GB/s, 256 bits 1.325 against 1.673)
        return {"STORE64": int(device.is_cpu and device.has_int64 and device.simd_width >= 16)}

    def push_constants(self, src: TensorRef) -> bytes:
        return struct.pack("<II", *src.shape)

    def row_layout(self, src: TensorRef) -> tuple[int, int, int, int]:
        n, k = src.shape
        return n, k * 4, (k + 3) // 4 * 16, 4

    def window_push(self, src: TensorRef, r0: int, r1: int) -> bytes:
        return struct.pack("<II", r1 - r0, src.shape[1])

    def work_items(self, dst: Tensor) -> int:
        return -(-dst.nbytes // (64 * self.BLOCKS))  # an invocation per BLOCKS 4x4 blocks

    def window_work(self, src: TensorRef, r0: int, r1: int) -> int:
        blocks = (r1 - r0 + 3) // 4 * ((src.shape[1] + 3) // 4)
        return -(-blocks // self.BLOCKS)


class Conv2dC4Packer(Packer):
    """Conv weights ``[Cout, Cin/groups, KH, KW]`` channels-packed as ``[Cout4, KH, KW, Cin/groups, 4]``
    (see glsl/pack_conv2d.glsl)."""

    name = "conv2d_c4"
    shader = "pack_conv2d"
    layout = "conv2d_c4"
    push_nbytes = 16

    def packed_nbytes(self, src: TensorRef) -> int:
        cout, cin_g, kh, kw = src.shape
        return (cout + 3) // 4 * kh * kw * cin_g * 16

    def push_constants(self, src: TensorRef) -> bytes:
        return struct.pack("<IIII", *src.shape)

    def validate_source(self, src: TensorRef) -> None:
        if len(src.shape) != 4:
            self._mismatch(src, f"needs a 4-D [Cout, Cin/groups, KH, KW] source, got dims {src.shape}")
        if src.dtype.itemsize != 4:
            self._mismatch(src, f"needs 4-byte elements, got {src.dtype}")
        super().validate_source(src)


class TexturePacker(Packer):
    """The standard packer: an NCHW fp32 tensor (1-4 dims) into a 3-D texture, width-, height-
    or channels-packed (glsl/gather_texture.glsl, layouts in glsl/texture_layout.h)."""

    shader = "gather_texture"
    storage = "texture3d"
    push_nbytes = 60
    defines = {"SRC_TEXTURE": 0}

    def __init__(self, layout: str):
        self.layout = layout  # type: ignore[misc]
        self.name = f"texture3d_{layout}"  # type: ignore[misc]

    def make_dst(self, src: TensorRef, name: str) -> Tensor:
        return Tensor(name, src.shape, src.dtype, self.layout, constant=True, storage="texture3d")

    def packed_nbytes(self, src: TensorRef) -> int:
        return self.make_dst(src, "").nbytes

    def push_constants(self, src: TensorRef) -> bytes:
        return gather_params(self.make_dst(src, ""), Tensor("", src.shape, src.dtype))

    def work_items(self, dst: Tensor) -> int:
        return int(np.prod(dst.extents()))

    def validate_source(self, src: TensorRef) -> None:
        if not 1 <= len(src.shape) <= 4 or src.dtype != np.float32:
            self._mismatch(src, f"needs a 1-4 dim float32 source, got dims {src.shape} {src.dtype}")
        super().validate_source(src)


class QuantPacker(Packer):
    """GGML blocks (uint8 rows of whole blocks, formats in vkgraph/ggml.py), packed as they are:
    the shaders read the file's blocks (glsl/quant_blocks.h), so there is no packing shader: a
    copy, or a direct write where device memory is host-visible. The destination's logical shape
    is (rows, weights per row); its bytes are the blocks', zero-padded to whole 32-bit words."""

    host_form = True

    def __init__(self, fmt: str):
        self.name = self.layout = fmt  # type: ignore[misc]
        self.format = FORMATS[fmt]
        self.block_bytes = self.format.block_nbytes

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        out[:data.nbytes] = data
        out[data.nbytes:] = 0

    def _blocks(self, src: TensorRef) -> tuple[int, int]:
        rows, row_bytes = src.shape
        return rows, row_bytes // self.block_bytes

    def dst_shape(self, src: TensorRef) -> tuple[int, ...]:
        rows, nb = self._blocks(src)
        return (rows, nb * BLOCK_WEIGHTS)

    def packed_nbytes(self, src: TensorRef) -> int:
        return -(-src.nbytes // 4) * 4

    def make_dst(self, src: TensorRef, name: str) -> Tensor:
        return Tensor(name, self.dst_shape(src), np.dtype(np.float32), self.layout, self.packed_nbytes(src), constant=True)

    def validate_source(self, src: TensorRef) -> None:
        if src.quant != self.format.name:
            self._mismatch(src, f"its source is {src.quant or 'not quantized'!s}, not {self.format.name}")
        if len(src.shape) != 2 or src.dtype != np.uint8:
            self._mismatch(src, f"needs uint8 rows of raw blocks, got dims {src.shape} {src.dtype}")
        if src.shape[1] % self.block_bytes:
            self._mismatch(src, f"a row of {src.shape[1]} bytes is not whole {self.block_bytes}-byte blocks")
        super().validate_source(src)

    def validate(self, src: TensorRef, dst: Tensor) -> None:
        self.validate_source(src)
        if tuple(dst.shape) != self.dst_shape(src) or dst.nbytes != self.packed_nbytes(src):
            self._mismatch(src, f"destination {tuple(dst.shape)} of {dst.nbytes} bytes != {self.dst_shape(src)} "
                                f"of {self.packed_nbytes(src)} bytes")


class QuantPlanesPacker(QuantPacker):
    """GGML blocks for CPU renderers' kernels, split into two planes: every block's quants (16
    bytes of nibbles, or Q8_0's 32 int8) one after another, whole RGBA32UI texels, then every
    block's head (a 32-bit word each: d and Q4_1's m, or d in the low half), zero-padded to 16
    bytes. lavapipe runs a texel fetch as a gather, which its GEMV waits on most (5 or 9 per block
    as the file lays them out, spliced where a block is not word-aligned); from the planes a block
    is 2 or 3. The CPU writes them (no packing shader), so only where device memory is
    host-visible."""

    def __init__(self, fmt: str):
        super().__init__(fmt)
        self.name = self.layout = f"{fmt}_planes"  # type: ignore[misc]
        self.quant_bytes = self.block_bytes - self.format.head_nbytes

    def pack_host(self, src: TensorRef, data: np.ndarray, out: np.ndarray) -> None:
        # each block's quants as one opaque item (a void dtype at the block's stride), so numpy
        # copies a block a step, not a head-sized word: Q4_1 4.5 GB/s against 1.6 in words
        n, head, stride = src.nbytes // self.block_bytes, self.format.head_nbytes, (self.block_bytes,)
        data = np.ascontiguousarray(data[:src.nbytes])
        quants = np.ndarray((n,), f"V{self.quant_bytes}", data, head, stride)
        heads = np.ndarray((n,), f"u{head}", data, 0, stride)
        out[:n * self.quant_bytes].view(quants.dtype)[:] = quants
        out[n * self.quant_bytes:n * (self.quant_bytes + 4)].view(np.uint32)[:] = heads
        out[n * (self.quant_bytes + 4):] = 0

    def packed_nbytes(self, src: TensorRef) -> int:
        blocks = src.nbytes // self.block_bytes
        return -(-blocks * (self.quant_bytes + 4) // 16) * 16


PACKERS: dict[str, Packer] = {
    p.name: p
    for p in (IdentityPacker(), TransposedPacker(), Linear4x4Packer(), Conv2dC4Packer(),
              *(TexturePacker(layout) for layout in TEXTURE_LAYOUTS), *(QuantPacker(f) for f in FORMATS),
              *(QuantPlanesPacker(f) for f in FORMATS))
}


def get_packer(packer: str | Packer) -> Packer:
    if isinstance(packer, Packer):
        return packer
    try:
        return PACKERS[packer]
    except KeyError:
        raise ValueError(f"unknown packer {packer!r}; known: {', '.join(PACKERS)}") from None


#: renderers whose packing shaders give way to the CPU under ``prepack.host_packing = "auto"``
#: (the default): SwiftShader, whose shaders store lane by lane (its SIMD pointers take a vector
#: store only at offsets known when it compiles) and share the 2 cores with the load's own
#: encoding. Intel Xeon host, 2026-11-30, staged first loads against the copy floor, fresh
#: processes in turn (medians of 5): synthetic:512 0.732 s (0.52x) -> 0.438 (0.86x), synthetic:256
#: 0.381 (0.49x) -> 0.236 (0.79x), MiniLM 0.091 (0.59x) -> 0.061 (0.88x); earlier runs of the
#: packing shaders there gave synthetic:512 0.45x and 0.49x. lavapipe keeps its packing shaders
#: (synthetic:512 0.60x, host-packed 1.01x in the same run), so one of the two renderers the
#: tests run on packs on its "GPU" by default, as ET-VK does.
HOST_PACKING_RENDERERS = frozenset({"swiftshader"})


def packs_on_host(packer: Packer, host_visible_device_local: bool, cpu_renderer: bool, renderer: str,
                  host_packing: str) -> bool:
    """The policy for who packs a weight: True when the CPU writes it straight into its device
    memory (no staging, no command): weights packed by a copy (identity, GGML blocks) wherever
    device-local memory is host-visible; every packer with a host form too on a CPU renderer
    with ``prepack.host_packing = "cpu-renderer"``, and with "auto" on the renderers of
    HOST_PACKING_RENDERERS (linear_4x4 on lavapipe, 2 cores: 1.4-2.0 GB/s in the packing shader,
    2.9-4.1 GB/s in numpy split over the cores). The simulator decides with the same function."""
    if not host_visible_device_local or not packer.host_form:
        return False
    if packer.shader is None:
        return True
    if host_packing == "auto":
        return cpu_renderer and renderer in HOST_PACKING_RENDERERS
    return host_packing == "cpu-renderer" and cpu_renderer
