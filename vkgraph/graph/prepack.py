"""Prepack: packing a graph's constant weights onto the device (ARCHITECTURE.md §3, steps 4-7).

- :class:`PrepackRun` is one attempt and the batch submission every mode shares: staging from a
  :class:`~vkgraph.graph.staging.StagingRing`, one command buffer per batch of the plan (encode,
  submit with a fence, wait), timestamps and the load report.
- The modes are strategies over it: :class:`Legacy` (one command buffer, encoded by
  ``encode_prepack()`` and submitted by ``prepack()``), :class:`Staged` (each batch submitted as
  soon as it is encoded; in reduce-peak mode the plan waits for each one), and :class:`CacheHits`
  (tensors the packed-weight cache holds get their memory from the file).
- :class:`Prepacker` is a graph's prepack lifecycle: which mode runs, the reduce-peak retry of
  ``reduce_peak_memory = "auto"``, sources released after their last reader, and what a failure
  frees. Where to cut and how much staging a mode holds is decided in ``scheduler.py``.
"""

from __future__ import annotations

import mmap
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..cache.packed_cache import PackedWeightCache, fatal_import_error, imports_file_pages, refused_file_pages
from ..errors import DeviceLostError, FenceTimeoutError, OutOfDeviceMemoryError, VkGraphError, VulkanError
from ..runtime import (
    CommandBuffer,
    CommandPool,
    DescriptorPool,
    Fence,
    ImportedBuffer,
    Stage,
    TimestampQueryPool,
    host_clock_offset_ns,
)
from .nodes import PrepackNode, packer_bindings
from .report import CommandBufferSpan, LoadReport
from .scheduler import PrepackPlan, plan_prepack, populates, run_prepack_mode
from .staging import StagingRegion, StagingRing
from .values import Tensor, TensorRef

if TYPE_CHECKING:
    from .compute_graph import ComputeGraph

ProgressFn = Callable[[int, int], None]  # (nodes done, nodes total)


class PrepackRun:
    """One prepack attempt: the plan's batches over ``nodes`` (the nodes to pack), staging,
    command buffers, fences, timestamps and the report. ``read_done(src)`` is called after a node
    read its source."""

    def __init__(self, graph: ComputeGraph, plan: PrepackPlan, nodes: list[PrepackNode], hits: dict[int, Any],
                 progress: ProgressFn | None, t0: float, read_done: Callable[[TensorRef], None],
                 cache_keys: int = 0):
        self.graph = graph
        self.plan = plan
        self.nodes = nodes
        self.hits = hits  # {prepack node index: cache entry}
        self.progress = progress
        self.t0 = t0
        self.read_done = read_done
        dev = graph.device
        self.device_base = dev.allocated_nbytes
        dev.peak_allocated_nbytes = dev.allocated_nbytes
        self.report = LoadReport(plan.mode, len(graph.prepack_nodes), graph.total_constant_nbytes,
                                 sum(n.staging_nbytes(graph) for n in nodes), dev.name)
        self.report.cache_hits = len(hits)
        self.report.cache_misses = cache_keys - len(hits)
        self.record_paths = cache_keys > 0  # name every tensor's path in the report
        count = len(plan.batches)
        self.cmds: list[CommandBuffer | None] = [None] * count
        self.fences: list[Fence | None] = [None] * count
        self.regions: list = [None] * count
        self.done = 0
        self.ring = self.pool = self.dpool = self.queries = None
        try:
            if sum(plan.batch_nbytes):
                self.ring = StagingRing(dev, plan.staging_capacity, graph.staging_alignment, graph.fence_timeout_s,
                                        huge_pages=plan.staging_huge_pages)
            self.pool = CommandPool(dev, transient=True)
            # one descriptor set per packing dispatch, with the binding types its packer declares
            dispatches = [(n, texel) for n in nodes for texel in n.dispatch_kinds(graph)]
            if dispatches:
                types = Counter(t for n, texel in dispatches for t in packer_bindings(n.packer, texel))
                self.dpool = DescriptorPool(dev, len(dispatches), types)
            # a timestamp slot after each node that records GPU work (a direct write records none)
            gpu_nodes = [i for i, n in enumerate(nodes) if not n.direct]
            self.slot = {i: 2 * count + k for k, i in enumerate(gpu_nodes)}
            if dev.physical.timestamps_supported and count:  # each batch's start and end, then the nodes'
                self.queries = TimestampQueryPool(dev, 2 * count + len(gpu_nodes))
        except BaseException:
            self.close()
            raise

    def node_done(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, len(self.graph.prepack_nodes))

    def encode(self, b: int) -> None:
        """Reserve batch ``b``'s staging and record its nodes into a new command buffer."""
        g = self.graph
        region = self.ring.reserve(self.plan.batch_nbytes[b]) if self.ring and self.plan.batch_nbytes[b] else None
        cpu0 = time.perf_counter()
        batch = self.plan.batches[b]  # a range of node indices
        self.report.populate_s += g.memory.allocate_blocks(
            ((g.values[self.nodes[i].dst], self.nodes[i].direct) for i in batch),
            populate=self.plan.populates_destinations, huge_pages=self.plan.direct_huge_pages,
            populated_huge_pages=self.plan.populated_huge_pages)
        (cmd,) = self.pool.allocate()
        cmd.begin(one_time=True)
        slots = [self.slot[i] for i in batch if i in self.slot]  # consecutive
        if self.queries:
            cmd.reset_query_pool(self.queries, 2 * b, 2)
            if slots:
                cmd.reset_query_pool(self.queries, slots[0], len(slots))
            cmd.write_timestamp(self.queries, 2 * b, Stage.TOP_OF_PIPE)
        dispatches = 0
        for i in batch:
            if self.nodes[i].direct and self.plan.writes_after_submit:
                continue  # write_direct(b), once the batch is submitted
            dispatches += self._encode_node(i, cmd, region)
            if self.queries and i in self.slot:
                cmd.write_timestamp(self.queries, self.slot[i], Stage.BOTTOM_OF_PIPE)
        cmd.compute_barrier()  # packed weights become visible to later dispatches and copies
        if self.queries:
            cmd.write_timestamp(self.queries, 2 * b + 1, Stage.BOTTOM_OF_PIPE)
        cmd.end()
        self.cmds[b], self.regions[b] = cmd, region
        self.report.packing_dispatches += dispatches
        self.report.spans.append(CommandBufferSpan(
            b, len(batch), sum(self.nodes[i].staging_nbytes(g) for i in batch),
            dispatches, cpu0 - self.t0, 0.0))

    def _encode_node(self, i: int, cmd: CommandBuffer | None, region: StagingRegion | None) -> int:
        """Encode node ``i`` (PrepackNode.encode), then release its source; returns its dispatches."""
        node, g = self.nodes[i], self.graph
        src = g.values[node.src]
        dispatches = node.encode(g, cmd, region, self.dpool, self.ring)
        self.read_done(src)
        if self.record_paths:
            self.report.tensor_paths[src.name] = "packed"
        self.report.direct_writes += node.direct
        self.node_done()
        return dispatches

    def write_direct(self, b: int) -> None:
        """Write batch ``b``'s weights the CPU packs itself, where the plan leaves them until the
        batch is submitted (scheduler.PrepackPlan.writes_after_submit): the GPU packs the rest of
        the batch meanwhile. Their memory is the batch's (given in encode); they record nothing."""
        if not self.plan.writes_after_submit:
            return
        cpu0 = time.perf_counter()
        for i in self.plan.batches[b]:
            if self.nodes[i].direct:
                self._encode_node(i, None, None)
        span = self.report.spans[b]
        span.writes_end_s = time.perf_counter() - self.t0
        self.report.cpu_encode_s += span.writes_end_s - (cpu0 - self.t0)

    def submit(self, b: int) -> None:
        """Submit batch ``b`` with a fence of its own; its staging is reused once that signals."""
        fence = self.fences[b] = Fence(self.graph.device)
        self.graph.device.submit([self.cmds[b]], fence)
        if self.regions[b] is not None:
            self.ring.attach(self.regions[b], fence)
        span = self.report.spans[b]
        span.cpu_end_s = span.writes_end_s = time.perf_counter() - self.t0
        self.report.cpu_encode_s += span.cpu_end_s - span.cpu_start_s

    def _wait_fence(self, fence: Fence) -> None:
        if not fence.is_signaled():
            w0 = time.perf_counter()
            fence.wait(self.graph.fence_timeout_s)
            self.report.waits.append((w0 - self.t0, time.perf_counter() - self.t0))

    def wait(self, b: int) -> None:
        self._wait_fence(self.fences[b])

    def finish(self) -> LoadReport:
        """Wait for every batch, complete the report (GPU spans on the host clock), free the run."""
        for f in self.fences:
            if f is not None:
                self._wait_fence(f)
        r = self.report
        r.load_s = time.perf_counter() - self.t0
        dev = self.graph.device
        r.peak_device_nbytes = dev.peak_allocated_nbytes - self.device_base
        if self.ring:
            r.peak_staging_nbytes = self.ring.in_flight_peak_nbytes
            r.staging_allocated_nbytes = self.ring.allocated_peak_nbytes
            r.waits.extend((w0 - self.t0, w1 - self.t0) for w0, w1 in self.ring.waits)
        r.waits.sort()
        r.fence_wait_s = sum((w1 - w0 for w0, w1 in r.waits), 0.0)
        if self.queries:
            offset_s = host_clock_offset_ns(dev, self.graph.fence_timeout_s) / 1e9 - self.t0
            ts = self.queries.results_ns()
            for span in r.spans:
                span.gpu_start_s = ts[2 * span.index] / 1e9 + offset_s
                span.gpu_end_s = ts[2 * span.index + 1] / 1e9 + offset_s
            per: dict[str, list] = {}
            for b, batch in enumerate(self.plan.batches):
                prev = ts[2 * b]
                for i in (i for i in batch if i in self.slot):
                    t = ts[self.slot[i]]
                    acc = per.setdefault(self.nodes[i].packer.name, [0.0, 0])
                    acc[0] += max(0, t - prev) / 1e9
                    acc[1] += 1
                    prev = max(prev, t)
            r.packer_gpu_s = dict(sorted(per.items(), key=lambda kv: -kv[1][0]))
        self.close()
        return r

    def close(self, wait: bool = True) -> None:
        """Free the run's objects, waiting for its work first (``wait=False``: the caller already
        waited for the device). Safe after a failure."""
        dev = self.graph.device
        if wait and dev.alive:
            dev.wait_idle()
        if self.ring is not None:  # before the fences it checks
            self.ring.destroy(wait)
            self.ring = None
        for obj in (*self.fences, self.queries, self.dpool, self.pool):
            if obj is not None:
                obj.destroy()


class CacheHits:
    """Tensors the packed-weight cache holds get their memory from the file: no staging, no
    packing dispatch."""

    def __init__(self, cache: PackedWeightCache):
        self.cache = cache

    def load(self, run: PrepackRun) -> None:
        g, r = run.graph, run.report
        for i, entry in run.hits.items():
            node = g.prepack_nodes[i]
            path = self.cache.load(node, entry)
            src = g.values[node.src]
            r.tensor_paths[src.name] = path
            r.zero_copy_tensors += path == "zero-copy"
            run.read_done(src)
            run.node_done()


class Legacy:
    """ET-VK's original path: every node in one command buffer, encoded first
    (``encode_prepack()``), then submitted once and waited for (``prepack()``)."""

    def encode(self, run: PrepackRun) -> None:
        if run.plan.batches:
            run.encode(0)

    def submit(self, run: PrepackRun) -> None:
        if run.plan.batches:
            run.submit(0)


class Staged:
    """Command buffers cut by the scheduler, each submitted without waiting as soon as it is
    encoded, so the CPU stages the next batch while the GPU packs this one. In reduce-peak mode
    the plan waits for every batch before the next (one batch of staging, reused)."""

    #: wait for every batch before the next in staged mode too: the CPU's and the GPU's work of
    #: the same plan, neither running while the other does (calibrate.contention measures so)
    wait_each = False

    def pack(self, run: PrepackRun) -> None:
        for b in range(len(run.plan.batches)):
            run.encode(b)
            run.submit(b)
            run.write_direct(b)
            if run.plan.waits_each_batch or self.wait_each:
                run.wait(b)


class Prepacker:
    """A graph's prepack: one load per graph, in legacy, staged or reduce-peak mode."""

    def __init__(self, graph: ComputeGraph):
        self.graph = graph
        self.prepacked = False
        self.cache: PackedWeightCache | None = None
        self._legacy: PrepackRun | None = None
        self._parked: list[PrepackRun] = []  # runs the GPU may still use (after a timeout): freed in close()
        self._held: list[TensorRef] | None = None  # released sources kept for a possible retry

    # --- entry points -------------------------------------------------------------------------

    def encode_legacy(self) -> None:
        self._check_not_prepacked()
        self.graph.prepare()
        run = None
        t0 = time.perf_counter()  # the cache lookup is part of the load
        try:
            run = self._new_run("legacy", None, t0)
            Legacy().encode(run)
        except BaseException as exc:
            self._abandon(run, exc)
            raise
        self._legacy = run

    def submit_legacy(self) -> LoadReport:
        if self._legacy is None:
            self.encode_legacy()
        run, self._legacy = self._legacy, None
        try:
            Legacy().submit(run)
            return self._finish(run)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    def run(self, progress: ProgressFn | None) -> LoadReport:
        """Staged or reduce-peak (the config decides); with ``reduce_peak_memory = "auto"``, a
        staged load that runs out of device memory frees what it packed and runs again in
        reduce-peak mode, whose peak is the weights plus one batch of staging."""
        self._check_not_prepacked()
        g = self.graph
        g.prepare()
        mode = run_prepack_mode(g.config, g.total_constant_nbytes)
        may_retry = mode == "staged" and g.config.prepack.reduce_peak_memory == "auto"
        self._held = [] if may_retry else None  # sources a retry would read again
        try:
            report = self._attempt(mode, progress)
        except OutOfDeviceMemoryError as exc:
            if not may_retry:
                raise
            reason = str(exc)
            self._held = None  # still readable; the retry releases them after their last reader
        finally:
            held, self._held = self._held or [], None
            for src in held:
                src.source.release()
        if self.prepacked:
            return report
        g.failed = None  # _abandon freed everything the staged attempt made
        if self.cache is not None:
            self.cache.close()
        for v in g.values:
            if isinstance(v, TensorRef):
                v.readers = 0
        for node in g.prepack_nodes:
            g.values[node.src].readers += 1
        report = self._attempt("reduce-peak", progress)
        report.retried_after = reason
        return report

    # --- one attempt ---------------------------------------------------------------------------

    def _attempt(self, mode: str, progress: ProgressFn | None) -> LoadReport:
        run = None
        t0 = time.perf_counter()  # the cache lookup is part of the load
        try:
            run = self._new_run(mode, progress, t0)
            Staged().pack(run)
            return self._finish(run)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    def _new_run(self, mode: str, progress: ProgressFn | None, t0: float) -> PrepackRun:
        """Look the nodes up in the packed-weight cache, plan the misses, give the hits their memory."""
        g = self.graph
        path = g.config.cache.packed_weights_path
        if path and self.cache is None:
            self.cache = PackedWeightCache(g, Path(path))
        in_place = self._import_in_place()
        hits = self.cache.lookup(skip=in_place) if self.cache else {}
        nodes = [n for i, n in enumerate(g.prepack_nodes) if i not in hits and i not in in_place]
        dsts = [g.values[n.dst] for n in nodes]
        dev = g.device
        plan = plan_prepack(mode, [n.staging_nbytes(g) for n in nodes], g.staging_alignment, g.config,
                            sum(t.nbytes for n, t in zip(nodes, dsts) if n.direct),
                            sum(t.nbytes for n, t in zip(nodes, dsts) if not n.direct and t.storage == "buffer"),
                            populates(g.config, dev.renderer, dev.simd_width, dev.host_cpu))
        run = PrepackRun(g, plan, nodes, hits, progress, t0, self.read_done, len(self.cache.keys) if self.cache else 0)
        try:
            for i in in_place:
                src = g.values[g.prepack_nodes[i].src]
                src.readers -= 1  # its pages are the tensor's memory now: never released
                run.report.tensor_paths[src.name] = "in-place"
                run.report.zero_copy_tensors += 1
                run.node_done()
            if hits:
                CacheHits(self.cache).load(run)
        except BaseException:
            run.close()
            raise
        return run

    def _import_in_place(self) -> set[int]:
        """Identity-packed weights whose source lends whole file pages (an ExecuTorch program's
        page-aligned segments) get those pages as their device memory, when the device imports
        file-backed pages: no staging, no copy. Pages are lent once: ExecuTorch stores identical
        constants once (two zeroed KV caches share one region), and tensors written in place must
        not share memory. Returns their node indices; an import the device refuses leaves its
        node to the other paths."""
        g = self.graph
        done: set[int] = set()
        imported: set[tuple[str, int]] = set()  # (file, offset) of the pages already lent
        for i, node in enumerate(g.prepack_nodes):
            dst, source = g.values[node.dst], g.values[node.src].source
            origin = getattr(source, "origin", None)
            if node.packer.shader is not None or dst.storage != "buffer" or dst.buffer is not None or \
                    origin is None or origin in imported:
                continue
            pages = getattr(source, "pages", lambda: None)()
            if pages is None or not imports_file_pages(g.device, pages[:mmap.PAGESIZE], "weights in file pages"):
                continue
            try:
                g.memory.adopt(dst, ImportedBuffer(g.device, pages, dst.nbytes, name=dst.name))
            except (VulkanError, ValueError) as exc:
                if fatal_import_error(exc):
                    raise
                refused_file_pages(g.device, exc, "weights in file pages")
                continue
            done.add(i)
            imported.add(origin)
            source.lent = True
        return done

    def _finish(self, run: PrepackRun) -> LoadReport:
        report = run.finish()
        self.prepacked = True
        if self.cache is not None:
            report.cache_save_s = self.cache.save(run.hits)
        return report

    # --- sources, failures, teardown -------------------------------------------------------

    def read_done(self, src: TensorRef) -> None:
        """A prepack node has read ``src``: after its last reader the source is released (file
        pages dropped), unless a retry may need to read it again and could not."""
        src.readers -= 1
        if src.readers == 0:
            if self._held is not None and not getattr(src.source, "rereadable", False):
                self._held.append(src)
            else:
                src.source.release()

    def _check_not_prepacked(self) -> None:
        self.graph.check_usable()
        if self.prepacked or self._legacy is not None:
            raise VkGraphError("the graph is already prepacked")

    def _abandon(self, run: PrepackRun | None, exc: BaseException) -> None:
        """After a failed prepack: free the run and every weight packed so far. After a fence
        timeout or a lost device the GPU may still be using them: they are kept until close()."""
        g = self.graph
        g.failed = f"an earlier prepack failed ({type(exc).__name__}: {exc})"
        if isinstance(exc, (FenceTimeoutError, DeviceLostError)):
            if run is not None:
                self._parked.append(run)
            return
        if run is not None:
            run.close()
        g.memory.free(v for v in g.values if isinstance(v, Tensor) and v.constant)

    def close(self) -> None:
        """Free the runs still held (the caller waited for the device)."""
        for run in self._parked:
            run.close(wait=False)
        self._parked.clear()
        if self._legacy is not None:
            self._legacy.close()
            self._legacy = None

    def close_cache(self) -> None:
        """Close the cache file (after the buffers imported from its pages are gone)."""
        if self.cache is not None:
            self.cache.close()
