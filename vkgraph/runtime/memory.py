"""Memory-type selection and :class:`Buffer` (device-local, upload staging, readback)."""

from __future__ import annotations

import ctypes
import enum
import mmap
import sys
import time
from typing import Any, Callable

import numpy as np

from ..errors import OutOfDeviceMemoryError, UnsupportedFeatureError
from ._vk import call, check, ffi, lib, vk
from .device import Device
from .handle import VkObject
from .instance import (
    MEMORY_DEVICE_LOCAL,
    MEMORY_HOST_CACHED,
    MEMORY_HOST_COHERENT,
    MEMORY_HOST_VISIBLE,
    MemoryType,
    PhysicalDevice,
)


_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class BufferUsage(enum.IntFlag):
    """VkBufferUsageFlagBits that vkgraph uses (spec values)."""

    TRANSFER_SRC = 0x1
    TRANSFER_DST = 0x2
    UNIFORM_TEXEL = 0x4
    UNIFORM = 0x10
    STORAGE = 0x20


DEFAULT_USAGE = BufferUsage.STORAGE | BufferUsage.UNIFORM_TEXEL | BufferUsage.TRANSFER_SRC | BufferUsage.TRANSFER_DST


class MemoryKind(enum.Enum):
    """Where a buffer lives.

    - ``DEVICE``: device-local; host-visible too when the device allows it on its main heap
      (lavapipe, SwiftShader, most mobile GPUs), so the CPU can fill it without staging.
    - ``UPLOAD``: host-visible, coherent; for staging data the GPU reads.
    - ``READBACK``: host-visible, coherent, cached if possible; for data the CPU reads back.
    """

    DEVICE = "device"
    UPLOAD = "upload"
    READBACK = "readback"


def select_memory_type(physical: PhysicalDevice, type_bits: int, kind: MemoryKind) -> MemoryType:
    """The best memory type among ``type_bits`` (from VkMemoryRequirements) for ``kind``."""
    allowed = [t for t in physical.memory_types if type_bits & (1 << t.index)]
    heap_size = {h.index: h.size for h in physical.memory_heaps}
    host = MEMORY_HOST_VISIBLE | MEMORY_HOST_COHERENT

    if kind is MemoryKind.DEVICE:
        uma = physical.host_visible_memory_type
        for t in allowed:
            if t.index == uma:
                return t
        candidates = [t for t in allowed if t.flags & MEMORY_DEVICE_LOCAL] or allowed
        # Largest heap first; then fewer extra flags (a plain device-local type).
        return min(candidates, key=lambda t: (-heap_size[t.heap], bin(t.flags).count("1"), t.index))

    candidates = [t for t in allowed if t.flags & host == host]
    if not candidates:
        raise OutOfDeviceMemoryError(
            "vkAllocateMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY",
            f"no host-visible coherent memory type for a {kind.value} buffer",
        )
    on_uma = physical.host_visible_device_local

    def score(t: MemoryType) -> tuple:
        cached = bool(t.flags & MEMORY_HOST_CACHED)
        # Staging on a discrete GPU belongs in system RAM, not in the small BAR window.
        in_bar = bool(t.flags & MEMORY_DEVICE_LOCAL) and not on_uma
        return (in_bar, not cached if kind is MemoryKind.READBACK else False, -heap_size[t.heap], t.index)

    return min(candidates, key=score)


def _mapped_view(mapping: Any, nbytes: int) -> np.ndarray:
    return np.frombuffer(mapping, dtype=np.uint8, count=nbytes)


# A buffer's creation, binding and destruction call the loader through cffi directly (ffi.new
# structs, lib.vk*, results through _vk.check): a load makes a buffer for every weight, and the
# binding's wrappers cost more than the calls (214 buffers in one block on lavapipe: 10.4 ms
# through them, 2.2 directly).
def _create_buffer(device: Device, nbytes: int, usage: int, what: str) -> tuple[Any, Any]:
    """A VkBuffer without memory and its VkMemoryRequirements."""
    dev = device.handle
    info = ffi.new("VkBufferCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": nbytes,
                                           "usage": int(usage), "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
    out = ffi.new("VkBuffer*")
    check(lib.vkCreateBuffer(dev, info, ffi.NULL, out), "vkCreateBuffer", what)
    req = ffi.new("VkMemoryRequirements*")
    lib.vkGetBufferMemoryRequirements(dev, out[0], req)
    return out[0], req


def _destroy_buffer(dev: Any, handle: Any) -> None:
    lib.vkDestroyBuffer(dev, handle, ffi.NULL)


def _bind_buffer(dev: Any, handle: Any, memory: Any, offset: int, what: str) -> None:
    """vkBindBufferMemory; the raised error names ``what``."""
    check(lib.vkBindBufferMemory(dev, handle, memory, offset), "vkBindBufferMemory", what)


def _allocate(device: Device, nbytes: int, type_bits: int, kind: MemoryKind, what: str) -> tuple[Any, MemoryType, Any]:
    """(VkDeviceMemory, its type, its mapping or None) for ``nbytes`` of ``kind``: mapped whole
    when host-visible."""
    dev = device.handle
    mtype = select_memory_type(device.physical, type_bits, kind)
    heap = device.physical.memory_heaps[mtype.heap]
    if nbytes > heap.size:  # VUID-vkAllocateMemory-pAllocateInfo-01713
        raise OutOfDeviceMemoryError(
            "vkAllocateMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY",
            f"{what} is larger than memory heap {heap.index} ({heap.size} bytes)",
        )
    alloc = vk.VkMemoryAllocateInfo(allocationSize=nbytes, memoryTypeIndex=mtype.index)
    memory = call(vk.vkAllocateMemory, dev, alloc, None, detail=what)
    try:
        # The binding cannot pass VK_WHOLE_SIZE: map the allocation's explicit size.
        mapping = call(vk.vkMapMemory, dev, memory, 0, nbytes, 0) if mtype.flags & MEMORY_HOST_VISIBLE else None
    except BaseException:
        vk.vkFreeMemory(dev, memory, None)
        raise
    return memory, mtype, mapping


def _free(dev: Any, memory: Any, mapped: bool) -> None:
    if mapped:
        vk.vkUnmapMemory(dev, memory)
    vk.vkFreeMemory(dev, memory, None)


class Buffer(VkObject):
    """A VkBuffer bound to its own VkDeviceMemory allocation, persistently mapped when the
    memory is host-visible.

    ``view()`` gives zero-copy numpy views of the mapping; they are valid until ``destroy()``.
    With ``huge_pages``, on a CPU renderer, its pages are advised as transparent huge pages
    (:func:`advise_huge_pages`: for memory the CPU fills, such as staging).
    """

    def __init__(
        self,
        device: Device,
        nbytes: int,
        kind: MemoryKind = MemoryKind.DEVICE,
        usage: int = DEFAULT_USAGE,
        *,
        name: str = "",
        huge_pages: bool = False,
    ):
        nbytes = int(nbytes)
        what = f"buffer {name!r} of {nbytes} bytes" if name else f"buffer of {nbytes} bytes"
        if nbytes <= 0:
            raise ValueError(f"{what}: the size must be positive")
        self.device = device
        self.nbytes = nbytes
        self.kind = kind
        self.name = name

        dev = device.handle
        handle, req = _create_buffer(device, nbytes, usage, what)
        try:
            device.reserve_memory(req.size, what)
            memory, mtype, self._mapping = _allocate(device, req.size, req.memoryTypeBits, kind, what)
        except BaseException:
            _destroy_buffer(dev, handle)
            raise
        alloc_nbytes = req.size
        self.host_visible = self._mapping is not None
        if huge_pages and self.host_visible and device.is_cpu:
            advise_huge_pages(self._mapping)
        try:
            _bind_buffer(dev, handle, memory, 0, what)
        except BaseException:
            _destroy_buffer(dev, handle)
            _free(dev, memory, self.host_visible)
            raise
        self.handle = handle
        self.memory = memory
        self.memory_type = mtype
        self.alloc_nbytes = alloc_nbytes
        device.account_memory(alloc_nbytes)
        mapped = self._mapping is not None

        def release(dev=dev, handle=handle, memory=memory, mapped=mapped, nbytes=alloc_nbytes) -> None:
            device.account_memory(-nbytes)
            _destroy_buffer(dev, handle)
            _free(dev, memory, mapped)

        # `device` in the closure is the Python Device: it only carries the byte counters and
        # keeps no handle alive past its own destroy().
        self._own(device, release)

    def destroy(self) -> None:
        self._mapping = None
        super().destroy()

    def _require_mapping(self) -> Any:
        if not self.alive:
            raise ValueError(f"{self!r} is destroyed")
        if self._mapping is None:
            raise ValueError(f"{self!r} is not host-visible; copy through a staging buffer")
        return self._mapping

    def view(self, dtype: Any = np.uint8, count: int = -1, offset: int = 0) -> np.ndarray:
        """A zero-copy numpy view of the mapped memory (valid until ``destroy()``)."""
        dtype = np.dtype(dtype)
        if count < 0:
            count = (self.nbytes - offset) // dtype.itemsize
        end = offset + count * dtype.itemsize
        if offset < 0 or end > self.nbytes:
            raise ValueError(f"view [{offset}, {end}) is outside {self!r}")
        raw = _mapped_view(self._require_mapping(), self.nbytes)
        return raw[offset:end].view(dtype)

    def write(self, data: Any, offset: int = 0) -> None:
        """Copy ``data`` (anything numpy can view as bytes) into the buffer at ``offset``."""
        src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.view(np.uint8, src.nbytes, offset)[:] = src

    def read(self, dtype: Any = np.uint8, count: int = -1, offset: int = 0) -> np.ndarray:
        """A copy of the buffer's contents as ``dtype``."""
        return self.view(dtype, count, offset).copy()

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Buffer{label} {self.nbytes} B {self.kind.value}{'' if self.alive else ' destroyed'}>"


class MemoryBlock(VkObject):
    """One VkDeviceMemory allocation that several buffers are bound into (:func:`allocate_block`),
    mapped once when host-visible: many tensors, one vkAllocateMemory (ET-VK suballocates with
    VMA). Its buffers are its children: destroying it destroys them first. On a CPU renderer, with
    ``huge_pages`` its pages are advised as transparent huge pages (:func:`advise_huge_pages`),
    with ``populate`` made at once (:func:`populate_pages`; ``populate_s``: the seconds that took)."""

    def __init__(self, device: Device, nbytes: int, type_bits: int, kind: MemoryKind, what: str,
                 huge_pages: bool = False, populate: bool = False):
        self.device, self.nbytes, self.kind = device, nbytes, kind
        dev = device.handle
        self.memory, self.memory_type, self._mapping = _allocate(device, nbytes, type_bits, kind, what)
        self.host_visible = mapped = self._mapping is not None
        if huge_pages and mapped and device.is_cpu:
            advise_huge_pages(self._mapping)
        self.populate_s = 0.0
        if populate and mapped and device.is_cpu:
            t0 = time.perf_counter()
            populate_pages(self._mapping)
            self.populate_s = time.perf_counter() - t0
        self.buffers: list[BlockBuffer] = []
        device.account_memory(nbytes)

        def release(dev=dev, memory=self.memory, mapped=mapped, nbytes=nbytes) -> None:
            device.account_memory(-nbytes)
            _free(dev, memory, mapped)

        self._own(device, release)

    @property
    def in_use(self) -> bool:
        """Whether any of its buffers is alive."""
        return any(b.alive for b in self.buffers)

    def destroy(self) -> None:
        self._mapping = None
        super().destroy()


class BlockBuffer(Buffer):
    """A buffer bound at ``offset`` in a :class:`MemoryBlock`, which owns the memory and its
    mapping; destroying the buffer leaves the block's memory to the block."""

    def __init__(self, block: MemoryBlock, handle: Any, offset: int, nbytes: int, name: str):
        self.device, self.nbytes, self.kind, self.name = block.device, nbytes, block.kind, name
        dev = block.device.handle
        try:
            _bind_buffer(dev, handle, block.memory, offset, f"buffer {name!r}")
        except BaseException:
            _destroy_buffer(dev, handle)
            raise
        self.handle, self.memory, self.memory_type, self.offset = handle, block.memory, block.memory_type, offset
        self.alloc_nbytes = 0  # the block's
        self.host_visible = block.host_visible
        self._mapping = memoryview(block._mapping)[offset:offset + nbytes] if block.host_visible else None
        block.buffers.append(self)

        def release(dev=dev, handle=handle) -> None:
            _destroy_buffer(dev, handle)

        self._own(block, release)


def allocate_block(device: Device, sizes: list[tuple[int, str]], kind: MemoryKind = MemoryKind.DEVICE,
                   usage: int = DEFAULT_USAGE, huge_pages: bool = False, populate: bool = False,
                   place: Callable[[list[tuple[int, int]]], list[int]] | None = None) -> tuple[MemoryBlock, list[BlockBuffer]]:
    """Buffers of ``sizes`` ((bytes, name) each) in one new memory block, in order (``huge_pages``,
    ``populate``: see :class:`MemoryBlock`). The budget (``Device.reserve_memory``) is checked buffer by
    buffer, so a refusal names the buffer that does not fit. ``place`` puts them instead: given
    each buffer's (bytes, alignment) it returns their offsets, where buffers may share memory
    (graph/allocation.place_shared); the budget is then checked for the block."""
    dev = device.handle
    handles: list[Any] = []
    try:
        offsets, end, type_bits, needs = [], 0, ~0, []
        for nbytes, name in sizes:
            what = f"buffer {name!r} of {nbytes} bytes"
            if nbytes <= 0:
                raise ValueError(f"{what}: the size must be positive")
            handle, req = _create_buffer(device, nbytes, usage, what)
            handles.append(handle)
            type_bits &= req.memoryTypeBits
            needs.append((req.size, req.alignment))
            if place is None:
                offset = -(-end // req.alignment) * req.alignment
                device.reserve_memory(req.size, what, pending=offset)
                offsets.append(offset)
                end = offset + req.size
        if place is not None:
            offsets = place(needs)
            end = max(o + n for o, (n, _) in zip(offsets, needs))
            device.reserve_memory(end, f"memory block of {len(sizes)} buffers sharing memory, {end} bytes")
        block = MemoryBlock(device, end, type_bits, kind, f"memory block of {len(sizes)} buffers, {end} bytes",
                            huge_pages, populate)
    except BaseException:
        for handle in handles:
            _destroy_buffer(dev, handle)
        raise
    buffers: list[BlockBuffer] = []
    try:
        for i, (handle, offset, (nbytes, name)) in enumerate(zip(handles, offsets, sizes)):
            buffers.append(BlockBuffer(block, handle, offset, nbytes, name))
    except BaseException:
        for handle in handles[i + 1:]:
            _destroy_buffer(dev, handle)
        block.destroy()
        raise
    return block, buffers


_HUGE_PAGE = 2 << 20
_PAGE = mmap.PAGESIZE
#: madvise(MADV_POPULATE_WRITE) (Linux 5.14; Python's mmap module names it from 3.13 only)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)


def _madvise(mapping: Any, advice: int | None, page: int) -> None:
    """madvise(``advice``) over the whole ``page``-sized pages inside ``mapping``; best effort:
    elsewhere, or refused (an older kernel), nothing changes."""
    if advice is None or _libc is None:
        return
    from ._vk import ffi

    pointer = ffi.from_buffer(mapping)
    try:
        address, nbytes = int(ffi.cast("uintptr_t", pointer)), len(mapping)
    finally:
        ffi.release(pointer)
    start, end = -(-address // page) * page, (address + nbytes) // page * page
    if end > start:
        _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)


def advise_huge_pages(mapping: Any) -> None:
    """Ask Linux to back the whole 2 MiB pages inside ``mapping`` with transparent huge pages.
    For the mapped device memory of a CPU renderer (lavapipe, SwiftShader), which is the
    process's heap, not yet touched: first touches then fault and zero 2 MiB at a time instead of
    4 KiB (numpy advises its large arrays the same way). Best effort: elsewhere, or refused,
    nothing changes."""
    _madvise(mapping, getattr(mmap, "MADV_HUGEPAGE", None), _HUGE_PAGE)


def populate_pages(mapping: Any) -> None:
    """Make the pages of ``mapping`` present and writable now, in one call
    (``MADV_POPULATE_WRITE``), instead of a page fault at the first write of each page not backed
    yet (contents unchanged: device memory's are undefined until written). For the
    mapped device memory of a CPU renderer that a packing shader will write: its worker threads
    then store into present pages (see graph/scheduler.PrepackPlan.populates_destinations).
    Best effort, as :func:`advise_huge_pages`."""
    _madvise(mapping, _MADV_POPULATE_WRITE, _PAGE)


#: texel formats of uniform texel buffers (all mandatory for that use): bytes per texel
TEXEL_FORMATS = {"r32ui": (vk.VK_FORMAT_R32_UINT, 4), "rgba32f": (vk.VK_FORMAT_R32G32B32A32_SFLOAT, 16),
                 "rgba32ui": (vk.VK_FORMAT_R32G32B32A32_UINT, 16), "r32f": (vk.VK_FORMAT_R32_SFLOAT, 4),
                 "rg32f": (vk.VK_FORMAT_R32G32_SFLOAT, 8)}


class TexelView(VkObject):
    """A range of a buffer seen as texels of ``fmt`` (TEXEL_FORMATS) for a
    uniform texel buffer binding: shaders read it with ``texelFetch``. Destroy it before its buffer."""

    def __init__(self, buffer: Buffer, offset: int, nbytes: int, fmt: str = "r32ui"):
        device = buffer.device
        vk_format, size = TEXEL_FORMATS[fmt]
        most = device.limits["maxTexelBufferElements"] * size
        align = device.limits["minTexelBufferOffsetAlignment"]
        if nbytes <= 0 or nbytes % size or nbytes > most or offset % align or offset + nbytes > buffer.nbytes:
            raise ValueError(f"texel view of {buffer!r}: range [{offset}, {offset + nbytes}) is not whole texels "
                             f"inside the buffer, aligned to {align} and at most {most} bytes")
        self.buffer, self.offset, self.nbytes = buffer, offset, nbytes
        dev = device.handle
        # made and destroyed by ffi and lib directly: a packing dispatch takes a view (_vk.check)
        info = ffi.new("VkBufferViewCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO,
                                                   "buffer": buffer.handle, "format": vk_format, "offset": offset,
                                                   "range": nbytes})
        out = ffi.new("VkBufferView*")
        check(lib.vkCreateBufferView(dev, info, ffi.NULL, out), "vkCreateBufferView", f"texel view of {buffer!r}")
        self.handle = handle = out[0]

        def release(dev=dev, handle=handle) -> None:
            lib.vkDestroyBufferView(dev, handle, ffi.NULL)

        self._own(device, release)


HOST_ALLOCATION = 0x80  # VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


class ImportedBuffer(Buffer):
    """A buffer whose memory *is* existing host memory (VK_EXT_external_memory_host): e.g. a
    read-only file mapping, so the device reads the file's pages and nothing is copied.

    ``host`` must stay alive (and mapped) until the buffer is destroyed; ``offset`` and the
    imported size are multiples of minImportedHostPointerAlignment. ``view()``/``read()`` see the
    same pages (read-only)."""

    def __init__(self, device: Device, host: memoryview, nbytes: int, *, name: str = ""):
        from ._vk import ffi

        what = f"imported buffer {name!r}" if name else "imported buffer"
        if not device.has_external_memory_host or not device.physical.min_imported_host_pointer_alignment:
            raise UnsupportedFeatureError("VK_EXT_external_memory_host",
                                          f"{device.name} cannot import host memory (VK_EXT_external_memory_host)")
        self.device, self.nbytes, self.kind, self.name = device, int(nbytes), MemoryKind.DEVICE, name
        dev = device.handle
        keep = ffi.from_buffer(host)  # pins the mapping while the device uses its pages
        try:
            handle, memory, mtype = self._import(host, keep, what)
        except BaseException:
            # Unpin now: a traceback holding `keep` must not be what keeps the mapping's pages
            # (collecting such a cycle, cffi's buffer and the memoryview under it, crashed CPython).
            ffi.release(keep)
            raise
        self.handle, self.memory, self.memory_type, self.alloc_nbytes = handle, memory, mtype, len(host)
        self.host_visible = True
        self._mapping = host
        imported = len(host)
        device.account_memory(imported)

        def release(dev=dev, handle=handle, memory=memory, keep=keep, nbytes=imported) -> None:
            device.account_memory(-nbytes)
            _destroy_buffer(dev, handle)
            vk.vkFreeMemory(dev, memory, None)
            del keep  # the host pages may be unmapped once the device memory is gone

        self._own(device, release)

    def _import(self, host: memoryview, keep: Any, what: str) -> tuple[Any, Any, Any]:
        """Create the buffer and import ``host`` (pinned by ``keep``) as its memory: (buffer,
        memory, memory type)."""
        from ._vk import ffi

        device, dev = self.device, self.device.handle
        align = device.physical.min_imported_host_pointer_alignment
        pointer = ffi.cast("char *", keep)
        if int(ffi.cast("uintptr_t", pointer)) % align or len(host) % align or not 0 < self.nbytes <= len(host):
            raise ValueError(f"{what}: host range of {len(host)} bytes is not aligned to {align} or smaller "
                             f"than {self.nbytes}")
        external = vk.VkExternalMemoryBufferCreateInfo(handleTypes=HOST_ALLOCATION)
        info = vk.VkBufferCreateInfo(pNext=external, size=self.nbytes, usage=int(DEFAULT_USAGE),
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        handle = call(vk.vkCreateBuffer, dev, info, None, detail=what)
        try:
            props = ffi.new("VkMemoryHostPointerPropertiesEXT*")
            # The binding leaves this output struct's sType unset; the validation layer checks it.
            props.sType = vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT
            call(device.extension_function("vkGetMemoryHostPointerPropertiesEXT"), dev, HOST_ALLOCATION, pointer, props)
            req = call(vk.vkGetBufferMemoryRequirements, dev, handle)
            mtype = select_memory_type(device.physical, req.memoryTypeBits & props.memoryTypeBits, MemoryKind.DEVICE)
            device.reserve_memory(len(host), what)
            import_info = vk.VkImportMemoryHostPointerInfoEXT(handleType=HOST_ALLOCATION, pHostPointer=pointer)
            alloc = vk.VkMemoryAllocateInfo(pNext=import_info, allocationSize=len(host), memoryTypeIndex=mtype.index)
            memory = call(vk.vkAllocateMemory, dev, alloc, None, detail=what)
        except BaseException:
            _destroy_buffer(dev, handle)
            raise
        try:
            _bind_buffer(dev, handle, memory, 0, what)
        except BaseException:
            _destroy_buffer(dev, handle)
            vk.vkFreeMemory(dev, memory, None)
            raise
        return handle, memory, mtype
