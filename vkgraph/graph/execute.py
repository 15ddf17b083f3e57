"""Execute (ARCHITECTURE.md §3 step 8): the model's dispatches in command buffers recorded once
(split by the execute thresholds, ``scheduler.execute_cut_points``) and resubmitted on every run,
with the inputs copied in at the start and the outputs copied out at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from ..errors import DeviceLostError, FenceTimeoutError
from ..runtime import CommandPool, DescriptorPool, DescriptorType, Fence, MemoryKind, submit_and_wait
from .scheduler import batches, execute_cut_points
from .values import Tensor

if TYPE_CHECKING:
    from .compute_graph import ComputeGraph


class ExecutePlan:
    """The recorded execute command buffers of a prepacked graph."""

    def __init__(self, graph: ComputeGraph):
        """Bind memory for every non-constant tensor and the IO staging, and record the command
        buffers."""
        self.graph = graph
        g = graph
        for v in g.values:
            if isinstance(v, Tensor) and v.resource is None and not v.constant and v.view_of is None:
                g.memory.allocate(v)
        for v in g.values:
            if isinstance(v, Tensor) and v.view_of is not None:
                v.buffer = g.values[v.view_of].buffer
        for io in g.inputs.values():
            io.buffer = g.memory.staging(g.values[io.tensor].nbytes, MemoryKind.UPLOAD, f"{io.name} staging")
        for io in g.outputs.values():
            io.buffer = g.memory.staging(g.values[io.tensor].nbytes, MemoryKind.READBACK, f"{io.name} staging")

        nodes = g.execute_nodes
        self.pool = CommandPool(g.device)
        self.dpool = None
        try:
            types = [t for n in nodes for t in n.binding_types(g)]
            self.dpool = DescriptorPool(g.device, max(1, len(nodes)), {
                DescriptorType.STORAGE_BUFFER: max(1, types.count(DescriptorType.STORAGE_BUFFER)),
                DescriptorType.STORAGE_IMAGE: types.count(DescriptorType.STORAGE_IMAGE)})
            plan = batches(len(nodes), execute_cut_points(len(nodes), g.config)) or [range(0)]
            self.cmds = self.pool.allocate(len(plan))
            for i, (cmd, batch) in enumerate(zip(self.cmds, plan)):
                cmd.begin()
                if i == 0:
                    for io in g.inputs.values():
                        cmd.copy_buffer(io.buffer, g.values[io.tensor].buffer)
                    cmd.compute_barrier()
                for n in batch:
                    nodes[n].encode(g, cmd, self.dpool)
                if i == len(plan) - 1:
                    for io in g.outputs.values():
                        cmd.copy_buffer(g.values[io.tensor].buffer, io.buffer)
                    cmd.host_read_barrier()
                cmd.end()
            self.fence = Fence(g.device)
        except BaseException:
            self.destroy()
            raise

    def copy_into_staging(self, name: str, array: np.ndarray) -> None:
        g = self.graph
        io = g.inputs.get(name)
        if io is None:
            raise KeyError(f"no graph input named {name!r}; inputs: {', '.join(g.inputs) or '-'}")
        t: Tensor = g.values[io.tensor]
        a = np.asarray(array)
        if a.shape != t.shape or a.dtype != t.dtype:
            raise ValueError(f"input {name!r} needs shape {t.shape} and dtype {t.dtype}, got {a.shape} {a.dtype}")
        io.buffer.write(a)

    def copy_from_staging(self, name: str) -> np.ndarray:
        io = self.graph.outputs[name]
        t: Tensor = self.graph.values[io.tensor]
        return io.buffer.read(t.dtype, int(np.prod(t.shape))).reshape(t.shape)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = self.graph
        missing = set(g.inputs) - set(inputs)
        if missing:
            raise KeyError(f"missing graph inputs: {', '.join(sorted(missing))}")
        for name, array in inputs.items():
            self.copy_into_staging(name, array)
        try:
            self.fence.reset()
            submit_and_wait(g.device, self.cmds, self.fence, g.fence_timeout_s)
        except (FenceTimeoutError, DeviceLostError) as exc:
            # The command buffers may still be running (or the device is gone): never reuse them.
            g.failed = f"an earlier execute failed ({type(exc).__name__}: {exc})"
            raise
        return {name: self.copy_from_staging(name) for name in g.outputs}

    def destroy(self) -> None:
        for obj in (getattr(self, "fence", None), self.dpool, self.pool):
            if obj is not None:
                obj.destroy()
