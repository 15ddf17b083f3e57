"""Execute (ARCHITECTURE.md §3 step 8): the model's dispatches in command buffers recorded once
(split by the execute thresholds, ``scheduler.execute_cut_points``) and resubmitted on every run,
with the inputs copied in at the start and the outputs copied out at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from ..errors import DeviceLostError, FenceTimeoutError
from ..runtime import (Buffer, CommandPool, DescriptorPool, DescriptorType, Fence, MemoryKind, OneShot, Stage,
                       TexelView, TimestampQueryPool, submit_and_wait)
from .allocation import shared_lifetimes
from .scheduler import batches, execute_cut_points
from .values import Tensor

if TYPE_CHECKING:
    from .compute_graph import ComputeGraph


class ExecutePlan:
    """The recorded execute command buffers of a prepacked graph, one set per entry point
    (``ComputeGraph.entry``). With ``profile``, a timestamp is written before the first dispatch
    and after each one, and :meth:`profile` gives the GPU time of the last run per op kind (shader)."""

    def __init__(self, graph: ComputeGraph, profile: bool = False):
        """Bind memory for every non-constant tensor and the IO staging; :meth:`record` then
        records the command buffers."""
        self.graph = graph
        self.queries: TimestampQueryPool | None = None
        self.texel_views: dict[tuple[int, int, int, str], TexelView] = {}
        self.runs = 0  # completed runs (the profile reads the last one's timestamps)
        g = graph
        if g.config.execute.memory_planning:
            shared = shared_lifetimes(g)
            g.memory.allocate_shared([g.values[r] for r in shared], list(shared.values()))
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
        #: per entry point: its nodes' indices in g.execute_nodes, in order, and its command buffers
        self.entry_nodes = {e: [i for i, n in enumerate(nodes) if n.entry == e] for e in g.entries}
        self.cmds: dict[str, list] = {}
        self.last_entry = ""
        #: the nodes the warm-up dispatched with no workgroups: one per pipeline and texel formats
        self.warmed_up = list({(id(n.kernel(g)), tuple(sorted(n.texels.items()))): n for n in nodes}.values())
        self.pool = CommandPool(g.device)
        self.dpool = None
        try:
            if profile:  # per entry: a timestamp before its first dispatch, then one after each
                self.queries = TimestampQueryPool(g.device, len(nodes) + len(self.entry_nodes))
            types = [t for n in nodes + self.warmed_up for t in n.binding_types(g)]
            self.dpool = DescriptorPool(g.device, max(1, len(nodes) + len(self.warmed_up)), {
                DescriptorType.STORAGE_BUFFER: max(1, types.count(DescriptorType.STORAGE_BUFFER)),
                DescriptorType.STORAGE_IMAGE: types.count(DescriptorType.STORAGE_IMAGE),
                DescriptorType.UNIFORM_TEXEL_BUFFER: types.count(DescriptorType.UNIFORM_TEXEL_BUFFER)})
            self.fence = Fence(g.device)
        except BaseException:
            self.destroy()
            raise

    def record(self) -> None:
        """Warm the pipelines up (:meth:`_warm_up`), then record each entry point's command
        buffers. After a fence timeout or a lost device the graph is marked failed (the warm-up
        may still run: the graph's destroy() waits before it frees the plan)."""
        self._warm_up()
        for entry, index in self.entry_nodes.items():
            self.cmds[entry] = self._record(entry, index)

    def _warm_up(self) -> None:
        """Move every storage image to its layout, then dispatch every pipeline once with no
        workgroups, bound as one of its nodes is: before any execute and before the entry points
        are recorded, so whichever entry point runs first finds its images ready, and lavapipe,
        which compiles a pipeline's machine code for the formats of its bound texel buffers and
        images at its first dispatch (not at vkCreateComputePipelines), has compiled them. A
        fresh process's first prompt paid for that: SmolLM2's first 64-token batch, GPU time at
        the first dispatch of each of its 9 pipelines beyond a later batch's, 19-36 ms without
        this and 3-8 ms with it (lavapipe 256 bits, three processes each)."""
        g = self.graph
        try:
            with OneShot(g.device, g.fence_timeout_s) as cmd:
                for node in g.execute_nodes:  # every storage image to its layout, whichever entry point runs first
                    for t in node.tensors(g):
                        if t.image is not None:
                            cmd.prepare_image(t.image)
                for node in self.warmed_up:
                    node.encode(g, cmd, self.dpool, self._texel_view, no_groups=True)
        except (FenceTimeoutError, DeviceLostError) as exc:
            g.failed = f"an earlier execute failed ({type(exc).__name__}: {exc})"
            raise

    def _record(self, entry: str, index: list[int]) -> list:
        """The command buffers of one entry point: its inputs copied in, its dispatches (split by
        the execute thresholds), its outputs copied out."""
        g = self.graph
        base = self.query_base(entry)
        plan = batches(len(index), execute_cut_points(len(index), g.config)) or [range(0)]
        cmds = self.pool.allocate(len(plan))
        for i, (cmd, batch) in enumerate(zip(cmds, plan)):
            cmd.begin()
            if i == 0:
                for io in g.inputs.values():
                    if io.entry == entry:
                        cmd.copy_buffer(io.buffer, g.values[io.tensor].buffer)
                cmd.compute_barrier()
                if self.queries is not None:
                    cmd.reset_query_pool(self.queries, base, len(index) + 1)
                    cmd.write_timestamp(self.queries, base, Stage.BOTTOM_OF_PIPE)
            for k in batch:
                g.execute_nodes[index[k]].encode(g, cmd, self.dpool, self._texel_view)
                if self.queries is not None:  # after the node's barrier: its dispatch has finished
                    cmd.write_timestamp(self.queries, base + k + 1, Stage.BOTTOM_OF_PIPE)
            if i == len(plan) - 1:
                for io in g.outputs.values():
                    if io.entry == entry:
                        cmd.copy_buffer(g.values[io.tensor].buffer, io.buffer)
                cmd.host_read_barrier()
            cmd.end()
        return cmds

    def query_base(self, entry: str) -> int:
        """The first timestamp query of ``entry``: entries take consecutive ranges, in order."""
        base = 0
        for e, index in self.entry_nodes.items():
            if e == entry:
                return base
            base += len(index) + 1
        raise KeyError(entry)

    def _texel_view(self, buffer: Buffer, offset: int, nbytes: int, fmt: str) -> TexelView:
        """One view per buffer range and format, made when first bound, destroyed with the plan."""
        key = (id(buffer), offset, nbytes, fmt)
        if key not in self.texel_views:
            self.texel_views[key] = TexelView(buffer, offset, nbytes, fmt)
        return self.texel_views[key]

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

    def run(self, inputs: Mapping[str, np.ndarray], entry: str = "") -> dict[str, np.ndarray]:
        g = self.graph
        if entry not in self.cmds:
            raise KeyError(f"no entry point named {entry!r}; entry points: {', '.join(map(repr, self.cmds))}")
        mine = {name for name, io in g.inputs.items() if io.entry == entry}
        missing = mine - set(inputs)
        if missing:
            raise KeyError(f"missing graph inputs: {', '.join(sorted(missing))}")
        stray = set(inputs) - mine
        if stray & set(g.inputs):
            raise KeyError(f"inputs {', '.join(sorted(stray & set(g.inputs)))} belong to another entry point than {entry!r}")
        for name, array in inputs.items():
            self.copy_into_staging(name, array)
        try:
            self.fence.reset()
            submit_and_wait(g.device, self.cmds[entry], self.fence, g.fence_timeout_s)
            self.runs += 1
            self.last_entry = entry
        except (FenceTimeoutError, DeviceLostError) as exc:
            # The command buffers may still be running (or the device is gone): never reuse them.
            g.failed = f"an earlier execute failed ({type(exc).__name__}: {exc})"
            raise
        return {name: self.copy_from_staging(name) for name, io in g.outputs.items() if io.entry == entry}

    def profile(self) -> dict[str, tuple[float, int]]:
        """{op kind (shader name): (GPU seconds, dispatches)} of the last run (of the entry point
        it ran), largest first."""
        if self.queries is None:
            raise ValueError("the execute plan was not recorded with profile=True")
        if not self.runs:
            raise ValueError("no execute has completed yet: there is nothing to profile")
        index = self.entry_nodes[self.last_entry]
        base = self.query_base(self.last_entry)
        ts = self.queries.results_ns(base, len(index) + 1)
        out: dict[str, list] = {}
        for node, t0, t1 in zip((self.graph.execute_nodes[i] for i in index), ts, ts[1:]):
            acc = out.setdefault(node.shader, [0.0, 0])
            acc[0] += (t1 - t0) / 1e9
            acc[1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items(), key=lambda kv: -kv[1][0])}

    def destroy(self) -> None:
        for obj in (getattr(self, "fence", None), self.queries, self.dpool, self.pool, *self.texel_views.values()):
            if obj is not None:
                obj.destroy()
