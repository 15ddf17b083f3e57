"""Prepack nodes (upload + pack one constant) and dispatch nodes (one compute dispatch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..runtime import CommandBuffer, DescriptorPool, DescriptorType
from .kernels import kernel_key
from .packers import Packer
from .scheduler import align_up
from .staging import StagingRegion, StagingRing
from .values import Tensor, TensorRef, ValueRef
from .windows import row_windows

if TYPE_CHECKING:
    from ..runtime import Buffer, TexelView
    from .compute_graph import ComputeGraph
    from .kernels import Kernel


def dispatch_groups(work_items: int, local_size: int, max_groups: int) -> int:
    """Workgroups for a grid-stride kernel covering ``work_items`` invocations."""
    return max(1, min((work_items + local_size - 1) // local_size, max_groups))


def grid_groups(work_items: int, local_size: int, max_groups: int) -> tuple[int, int, int]:
    """Workgroups (x, y, 1) giving each of ``work_items`` an invocation of its own, for a kernel
    without a grid-stride loop: item ``gid.y * (groups.x * local_size) + gid.x``, those past
    ``work_items`` idle. Rows of ``max_groups`` x groups where one row would not do."""
    groups = max(1, -(-work_items // local_size))
    x = min(groups, max_groups)
    return x, -(-groups // x), 1


PACK_LOCAL_SIZE = 64


def packer_bindings(packer: Packer, texel: bool = False) -> tuple[DescriptorType, DescriptorType]:
    """(source, destination) binding types of a packing shader (``texel``: it reads the source
    as texels, Packer.texel_source)."""
    dst = DescriptorType.STORAGE_IMAGE if packer.storage == "texture3d" else DescriptorType.STORAGE_BUFFER
    return DescriptorType.UNIFORM_TEXEL_BUFFER if texel else DescriptorType.STORAGE_BUFFER, dst


@dataclass
class PrepackNode:
    """Copy a TensorRef's bytes to staging and pack them into a device tensor."""

    src: ValueRef
    dst: ValueRef
    packer: Packer
    direct: bool  # the CPU packs it straight into host-visible device memory (packers.packs_on_host)

    def staging_nbytes(self, graph: ComputeGraph) -> int:
        return 0 if self.direct else graph.values[self.src].nbytes

    def kernel(self, graph: ComputeGraph, texel: bool = False) -> Kernel:
        p = self.packer
        return graph.kernels.get(p.shader, packer_bindings(p, texel), p.push_nbytes, {0: PACK_LOCAL_SIZE},
                                 p.defines | p.device_defines(graph.device) | {"TEXEL": int(texel)})

    def windows(self, graph: ComputeGraph) -> list[tuple[int, int] | None]:
        """The packing dispatches: one (None) when source and destination fit one binding,
        else row windows that do (only shader packers bind, so only they need this). A source
        the packer reads as texels (Packer.texel_source) gets windows whose source fits a texel
        buffer where the device's are smaller than a binding (SwiftShader: 1 MiB of RGBA32UI)."""
        src: TensorRef = graph.values[self.src]
        dst: Tensor = graph.values[self.dst]
        bound = align_up(src.nbytes, 4) if dst.storage == "texture3d" else max(align_up(src.nbytes, 4), dst.nbytes)
        most = graph.max_binding_nbytes
        if self.packer.shader is not None and self.packer.texel_source(src) and graph.device is not None:
            most = min(most, graph.device.limits["maxTexelBufferElements"] * 16)
        if self.packer.shader is None or bound <= most:
            return [None]
        rows, src_row, dst_row, unit = self.packer.row_layout(src)
        try:
            return row_windows(rows, (src_row, dst_row), most, graph.staging_alignment, unit)
        except ValueError:  # rows too long for a texel buffer: storage-buffer windows
            return row_windows(rows, (src_row, dst_row), graph.max_binding_nbytes, graph.staging_alignment, unit)

    def src_window(self, graph: ComputeGraph, window: tuple[int, int] | None) -> tuple[int, int]:
        """(offset from the staged source's start, bytes) the dispatch of ``window`` reads."""
        src: TensorRef = graph.values[self.src]
        nbytes = align_up(src.nbytes, 4)  # shaders read whole words; the staging region keeps the padding
        if window is None:
            return 0, nbytes
        _rows, src_row, _dst_row, _unit = self.packer.row_layout(src)
        return window[0] * src_row, min(align_up((window[1] - window[0]) * src_row, 4), nbytes - window[0] * src_row)

    def texel(self, graph: ComputeGraph, window: tuple[int, int] | None) -> bool:
        """Whether the dispatch of ``window`` reads its source as texels: the packer can, and the
        device takes a texel buffer of that range (staging offsets keep its alignment)."""
        if not self.packer.texel_source(graph.values[self.src]):
            return False
        lim, (at, nbytes) = graph.device.limits, self.src_window(graph, window)
        align = lim["minTexelBufferOffsetAlignment"]
        return graph.staging_alignment % align == 0 and at % align == 0 and nbytes // 16 <= lim["maxTexelBufferElements"]

    def dispatch_kinds(self, graph: ComputeGraph) -> list[bool]:
        """Per packing dispatch, whether it reads its source as texels (none: no shader, or direct)."""
        if self.packer.shader is None or self.direct:
            return []
        return [self.texel(graph, w) for w in self.windows(graph)]

    def encode(self, graph: ComputeGraph, cmd: CommandBuffer | None, region: StagingRegion | None,
               pool: DescriptorPool | None, ring: StagingRing | None) -> int:
        """Allocate the destination, stage and record the packing (a direct node: write it, with
        no command buffer); returns dispatches recorded. The texel views its dispatches read are
        the staging ring's (``ring.texel_view``). The caller releases the source (after its last
        reader)."""
        src: TensorRef = graph.values[self.src]
        dst: Tensor = graph.values[self.dst]
        resource = dst.resource or graph.memory.allocate(dst)  # its batch's memory block, where it has one
        data = src.source.read()
        dispatches = 0
        if self.direct:
            self.packer.pack_host(src, data, dst.buffer.view())
        else:
            assert region is not None and cmd is not None
            offset = region.write(data, graph.staging_alignment)
            if self.packer.shader is None:
                # the staged word padding too where the destination has it (GGML blocks)
                cmd.copy_buffer(region.buffer, dst.buffer, min(align_up(data.nbytes, 4), dst.nbytes), src_offset=offset)
            else:
                if dst.image is not None:
                    cmd.prepare_image(dst.image)
                for window in self.windows(graph):
                    texel = self.texel(graph, window)
                    kernel = self.kernel(graph, texel)
                    at, nbytes = self.src_window(graph, window)
                    src_bind = ring.texel_view(region.buffer, offset + at, nbytes, "rgba32ui") if texel else \
                        (region.buffer, offset + at, nbytes)
                    if window is None:
                        dst_bind = resource
                        push, work = self.packer.push_constants(src), self.packer.work_items(dst)
                    else:
                        r0, r1 = window
                        _rows, _src_row, dst_row, unit = self.packer.row_layout(src)
                        dst_bind = (dst.buffer, r0 * dst_row, min(align_up(r1 - r0, unit) * dst_row, dst.nbytes - r0 * dst_row))
                        push, work = self.packer.window_push(src, r0, r1), self.packer.window_work(src, r0, r1)
                    dset = pool.allocate(kernel.set_layout)
                    dset.bind({0: src_bind, 1: dst_bind})
                    cmd.bind_pipeline(kernel.pipeline)
                    cmd.bind_descriptor_sets(kernel.layout, [dset])
                    cmd.push_constants(kernel.layout, push)
                    cmd.dispatch(dispatch_groups(work, PACK_LOCAL_SIZE, graph.max_groups_x))
                    dispatches += 1
        return dispatches


@dataclass
class DispatchNode:
    """One compute dispatch: tensors bound to bindings 0..n-1 in order (a ``(ref, offset,
    nbytes)`` argument binds a window of the tensor's buffer), push constants, specialization
    constants (constant 0 is the local size x) and a workgroup count."""

    shader: str
    args: list[ValueRef | tuple[ValueRef, int, int]]
    push: bytes = b""
    spec: dict[int, int | float | bool] = field(default_factory=dict)
    groups: tuple[int, int, int] = (1, 1, 1)
    defines: dict[str, object] = field(default_factory=dict)
    #: bindings read as uniform texel buffers (``texelFetch``) instead of storage buffers, with the
    #: texel format of each (runtime.memory.TEXEL_FORMATS: "r32ui", "r32f", "rg32f" for vec2s, "rgba32f" for vec4s)
    texels: dict[int, str] = field(default_factory=dict)
    #: the entry point that runs it (ComputeGraph.entry; set by add_dispatch)
    entry: str = ""
    #: for the run model (tools/simulate_run.py): how many times the dispatch streams its weight
    #: (binding 2): a linear reads it once per tile of tokens; 0: no weight
    weight_passes: int = 0
    #: for the run model: the weights a linear streams, of one format and shape (binding 2, and
    #: a gated linear's binding 3)
    weights: int = 1
    #: for the run model: a linear's tokens, weight rows (of this window; of all its weights) and inputs
    linear_shape: tuple[int, int, int] = (0, 0, 0)
    #: for the run model: the invocations a linear's or attention's dispatch has (its work items);
    #: 0: not given
    invocations: int = 0
    #: for the run model: the bytes the dispatch moves where that is not every binding whole (a
    #: key/value cache written a few rows at a time); -1: every binding whole
    moved_nbytes: int = -1
    #: for the run model: attention's kernel rows per query token (its heads, or the groups of
    #: heads sharing a key/value head that one invocation takes), each of which reads every key
    #: the token sees; 0: not attention
    key_rows: int = 0

    def tensors(self, graph: ComputeGraph) -> list[Tensor]:
        return [graph.values[a[0] if isinstance(a, tuple) else a] for a in self.args]

    def binding_types(self, graph: ComputeGraph) -> tuple[DescriptorType, ...]:
        """Storage images for texture tensors, uniform texel buffers for ``texels``, storage
        buffers for the rest."""
        return tuple(DescriptorType.STORAGE_IMAGE if t.storage == "texture3d" else
                     DescriptorType.UNIFORM_TEXEL_BUFFER if i in self.texels else DescriptorType.STORAGE_BUFFER
                     for i, t in enumerate(self.tensors(graph)))

    def kernel_key(self, graph: ComputeGraph) -> tuple:
        """Its pipeline's key (kernels.kernel_key): dispatches with the same one share a pipeline."""
        return kernel_key(self.shader, self.binding_types(graph), len(self.push), self.spec, self.defines)

    def kernel(self, graph: ComputeGraph) -> Kernel:
        return graph.kernels.get(self.shader, self.binding_types(graph), len(self.push), self.spec, self.defines)

    def encode(self, graph: ComputeGraph, cmd: CommandBuffer, pool: DescriptorPool,
               texel_view: Callable[[Buffer, int, int, str], TexelView] | None = None, *,
               no_groups: bool = False) -> None:
        """Record the dispatch; ``texel_view(buffer, offset, nbytes, fmt)`` gives the views of the
        ``texels`` bindings (owned by the caller). ``no_groups``: bound as for the dispatch, then
        dispatched with no workgroups (CommandBuffer.dispatch_no_groups)."""
        kernel = self.kernel(graph)
        for t in self.tensors(graph):
            if t.image is not None:
                cmd.prepare_image(t.image)
        dset = pool.allocate(kernel.set_layout)
        resources = {}
        for i, a in enumerate(self.args):
            ref, off, nbytes = a if isinstance(a, tuple) else (a, 0, graph.values[a].nbytes)
            t = graph.values[ref]
            if i in self.texels:
                resources[i] = texel_view(t.buffer, off, nbytes, self.texels[i])
            else:
                resources[i] = (t.buffer, off, nbytes) if isinstance(a, tuple) else t.resource
        dset.bind(resources)
        cmd.bind_pipeline(kernel.pipeline)
        cmd.bind_descriptor_sets(kernel.layout, [dset])
        if self.push:
            cmd.push_constants(kernel.layout, self.push)
        if no_groups:
            cmd.dispatch_no_groups()
        else:
            cmd.dispatch(*self.groups)
        cmd.compute_barrier()  # also after no workgroups: synchronization validation counts the dispatch's accesses
