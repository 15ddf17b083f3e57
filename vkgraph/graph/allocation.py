"""Device memory of a graph's tensors: allocated when a tensor needs it, freed with the graph.

Weights get memory when their prepack batch is encoded (or from the packed-weight cache): a
batch's buffers share memory blocks of at most BLOCK_NBYTES (one vkAllocateMemory for many
tensors); intermediates and the host staging of inputs and outputs get theirs when execute is
encoded. With ``execute.memory_planning`` (the default) the intermediates that live between two
dispatches of one entry point share one block, each at an offset no tensor live at the same
time uses (ET-VK's exported programs plan their memory the same way): SmolLM2's 665
intermediates (its one-token step and its 64- and 32-token prompt entry points), 66 MiB side by
side, fit one block of 0.66 MiB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..runtime import Buffer, Device, Image3D, MemoryBlock, MemoryKind, OneShot, allocate_block
from .values import Tensor

if TYPE_CHECKING:
    from .compute_graph import ComputeGraph

#: the most bytes of one memory block of several weights (a larger weight gets a block of its own).
#: Under glibc's largest mmap threshold (32 MiB): on CPU renderers, whose device memory is the
#: process's heap, a later load can then get the pages an earlier one freed
BLOCK_NBYTES = 16 << 20


def shared_lifetimes(graph: ComputeGraph) -> dict[int, tuple[int, int]]:
    """The tensors that may share memory, each with its lifetime: the first and last of the
    graph's execute nodes binding it (or a view of it). Left out, with memory of their own:
    weights, textures, graph inputs and outputs, ``state`` tensors (their contents carry from
    one execute to the next), tensors bound by dispatches of more than one entry point, and
    tensors no later dispatch reads (results a caller may read back with ``read_tensor``).
    Every dispatch is followed by a barrier, so a tensor may take the memory of one whose
    last reader came before its first writer."""
    def root(ref: int) -> int:
        view_of = graph.values[ref].view_of
        return ref if view_of is None else view_of

    first: dict[int, int] = {}
    last: dict[int, int] = {}
    entry: dict[int, str] = {}
    mixed: set[int] = set()
    for i, node in enumerate(graph.execute_nodes):
        for a in node.args:
            ref = root(a[0] if isinstance(a, tuple) else a)
            first.setdefault(ref, i)
            last[ref] = i
            if entry.setdefault(ref, node.entry) != node.entry:
                mixed.add(ref)
    io = {root(io.tensor) for io in (*graph.inputs.values(), *graph.outputs.values())}
    shared = {}
    for ref, i in first.items():
        t = graph.values[ref]
        if (isinstance(t, Tensor) and not t.constant and not t.state and t.storage == "buffer" and t.resource is None
                and ref not in io and ref not in mixed and last[ref] > i):
            shared[ref] = (i, last[ref])
    return shared


def place_shared(needs: list[tuple[int, int]], lifetimes: list[tuple[int, int]]) -> list[int]:
    """Offsets for buffers of ``needs`` ((bytes, alignment) each) live over ``lifetimes``
    ((first, last) node each): largest first, each at the lowest aligned offset where it overlaps
    no buffer placed before it whose lifetime overlaps its own (greedy, as ET-VK's exporter)."""
    offsets = [0] * len(needs)
    placed: list[tuple[int, int, int, int]] = []  # offset, end, first, last
    for i in sorted(range(len(needs)), key=lambda i: -needs[i][0]):
        (nbytes, align), (first, last) = needs[i], lifetimes[i]
        at = 0
        for start, end in sorted((o, e) for o, e, f, l in placed if f <= last and first <= l):
            if at + nbytes <= start:
                break
            at = max(at, -(-end // align) * align)
        offsets[i] = at
        placed.append((at, at + nbytes, first, last))
    return offsets


class TensorMemory:
    """Owns every buffer, image and memory block it gives a graph's tensors."""

    def __init__(self, device: Device, timeout_s: float):
        self.device = device
        self.timeout_s = timeout_s
        self._resources: list[Buffer | Image3D | MemoryBlock] = []

    def allocate_blocks(self, tensors: Iterable[tuple[Tensor, bool]], populate: bool = False,
                        huge_pages: bool = True, populated_huge_pages: bool = False) -> float:
        """Buffers for the buffer tensors among ``tensors`` ((tensor, whether the CPU writes it)
        pairs) that have no memory yet, in order, in as few memory blocks of at most BLOCK_NBYTES
        as that takes (a larger tensor: a block of its own). With ``huge_pages`` (the policy:
        scheduler.PrepackPlan.direct_huge_pages), blocks of tensors the CPU writes are advised as
        huge pages on CPU renderers. With ``populate``, blocks of tensors a shader writes get their
        pages at once, on the CPU (runtime.memory.populate_pages; the policy:
        scheduler.PrepackPlan.populates_destinations), as huge pages with ``populated_huge_pages``
        (PrepackPlan.populated_huge_pages); otherwise never: the packing shaders' first touch of
        fresh huge pages made synthetic:512's default loads slower on this VM (0.35..0.41x the
        copy floor against 0.49..0.53x). The two kinds fill blocks apart, so a batch that
        alternates them (MiniLM: a bias the CPU writes after each packed weight) still gets a few
        blocks, not one per tensor. Returns the seconds populating took (MemoryBlock.populate_s)."""
        groups: dict[bool, list[Tensor]] = {False: [], True: []}
        nbytes = {False: 0, True: 0}
        populate_s = 0.0

        def block(cpu: bool) -> float:
            return self._block(groups[cpu], huge_pages if cpu else populate and populated_huge_pages, populate and not cpu)

        for t, cpu in tensors:
            if t.storage != "buffer" or t.resource is not None:
                continue
            if groups[cpu] and nbytes[cpu] + t.nbytes > BLOCK_NBYTES:
                populate_s += block(cpu)
                groups[cpu], nbytes[cpu] = [], 0
            groups[cpu].append(t)
            nbytes[cpu] += t.nbytes
        return populate_s + sum(block(cpu) for cpu in groups)

    def _block(self, tensors: list[Tensor], huge_pages: bool = False, populate: bool = False, place=None) -> float:
        """One memory block for ``tensors``; returns the seconds populating it took."""
        if not tensors:
            return 0.0
        block, buffers = allocate_block(self.device, [(t.nbytes, t.name) for t in tensors], huge_pages=huge_pages,
                                        populate=populate, place=place)
        self._resources.append(block)
        for t, buf in zip(tensors, buffers):
            t.buffer = buf
        return block.populate_s

    def allocate_shared(self, tensors: list[Tensor], lifetimes: list[tuple[int, int]]) -> None:
        """Buffers for ``tensors`` in one memory block, placed by their ``lifetimes``
        (:func:`place_shared`)."""
        self._block(tensors, place=lambda needs: place_shared(needs, lifetimes))

    def allocate(self, tensor: Tensor) -> Buffer | Image3D:
        """Device memory for ``tensor``: a buffer, or an image for texture storage."""
        if tensor.storage == "texture3d":
            res: Buffer | Image3D = Image3D(self.device, tensor.extents(), name=tensor.name)
            tensor.image = res
        else:
            res = tensor.buffer = Buffer(self.device, tensor.nbytes, MemoryKind.DEVICE, name=tensor.name)
        self._resources.append(res)
        return res

    def adopt(self, tensor: Tensor, buffer: Buffer) -> None:
        """Give ``tensor`` a buffer made elsewhere (an imported cache region); freed with the rest."""
        tensor.buffer = buffer
        self._resources.append(buffer)

    def staging(self, nbytes: int, kind: MemoryKind, name: str) -> Buffer:
        """Host-visible memory for a graph input or output."""
        buf = Buffer(self.device, nbytes, kind, name=name)
        self._resources.append(buf)
        return buf

    def upload(self, tensor: Tensor, data: np.ndarray) -> None:
        """Give ``tensor`` a device buffer holding ``data``: written in place when device memory
        is host-visible, else copied through a staging buffer."""
        buf = Buffer(self.device, tensor.nbytes, MemoryKind.DEVICE, name=tensor.name)
        try:
            if buf.host_visible:
                buf.write(data)
            else:
                with Buffer(self.device, tensor.nbytes, MemoryKind.UPLOAD) as up:
                    up.write(data)
                    with OneShot(self.device, self.timeout_s) as cmd:
                        cmd.copy_buffer(up, buf, tensor.nbytes)
                        cmd.compute_barrier()
        except BaseException:
            buf.destroy()
            raise
        self.adopt(tensor, buf)

    def read(self, tensor: Tensor) -> np.ndarray:
        """A copy of ``tensor``'s bytes (a texture's raw texels: RGBA32F, x fastest)."""
        if tensor.buffer is not None and tensor.buffer.host_visible:
            return tensor.buffer.read(np.uint8, tensor.nbytes)
        with Buffer(self.device, tensor.nbytes, MemoryKind.READBACK) as rb:
            with OneShot(self.device, self.timeout_s) as cmd:
                cmd.compute_barrier()
                if tensor.image is not None:
                    cmd.copy_image_to_buffer(tensor.image, rb)
                else:
                    cmd.copy_buffer(tensor.buffer, rb, tensor.nbytes)
                cmd.host_read_barrier()
            return rb.read(np.uint8, tensor.nbytes)

    def free(self, tensors: Iterable[Tensor]) -> None:
        """Free the memory of ``tensors`` (a failed load's packed weights), and the blocks none
        of whose buffers is left."""
        for t in tensors:
            if t.resource is not None:
                t.resource.destroy()
                t.buffer = t.image = None
        for r in self._resources:
            if isinstance(r, MemoryBlock) and not r.in_use:
                r.destroy()
        self._resources = [r for r in self._resources if r.alive]

    def destroy(self, tensors: Iterable[Tensor]) -> None:
        """Free everything; ``tensors`` (all of the graph's) forget their memory."""
        for res in self._resources:
            res.destroy()
        self._resources.clear()
        for t in tensors:
            t.buffer = t.image = None
