"""Staging memory for prepack: a ring of reusable host-visible memory.

Each command buffer (batch) reserves one contiguous region for the bytes its nodes stage. A
region is reused only after the fence of the batch that read it has signalled; the CPU waits
(on the oldest batch first) only when a new reservation would overlap a live region, i.e. when
the ring is full. A batch larger than the whole ring gets a buffer of its own, freed when its
fence signals; before allocating one, the CPU waits for the previous such batch, so that the
staging allocated stays within the ring plus the largest oversized batch.

Two peaks are kept: ``allocated_peak_nbytes`` (ring plus oversized buffers, what the device holds)
and ``in_flight_peak_nbytes``, the high-water mark of bytes in flight: regions whose batch is not
known to be finished (not submitted, or its fence unsignalled when polled). Bytes in flight only
grow when a region is reserved, so sampling there, after the wait, gives the exact high-water mark
as the CPU sees it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..runtime import DEFAULT_TIMEOUT_S, Buffer, BufferUsage, Device, Fence, MemoryKind, TexelView
from .scheduler import align_up


@dataclass
class StagingRegion:
    buffer: Buffer
    offset: int
    nbytes: int
    used: int = 0

    def take(self, nbytes: int, alignment: int) -> int:
        """Offset (in ``buffer``) of the next ``nbytes`` of this region."""
        start = align_up(self.used, alignment)
        nbytes = align_up(nbytes, 4)  # whole words, for shaders that read uint[]
        if start + nbytes > self.nbytes:
            raise AssertionError(f"staging region of {self.nbytes} bytes overflows ({start} + {nbytes})")
        self.used = start + nbytes
        return self.offset + start

    def write(self, data: np.ndarray, alignment: int) -> int:
        """Stage ``data`` at an ``alignment``-aligned offset, zero-padded to a whole word."""
        offset = self.take(data.nbytes, alignment)
        self.buffer.write(data, offset)
        pad = -data.nbytes % 4
        if pad:
            self.buffer.view(np.uint8, pad, offset + data.nbytes)[:] = 0
        return offset


STAGING_USAGE = BufferUsage.STORAGE | BufferUsage.UNIFORM_TEXEL | BufferUsage.TRANSFER_SRC  # texel: packers' sources


class StagingRing:
    """``capacity`` bytes of host-visible staging, reused as batches complete."""

    def __init__(self, device: Device, capacity: int, alignment: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                 *, huge_pages: bool = False):
        self.device = device
        self.timeout_s = timeout_s
        self.alignment = alignment
        self.capacity = align_up(max(capacity, alignment), alignment)
        # huge_pages: advised on CPU renderers (runtime.memory.advise_huge_pages), where the
        # plan asks for it (scheduler.PrepackPlan.staging_huge_pages)
        self.buffer = Buffer(device, self.capacity, MemoryKind.UPLOAD, STAGING_USAGE, name="staging ring",
                             huge_pages=huge_pages)
        self._head = 0
        self._live: deque[tuple[int, int, Fence | None]] = deque()  # (start, end, fence)
        self._own: list[tuple[Buffer, Fence | None, int]] = []  # oversized batches' buffers, region bytes
        self._views: dict[int, list[TexelView]] = {}  # id(buffer) -> texel views of it (packers' sources)
        self.live_nbytes = self.capacity
        self.allocated_peak_nbytes = self.capacity
        self.in_flight_peak_nbytes = 0
        self.waits: list[tuple[float, float]] = []  # perf_counter spans the CPU blocked

    def reserve(self, nbytes: int) -> StagingRegion:
        """A region for a batch staging ``nbytes`` (padded for per-node alignment by the caller)."""
        nbytes = align_up(max(nbytes, 1), self.alignment)
        self._collect_own()
        if nbytes > self.capacity:
            self._retire_own()
            buf = Buffer(self.device, nbytes, MemoryKind.UPLOAD, STAGING_USAGE, name="staging (oversized batch)")
            self._own.append((buf, None, nbytes))
            self.live_nbytes += buf.nbytes
            self.allocated_peak_nbytes = max(self.allocated_peak_nbytes, self.live_nbytes)
            self._sample_in_flight()
            return StagingRegion(buf, 0, nbytes)
        while True:
            start = self._head if self._head + nbytes <= self.capacity else 0
            end = start + nbytes
            if not any(s < end and start < e for s, e, _ in self._live):
                break
            self._retire_oldest()
        self._live.append((start, end, None))
        self._head = end
        self._sample_in_flight()
        return StagingRegion(self.buffer, start, nbytes)

    def texel_view(self, buffer: Buffer, offset: int, nbytes: int, fmt: str) -> TexelView:
        """A texel view of staging (``buffer``: the ring's or an oversized batch's), destroyed
        right before that buffer is."""
        view = TexelView(buffer, offset, nbytes, fmt)
        self._views.setdefault(id(buffer), []).append(view)
        return view

    def _free(self, buf: Buffer) -> None:
        for view in self._views.pop(id(buf), ()):
            view.destroy()
        buf.destroy()

    def in_flight_nbytes(self) -> int:
        """Staging bytes whose batch is not known to be finished, polling the fences now."""
        busy = lambda f: f is None or not f.is_signaled()  # noqa: E731
        return (sum(e - s for s, e, f in self._live if busy(f))
                + sum(n for _, f, n in self._own if busy(f)))

    def _sample_in_flight(self) -> None:
        self.in_flight_peak_nbytes = max(self.in_flight_peak_nbytes, self.in_flight_nbytes())

    def attach(self, region: StagingRegion, fence: Fence) -> None:
        """The batch that uses ``region`` was submitted with ``fence``."""
        if region.buffer is not self.buffer:
            self._own = [(b, fence if b is region.buffer else f, n) for b, f, n in self._own]
            return
        for i, (s, e, f) in enumerate(self._live):
            if s == region.offset and f is None:
                self._live[i] = (s, e, fence)
                return
        raise AssertionError("attach: region not reserved")

    def _wait(self, fence: Fence) -> None:
        if not fence.is_signaled():
            t0 = time.perf_counter()
            fence.wait(self.timeout_s)
            self.waits.append((t0, time.perf_counter()))

    def _retire_oldest(self) -> None:
        s, e, fence = self._live.popleft()
        if fence is None:
            raise AssertionError("the staging ring is full of regions that were never submitted")
        self._wait(fence)

    def _retire_own(self) -> None:
        """Wait for every oversized batch's buffer and free it."""
        for buf, fence, _ in self._own:
            if fence is None:
                raise AssertionError("an oversized staging buffer was never submitted")
            self._wait(fence)
            self.live_nbytes -= buf.nbytes
            self._free(buf)
        self._own.clear()

    def _collect_own(self) -> None:
        keep = []
        for buf, fence, n in self._own:
            if fence is not None and fence.is_signaled():
                self.live_nbytes -= buf.nbytes
                self._free(buf)
            else:
                keep.append((buf, fence, n))
        self._own = keep

    def destroy(self, wait: bool = True) -> None:
        """Free the staging (``wait=False``: the caller already waited for the device)."""
        for _buf, fence, _ in self._own if wait else ():
            if fence is not None:
                self._wait(fence)
        for _s, _e, fence in self._live if wait else ():
            if fence is not None:
                self._wait(fence)
        for buf, _, _ in self._own:
            self._free(buf)
        self._own.clear()
        self._live.clear()
        self._free(self.buffer)
