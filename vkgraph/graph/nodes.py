"""Prepack nodes (upload + pack one constant) and dispatch nodes (one compute dispatch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..runtime import CommandBuffer, DescriptorPool
from .packers import Packer
from .staging import StagingRegion, align_up
from .values import Tensor, TensorRef, ValueRef

if TYPE_CHECKING:
    from .compute_graph import ComputeGraph


def dispatch_groups(work_items: int, local_size: int, max_groups: int) -> int:
    """Workgroups for a grid-stride kernel covering ``work_items`` invocations."""
    return max(1, min((work_items + local_size - 1) // local_size, max_groups))


PACK_LOCAL_SIZE = 64


@dataclass
class PrepackNode:
    """Copy a TensorRef's bytes to staging and pack them into a device tensor."""

    src: ValueRef
    dst: ValueRef
    packer: Packer
    direct: bool  # identity packer on host-visible device memory: no staging, no command

    def staging_nbytes(self, graph: ComputeGraph) -> int:
        return 0 if self.direct else graph.values[self.src].nbytes

    def encode(self, graph: ComputeGraph, cmd: CommandBuffer, region: StagingRegion | None,
               pool: DescriptorPool | None) -> int:
        """Allocate the destination, stage and record the packing; returns dispatches recorded."""
        src: TensorRef = graph.values[self.src]
        dst: Tensor = graph.values[self.dst]
        dst.buffer = graph._allocate(dst)
        data = src.source.read()
        dispatches = 0
        if self.direct:
            dst.buffer.write(data)
        else:
            assert region is not None
            offset = region.write(data, graph.staging_alignment)
            if self.packer.shader is None:
                cmd.copy_buffer(region.buffer, dst.buffer, data.nbytes, src_offset=offset)
            else:
                kernel = graph.kernel(self.packer.shader, 2, self.packer.push_nbytes, {0: PACK_LOCAL_SIZE},
                                      self.packer.defines)
                dset = pool.allocate(kernel.set_layout)
                # Shaders read 32-bit words: bind whole words (the region keeps the padding).
                dset.bind_buffers({0: (region.buffer, offset, align_up(data.nbytes, 4)), 1: dst.buffer})
                cmd.bind_pipeline(kernel.pipeline)
                cmd.bind_descriptor_sets(kernel.layout, [dset])
                cmd.push_constants(kernel.layout, self.packer.push_constants(src))
                groups = dispatch_groups(self.packer.work_items(dst), PACK_LOCAL_SIZE, graph.max_groups_x)
                cmd.dispatch(groups)
                dispatches = 1
        del data
        src.readers -= 1
        if src.readers == 0:
            src.source.release()
        return dispatches


@dataclass
class DispatchNode:
    """One compute dispatch: tensors bound to bindings 0..n-1 in order, push constants,
    specialization constants (constant 0 is the local size x) and a workgroup count."""

    shader: str
    args: list[ValueRef]
    push: bytes = b""
    spec: dict[int, int | float | bool] = field(default_factory=dict)
    groups: tuple[int, int, int] = (1, 1, 1)
    defines: dict[str, object] = field(default_factory=dict)

    def encode(self, graph: ComputeGraph, cmd: CommandBuffer, pool: DescriptorPool) -> None:
        kernel = graph.kernel(self.shader, len(self.args), len(self.push), self.spec, self.defines)
        dset = pool.allocate(kernel.set_layout)
        dset.bind_buffers({i: graph.values[ref].buffer for i, ref in enumerate(self.args)})
        cmd.bind_pipeline(kernel.pipeline)
        cmd.bind_descriptor_sets(kernel.layout, [dset])
        if self.push:
            cmd.push_constants(kernel.layout, self.push)
        cmd.dispatch(*self.groups)
        cmd.compute_barrier()
