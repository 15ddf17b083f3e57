"""Measure a simulator profile on the current device (``vkgraph simulate --calibrate``) and
compare the simulator with measured loads (``vkgraph simulate --validate``)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..config import GraphConfig
from ..graph.allocation import BLOCK_NBYTES
from ..graph.compute_graph import ComputeGraph
from ..ggml import FORMATS
from ..graph.packers import get_packer
from ..graph.scheduler import HUGE_PAGES_UP_TO_NBYTES
from ..graph.values import ArraySource, TensorRef
from ..paths import CONFIG_DIR, user_cache_dir
from ..runtime import Buffer, Device, MemoryKind, allocate_block
from .simulate import Profile, load_profile, model_nodes, simulate
from .simulate_run import ExecuteRates, linear_terms, waves_factor

#: what the rates of packing shaders are measured with, on every device: their weights' packers
#: have host forms, which the CPU runs instead on SwiftShader by default
#: (packers.HOST_PACKING_RENDERERS; host_pack_gbps measures those)
SHADERS = {"prepack__host_packing": "never"}


def _median(f, repeat: int = 3) -> float:
    return statistics.median(f() for _ in range(repeat))


def _copy_gbps(dev: Device, nbytes: int, into: str) -> float:
    """The CPU copying ``nbytes`` into host-visible memory: ``"held"``, a buffer it wrote before;
    ``"fresh"``, a new buffer (staging's first touch); ``"block"``, a new memory block of the kind
    the weights it writes get (advised as huge pages on CPU renderers: graph/allocation.py)."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    keep = Buffer(dev, nbytes, MemoryKind.UPLOAD)
    keep.write(src)

    def once() -> float:
        t0 = time.perf_counter()
        if into == "held":
            keep.write(src)
            return time.perf_counter() - t0
        if into == "fresh":
            with Buffer(dev, nbytes, MemoryKind.UPLOAD) as b:
                b.write(src)
                return time.perf_counter() - t0
        block, (b,) = allocate_block(dev, [(nbytes, "fresh")], MemoryKind.UPLOAD, huge_pages=True)
        with block:
            b.write(src)
            return time.perf_counter() - t0

    try:
        return nbytes / _median(once) / 1e9
    finally:
        keep.destroy()


def _source_read_gbps(nbytes: int) -> float:
    """Reading weights through a file mapping, per byte beyond a copy from memory the process
    holds: the page faults a load pays on every read, since a load releases its weights' pages
    after packing them (graph.values.ArraySource.release), and that release.

    The file is measured in the state model files are in: dropped from the page cache, then read
    once through a mapping (the page cache filled by faults, as loads fill it). Pages a process
    wrote or read with read() come back faster than pages a mapping faulted in (on this VM's
    kernel 12 GB/s against 5.5 GB/s for MiniLM's and SmolLM2's files), so timing the temporary
    file right after writing it measured reads as free. The file lives in the user cache
    directory: a disk, where model files are (a tmpfs has no page cache to drop)."""
    import mmap
    import tempfile

    data = np.random.default_rng(2).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(data)
    dst[:] = data  # touched destination: what is timed is reading the mapping
    user_cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=user_cache_dir()) as f:
        f.write(data.tobytes())
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

        def once() -> float:
            t0 = time.perf_counter()
            np.copyto(dst, np.frombuffer(mm, np.uint8))
            mm.madvise(mmap.MADV_DONTNEED)  # as a load releases its weights' pages
            t = time.perf_counter() - t0
            return t - _time_copy(dst, data)

        try:
            once()  # from the disk into the page cache, through the mapping
            extra = _median(once, 5)
        finally:
            mm.close()
    # 0 means "free": the mapping read no slower than plain memory (within timer noise)
    return nbytes / extra / 1e9 if extra > 1e-3 else 0.0


def _alternating(once: Callable[[int], Any], few: int, many: int, repeat: int) -> list[tuple[Any, Any]]:
    """``(once(few), once(many))`` taken one right after the other, ``2 * repeat`` times, after one
    of each as a warm-up: the calibrations that price one more weight, dispatch or command buffer
    as the difference between two loads of the same bytes (taken apart, the bytes' time drifts
    more than that difference)."""
    once(many)
    once(few)
    return [(once(few), once(many)) for _ in range(2 * repeat)]


def _direct_writes(dev: Device, repeat: int, nbytes: int = 96 << 20,
                   counts: tuple[int, int] = (24, 384)) -> tuple[float, float] | None:
    """(CPU seconds per weight, GB/s of its bytes) for weights the CPU writes straight into
    device memory in a process's later loads: the same ``nbytes`` (several memory blocks) read
    from a file mapping (released after, as a load releases them) as ``counts`` identity weights
    in staged loads, after a warm-up load. Per weight (its buffer, binding, recording): the
    difference in time over the difference in weights, the median over ``2 * repeat`` pairs of
    loads taken one after the other (medians of each count taken apart gave 26..53 us on
    lavapipe in calibrations of the same hour: the bytes' time drifts more than the difference);
    the bytes: what the fewer weights' loads took besides that. None where device memory is not
    host-visible (no weight is written that way)."""
    import mmap
    import tempfile

    if not dev.host_visible_device_local:
        return None
    with tempfile.TemporaryFile() as f:
        f.write(np.random.default_rng(3).integers(0, 255, nbytes, dtype=np.uint8).tobytes())
        f.flush()

        def once(count: int) -> float:
            size = nbytes // count // 4 * 4
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            with ComputeGraph(GraphConfig(), device=dev) as g:
                for i in range(count):
                    src = ArraySource(np.frombuffer(mm, np.uint8, size, i * size), mapping=mm, offset=i * size)
                    g.prepack_tensor(g.add_tensorref(src, f"w{i}", shape=(size // 4,), dtype=np.float32))
                g.prepare()
                return g.run_prepack().cpu_encode_s

        few, many = counts
        pairs = _alternating(once, few, many, repeat)
    node_s = max(statistics.median((b - a) / (many - few) for a, b in pairs), 1e-6)
    t_few = statistics.median(a for a, _ in pairs)
    return node_s, nbytes / max(t_few - few * node_s, 1e-9) / 1e9


def _time_copy(dst: np.ndarray, src: np.ndarray) -> float:
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def _host_pack_gbps(dev: Device, packer: str, arrays: list[np.ndarray], repeat: int,
                    huge_pages: bool = True) -> float:
    """The packer's host form (graph.packers) packing ``arrays`` as a host-packed load does:
    straight into a fresh memory block of the device's, advised as huge pages unless not
    ``huge_pages`` (fresh host memory where the device's is not host-visible). Weights of half a
    MiB, SmolLM2's: lavapipe, in one process, its 150 q4_1 weights split at 2.6-3.8 GB/s in loads
    (file reads included), while 4 weights of 8 MiB into fresh numpy arrays split at 5.0-5.1 GB/s."""
    p = get_packer(packer)
    refs = [TensorRef(f"w{i}", a.shape, a.dtype, ArraySource(a)) for i, a in enumerate(arrays)]
    sizes = [(p.packed_nbytes(r), r.name) for r in refs]

    def once() -> float:
        block = None
        if dev.host_visible_device_local:  # device memory, as a load's weights
            block, buffers = allocate_block(dev, sizes, huge_pages=huge_pages)
            outs = [b.view() for b in buffers]
        else:
            outs = [np.empty(n, np.uint8) for n, _ in sizes]
        try:
            t0 = time.perf_counter()
            for r, a, out in zip(refs, arrays, outs):
                p.pack_host(r, a.reshape(-1).view(np.uint8), out)
            return time.perf_counter() - t0
        finally:
            del outs  # the views go before the block's mapping
            if block is not None:
                block.destroy()

    once()
    return sum(a.nbytes for a in arrays) / _median(once, repeat) / 1e9


def host_pack_gbps(packer: str, size_mb: int, repeat: int) -> float:
    """:func:`_host_pack_gbps` of ``packer`` on the device of ``$VKGRAPH_DEVICE``: ``size_mb``
    MiB of :func:`_big_weights` in pieces of half a MiB (SmolLM2's weights' size), as GGML blocks
    for the ``<format>_planes`` packers. Run in fresh processes (:func:`_in_fresh_processes`): in
    a calibration's own process the rates rose with the measurements before them (SwiftShader,
    q8_0 planes: 3.2 GB/s first in a process, 3.6 after the calibration's first steps, 5.7 as the
    median of a three-round calibration; the Zen 4 lavapipe profile had 5.2 from one) where fresh
    processes measured 3.1-3.3 on both renderers, the speed SmolLM2's loads ran at (their first
    loads on lavapipe priced 9-12% fast)."""
    pieces = [piece for a in _big_weights(size_mb) for piece in np.array_split(a, max(1, a.shape[0] // 32))]
    fmt = FORMATS.get(packer.removesuffix("_planes")) if packer.endswith("_planes") else None
    if fmt is not None:
        pieces = [a.reshape(-1).view(np.uint8)[:a.nbytes // fmt.block_nbytes * fmt.block_nbytes]
                  .reshape(-1, fmt.block_nbytes) for a in pieces]
    with Device() as dev:
        return _host_pack_gbps(dev, packer, pieces, repeat)


def host_pack_node_costs(packer: str, size_mb: int, repeat: int) -> tuple[float, float]:
    """(seconds a weight costs besides its bytes, GB/s of its bytes) of ``packer``'s host form on
    the device of ``$VKGRAPH_DEVICE``, on huge pages: :func:`_big_weights` (weights of 8 MiB at 32
    MiB) against the same bytes in pieces of a 16th (half a MiB), a weight's time taken as the one
    plus its bytes over the other. SwiftShader on the Intel Xeon host (2026-11-30, one process):
    half a MiB 303-436 us, 2.25 MiB 835-1034, 8 MiB 2529-2929 (about 150 us and 3.3 GB/s), where
    one rate of the half-MiB pieces priced MiniLM's host-packed first loads (weights of 0.56 and
    2.25 MiB) at +21%; GGML blocks in planes (q4_1: 203 KiB 4.11 GB/s, 540 KiB 4.63) keep one
    rate. Run in fresh processes (:func:`_in_fresh_processes`)."""
    big = _big_weights(size_mb)
    pieces = [piece for a in big for piece in np.array_split(a, 16)]
    with Device() as dev:
        small_gbps = _host_pack_gbps(dev, packer, pieces, repeat)
        big_gbps = _host_pack_gbps(dev, packer, big, repeat)
    small_s, big_s = 1 / (small_gbps * 1e9), 1 / (big_gbps * 1e9)  # seconds a byte
    node_s = (small_s - big_s) / (1 / pieces[0].nbytes - 1 / big[0].nbytes)
    if node_s <= 0 or node_s >= big_s * big[0].nbytes:  # within the noise: one rate
        return 0.0, big_gbps
    return node_s, 1 / (big_s - node_s / big[0].nbytes) / 1e9


def host_pack_4k_gbps(size_mb: int, repeat: int) -> float:
    """The profile's ``host_pack_4k_gbps``: linear_4x4's host form packing :func:`_big_weights`
    (fp32 weights of 8 MiB at 32 MiB) into a block of 4 KiB pages, as the loads whose CPU-written
    weights exceed HUGE_PAGES_UP_TO_NBYTES write theirs (synthetic:256 and larger with the CPU
    packing them). [cpu.host_pack_gbps] prices weights of half a MiB on huge pages (SmolLM2's,
    MiniLM's); on SwiftShader (Intel Xeon host, 2026-11-30) those packed at 0.86-1.12 GB/s, the
    8 MiB weights at 1.43-1.45 into 4 KiB pages and 1.65-2.29 into huge ones. Run in fresh
    processes (:func:`_in_fresh_processes`)."""
    with Device() as dev:
        return _host_pack_gbps(dev, "linear_4x4", _big_weights(size_mb), repeat, huge_pages=False)


def fresh_copy_gbps(into: str, size_mb: int) -> float:
    """:func:`_copy_gbps` into ``"fresh"`` memory or a new ``"block"``, ``size_mb`` MiB, on the
    device of ``$VKGRAPH_DEVICE``. Run in fresh processes (:func:`_in_fresh_processes`): after one
    calibration in a process lavapipe's new buffers came from pages freed before, and the copy ran
    at the speed into touched memory (fresh 1.45 -> 11.37 GB/s, block 6.36 -> 11.48, on a Zen 4
    host), so ``--rounds 3`` had taken that for its median."""
    with Device() as dev:
        return _copy_gbps(dev, size_mb << 20, into)


def _fresh_device_gbps(size_mb: int, rounds: int = 5, host_packed: bool = False) -> float:
    """What the first load of a fresh process pays on top of a settled one, per packed byte:
    reduce-peak loads of synthetic:<4 x size_mb> in fresh processes (the device of
    ``$VKGRAPH_DEVICE``; not staged, which populates the packing shaders' memory on the CPU:
    :func:`populate_gbps`), the first load's time against the median of the settled loads (the
    third on) of the same process; median over ``rounds`` processes. The simulator charges it to
    whoever first writes the memory (lavapipe's device memory is the process heap): the GPU for a
    weight it packs, the CPU for one it writes straight (SmolLM2's GGML blocks on a CPU renderer:
    their first loads on lavapipe ran at 0.044..0.048 s, priced at 0.033 before the CPU paid it).
    0 (free) where the first load runs no slower.

    ``host_packed``: with the CPU writing every weight itself (``configs/fast-load.toml``,
    ``prepack.host_packing = "cpu-renderer"``; a CPU renderer), the profile's
    ``fresh_direct_gbps``: on the Zen 4 host (synthetic:128, seven runs of five fresh processes
    each) SwiftShader's first loads paid 16-169 GB/s for such weights, nothing in two runs, where
    its ``fresh_device_gbps`` (6.2) had priced SmolLM2's first loads 13-17% slow; lavapipe's 7-72."""
    from .bench import SETTLING_LOADS, load_in_subprocess

    config = str(CONFIG_DIR / "fast-load.toml") if host_packed else None
    extra = []
    for _ in range(rounds):
        loads = load_in_subprocess(f"synthetic:{4 * size_mb}", "reduce-peak", config, SETTLING_LOADS + 2, check="last")
        settled = statistics.median(r["load_s"] for r in loads[SETTLING_LOADS:])
        extra.append((loads[0]["load_s"] - settled) / loads[0]["total_constant_nbytes"])  # fp32: packed = source
    per_byte = statistics.median(extra)
    return 1 / per_byte / 1e9 if per_byte > 1e-12 else 0.0


def populate_gbps(size_mb: int, huge_pages: bool = False) -> float:
    """The CPU giving a packing shader's weights memory whose pages are made at once (memory blocks
    of allocation.BLOCK_NBYTES, populated as a staged load's are: runtime.memory.populate_pages;
    advised as huge pages with ``huge_pages``), ``size_mb`` MiB of them on the device of
    ``$VKGRAPH_DEVICE``, all alive at once as a load's weights are. Run in fresh processes
    (:func:`_in_fresh_processes`): a process's first load gets pages never touched before."""
    count = max(1, (size_mb << 20) // BLOCK_NBYTES)
    with Device() as dev:
        blocks = []
        try:
            t0 = time.perf_counter()
            for i in range(count):
                blocks.append(allocate_block(dev, [(BLOCK_NBYTES, f"w{i}")], populate=True,
                                             huge_pages=huge_pages)[0])
            seconds = time.perf_counter() - t0
        finally:
            for b in blocks:
                b.destroy()
    return count * BLOCK_NBYTES / seconds / 1e9


def _prepared(g: ComputeGraph) -> ComputeGraph:
    """``g`` with its pipelines made, its weights loaded and its command buffers recorded."""
    g.prepare()
    g.run_prepack()
    g.encode_execute()
    return g


def _medians_in_turn(runs: list[tuple[ComputeGraph, dict[str, np.ndarray]]], rounds: int) -> list[float]:
    """The median wall time of each (graph, inputs) run's execute over ``rounds`` rounds of all
    the runs in turn (the host's drift hits each alike), after one execute of each (its
    pipelines' first dispatches)."""
    for g, inputs in runs:
        g.execute(inputs)
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for (g, inputs), into in zip(runs, times):
            t0 = time.perf_counter()
            g.execute(inputs)
            into.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _execute_times(dev: Device, build, inputs: dict[str, np.ndarray], repeat: int) -> tuple[float, float]:
    """(median wall time of ``repeat`` executes after the first, how much longer the first took)
    of the graph ``build(g)`` makes: its pipelines' first dispatches."""
    with ComputeGraph(GraphConfig(), device=dev) as g:
        build(g)
        _prepared(g)

        def once() -> float:
            t0 = time.perf_counter()
            g.execute(inputs)
            return time.perf_counter() - t0

        first = once()
        median = _median(once, repeat)
        return median, first - median


def _execute_seconds(dev: Device, build, inputs: dict[str, np.ndarray], repeat: int) -> float:
    """Median wall time of ``repeat`` executes (after one) of the graph ``build(g)`` makes."""
    return _execute_times(dev, build, inputs, repeat)[0]


def _execute_rates(dev: Device, repeat: int, weight_nbytes: int) -> ExecuteRates:
    """The run model's rates (tools/simulate_run.py): executes of tiny elementwise ops (one, and
    101 in a chain of additions and negations in turn: the host's share and each dispatch's), an addition of two 16 MiB constants (the
    bytes a memory-bound kernel moves), and linears in each format on an x shared by all,
    ``weight_nbytes`` of weights per execute (64 MiB: streamed from memory, as a model's):
    one-token ones of 512 and 2048 rows by 512 and 2048 inputs, fitted (least squares) to a
    dispatch's own cost, a cost per row and one per weight byte (the first two: medians over
    the formats, then each format's byte rate again with those, the median over the shapes);
    then 32-token ones of 1024 x 1024, for the multiply-adds of a tile's further tokens. On a
    CPU renderer every term is scaled by the linear's waves (simulate_run.waves_factor); those
    shapes have whole waves. Then, each against a neighbour with its executes in turn (so that
    the host's drift cancels): linears of a partial wave, for the share of it their rows and
    bytes pay (wave_share; 1 where no shape has one), and gated linears against plain ones of
    as many rows, one token and 32 (gated_step, gated_tiles); and attention of one token
    (step_key_s). A pipeline's first dispatch: how much longer a graph's first execute took,
    the chain's per pipeline (two), the linears' the median over graphs of one small linear (a
    pipeline each: one token and a tile of each format)."""
    import gguf
    from gguf.quants import quantize

    from .. import ops

    tiny = {"x": np.arange(4, dtype=np.float32)}
    threads = dev.cpu_threads

    def adds(count: int, big: np.ndarray | None = None):
        def build(g: ComputeGraph) -> None:
            x = y = g.add_input((4,), np.float32, "x")
            if big is not None:
                c = g.prepack_tensor(g.add_tensorref(big, "big"))
                ops.add(g, c, c)
            for i in range(count):  # two kernels in turn: a model's dispatches switch pipelines
                y = ops.unary(g, y, "neg") if i % 2 else ops.add(g, y, x)
            g.set_output(y, "y")
        return build

    t1 = _execute_seconds(dev, adds(1), tiny, repeat)
    t101, first_adds = _execute_times(dev, adds(101), tiny, repeat)  # two pipelines' first dispatches
    dispatch_s = max((t101 - t1) / 100, 1e-7)
    host_s = max(t1 - dispatch_s, 0.0)
    big = np.random.default_rng(4).standard_normal(4 << 20, dtype=np.float32)
    stream = 3 * big.nbytes / max(_execute_seconds(dev, adds(1, big), tiny, repeat) - t1 - dispatch_s, 1e-9) / 1e9
    rng = np.random.default_rng(5)
    kinds = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}

    def build_linears(fmt: str, n: int, k: int, m: int, gated: bool = False, nbytes: int = weight_nbytes):
        """A graph builder: linears of ``n`` x ``k`` on an [m, k] x (``gated``: gated linears of
        two such weights), ``nbytes`` of weights in all; and its inputs."""
        dense = rng.standard_normal((n, k), dtype=np.float32)
        w, quant = (dense, "") if fmt == "fp32" else (quantize(dense, kinds[fmt]), fmt)
        packed = get_packer(quant or "linear_4x4").packed_nbytes(TensorRef("w", w.shape, w.dtype, ArraySource(w),
                                                                           quant=quant))

        def build(g: ComputeGraph) -> None:
            xin = g.add_input((m, k), np.float32, "x")
            for i in range(-(-nbytes // (packed * (1 + gated)))):
                wi = g.add_tensorref(w, f"w{i}", quant=quant)
                y = (ops.gated_linear(g, xin, wi, g.add_tensorref(w, f"u{i}", quant=quant)) if gated
                     else ops.linear(g, xin, wi))
            g.set_output(y, "y")
        return build, {"x": rng.standard_normal((m, k), dtype=np.float32)}

    def linears(specs: list[tuple[str, int, int, int, bool]],
                rounds: int = repeat) -> list[tuple[float, int, float, float, float, float, bool]]:
        """Graphs of linears (format, n, k, m, gated: build_linears), all built first, then
        executed in turn ``rounds`` times, so that the host's drift hits each alike. Each: (median
        seconds of its execute beyond the host's share, dispatches, weight rows and bytes
        streamed over the passes at the invocations they have, multiply-adds of the tiles'
        further tokens, the waves_factor of its linears (of one shape), whether they are gated
        ones: ops.gated_linear's dispatches of two weights)."""
        with contextlib.ExitStack() as stack:
            runs = []
            for spec in specs:
                build, inputs = build_linears(*spec)
                g = stack.enter_context(ComputeGraph(GraphConfig(), device=dev))
                build(g)
                runs.append((_prepared(g), inputs))
            out = []
            for (g, _inputs), seconds in zip(runs, _medians_in_turn(runs, rounds)):
                nodes = [x for x in g.execute_nodes if x.weight_passes]
                rows, nbytes, macs = (sum(c) for c in zip(*(linear_terms(g, x, threads, wave_share=0.0)
                                                            for x in nodes)))
                out.append((seconds - host_s, len(nodes), rows, nbytes, macs,
                            waves_factor(nodes[0], threads), any(x.weights == 2 for x in nodes)))
            return out

    formats = ("fp32", *kinds)
    shapes = [(512, 512), (2048, 512), (512, 2048), (2048, 2048)]
    measured = linears([(fmt, n, k, 1, False) for fmt in formats for n, k in shapes]
                       + [(fmt, 1024, 1024, 32, False) for fmt in formats])
    # (seconds, dispatches, rows, bytes, multiply-adds) in whole waves (every shape here has those)
    whole = [(t, d, f * rows, f * nbytes, macs) for t, d, rows, nbytes, macs, f, _ in measured]
    runs = {fmt: whole[i * len(shapes):(i + 1) * len(shapes)] for i, fmt in enumerate(formats)}
    tiles = dict(zip(formats, whole[len(formats) * len(shapes):]))
    fits = [np.linalg.lstsq(np.array([r[1:4] for r in rs], float), np.array([r[0] for r in rs]), rcond=None)[0]
            for rs in runs.values()]
    linear_s = max(statistics.median(f[0] for f in fits), dispatch_s)
    row_s = max(statistics.median(f[1] for f in fits), 0.0)
    weight_gbps, gmacs = {}, {}
    for fmt, rs in runs.items():  # the median over the shapes: one run on this VM can be 1.7x off
        weight_gbps[fmt] = statistics.median(nbytes / max(t - d * linear_s - rows * row_s, 1e-9) / 1e9
                                             for t, d, rows, nbytes, _ in rs)
        t, d, rows, nbytes, macs = tiles[fmt]
        extra = t - d * linear_s - rows * row_s - nbytes / (weight_gbps[fmt] * 1e9)
        if macs and extra > 0:  # none on GPUs (a token per invocation: passes only)
            gmacs[fmt] = macs / extra / 1e9

    def ratio(a: tuple[int, int, int, bool], b: tuple[int, int, int, bool]) -> tuple[float, float, float, bool]:
        """Linears ``b`` against ``a`` ((n, k, m, gated), q4_0), executed in turn: (b's work over
        a's, measured; the same predicted at the invocations they have; b's waves_factor;
        whether b's dispatches are gated ones)."""
        # a ratio of two measurements: three times the rounds (one calibration on this VM put
        # lavapipe's wave_share anywhere in 0..0.77 with ``repeat`` rounds)
        (ta, da, *wa, _, _), (tb, db, *wb, fb, gated) = linears([("q4_0", *a), ("q4_0", *b)], 3 * repeat)

        def work(rows: float, nbytes: float, macs: float) -> float:
            return (rows * row_s + nbytes / (weight_gbps["q4_0"] * 1e9)
                    + (macs / (gmacs["q4_0"] * 1e9) if "q4_0" in gmacs else 0.0))
        predicted = work(*wb) / work(*wa)
        # where a's time is no more than its dispatches' (small weights on a busy host: the
        # calibration test's 4 MiB, beside the other renderer's suite), no ratio was measured
        measured = (tb - db * linear_s) / (ta - da * linear_s) if min(ta - da * linear_s, tb - db * linear_s) > 0 \
            else predicted
        return measured, predicted, fb, gated

    # a partial wave: 528 rows are 3 workgroups of 16 invocations at 16 rows (lavapipe at 512
    # bits), 2080 rows 3 of 8 at 128 (workgroups of 8); each against whole waves just below
    shares = [(m / p - 1) / (f - 1) for m, p, f, _ in (ratio((512, 512, 1, False), (528, 512, 1, False)),
                                                       ratio((2048, 512, 1, False), (2080, 512, 1, False))) if f > 1.25]
    wave_share = min(max(statistics.median(shares), 0.0), 1.0) if shares else 1.0
    # 1 where ops.gated_linear gives no gated dispatch (SwiftShader's one token: two linears)
    gated = [m / p if fused else 1.0 for m, p, _, fused in (ratio((1024, 512, 1, False), (1024, 512, 1, True)),
                                                            ratio((1024, 1024, 32, False), (1024, 1024, 32, True)))]
    # a pipeline's first dispatch: one small linear a graph (a large one's execute varies by more
    # than that costs), one token and a tile, each format
    first_linear = [_execute_times(dev, *build_linears(fmt, 256, 256, m, nbytes=1), repeat)[1]
                    for fmt in formats for m in (1, 32)]
    return ExecuteRates(host_s, dispatch_s, stream, weight_gbps, linear_s, gmacs, row_s, threads,
                        _attention_key_s(dev, repeat, threads), max(statistics.median(first_linear), 0.0),
                        max(first_adds / 2, 0.0), wave_share, _attention_key_s(dev, repeat, threads, tokens=1),
                        *gated)


def _attention_key_s(dev: Device, repeat: int, threads: int, tokens: int = 32) -> float:
    """Attention's work per row of its kernel (DispatchNode.key_rows a token: a head, or in a batch
    the heads sharing a key/value head) and key it sees: 16 causal attentions of a batch of
    ``tokens`` (8 heads over 2 key/value heads of 64), each on caches of its own (512 rows: a model's layers
    read theirs from memory, not a cache the last one warmed), run with the batch at position
    448 and at 0 in turn (one graph: the host's drift hits both alike), the difference over the
    keys the rows saw besides, per waves_factor."""
    from .. import ops

    t, heads, kv_heads, dh, rows, far, count = tokens, 8, 2, 64, 512, 448, 16
    rng = np.random.default_rng(6)
    with ComputeGraph(GraphConfig(), device=dev) as g:
        q = g.add_input((t, heads * dh), np.float32, "q")
        step = g.add_input((2,), np.uint32, "step")
        for i in range(count):
            k, v = (g.prepack_tensor(g.add_tensorref(rng.standard_normal((rows, kv_heads * dh), dtype=np.float32),
                                                     f"{n}{i}")) for n in "kv")
            y = ops.sdpa(g, q, k, v, heads=heads, kv_heads=kv_heads, causal=True, step=step)
        g.set_output(y, "y")
        _prepared(g)
        q = rng.standard_normal((t, heads * dh), dtype=np.float32)
        near, at_far = _medians_in_turn([(g, {"q": q, "step": np.array([p, 0], np.uint32)}) for p in (0, far)],
                                        repeat)
        node = g.execute_nodes[-1]
    return max(at_far - near, 0.0) / (count * node.key_rows * t * far * waves_factor(node, threads))


def batch_costs(repeat: int, weights: int = 48) -> tuple[float, float]:
    """(CPU seconds, wait seconds) that each command buffer of a load costs besides its nodes:
    the profile's ``submit_us`` (its memory block, command buffer, timestamps, barrier, fence and
    submit, and the CPU's caches cold after the "GPU" ran on its cores) and ``fence_latency_us``
    (from a batch's last timestamp to the CPU running on after waiting for it). ``weights``
    weights of 1 MiB loaded in reduce-peak mode (each batch waited for, nothing overlaps) in
    batches of two and of about ten, on the device of ``$VKGRAPH_DEVICE``: the difference in CPU
    encode time, and in load time besides CPU encode and GPU time, over the difference in
    batches; medians over ``2 * repeat`` pairs of loads. An empty command buffer's submit and
    fence round trip, which calibrations measured before, took 27-29 and about 30 us on both CPU
    renderers; the CPU work per command buffer of such loads 125-224 us on lavapipe and 450-627 on
    SwiftShader, the wait 107-131 and 0 (Zen 4 host, 2026-11-29), and synthetic:256's reduce-peak
    loads in 73 command buffers took 26-27 ms more CPU than in 4 on both.
    Run in fresh processes (:func:`_in_fresh_processes`), as the loads it prices are."""
    arrays = [np.random.default_rng(i).standard_normal((256, 1024), dtype=np.float32) for i in range(weights)]

    def once(nodes: int) -> tuple[float, float, int]:  # on ``dev`` (below)
        cfg = GraphConfig().replace(prepack__reduce_peak_memory=True, prepack__threshold_nodes=nodes,
                                    prepack__initial_threshold_nodes=nodes, **SHADERS)
        with ComputeGraph(cfg, device=dev) as g:
            for i, a in enumerate(arrays):
                g.prepack_tensor(g.add_tensorref(a, f"w{i}"), "linear_4x4")
            g.prepare()
            r = g.run_prepack()
            return r.cpu_encode_s, r.load_s - r.cpu_encode_s - r.gpu_s, len(r.spans)

    with Device() as dev:
        # node thresholds: batches of about ten, of two
        pairs = _alternating(once, max(2, weights // 5), 1, repeat)
    per_batch = [[(b[k] - a[k]) / (b[2] - a[2]) for a, b in pairs] for k in (0, 1)]
    return max(statistics.median(per_batch[0]), 0.0), max(statistics.median(per_batch[1]), 0.0)


def node_costs(repeat: int, nbytes: int = 32 << 20,
               sizes: tuple[int, int] = (1 << 20, 256 << 10)) -> tuple[float, float]:
    """(CPU seconds, GPU seconds) that each packing dispatch of a load costs besides its bytes:
    the profile's ``encode_node_us`` (its buffer, descriptor set, texel view, recording, its
    source's release) and ``dispatch_us``. Legacy loads of the same ``nbytes`` of linear_4x4
    weights read from a file mapping (released after, as a load releases them) as weights of
    ``sizes[0]`` and of ``sizes[1]`` bytes (one row window each on this project's renderers), on
    the device of ``$VKGRAPH_DEVICE``: the difference in CPU encode and in GPU time over the
    difference in dispatches, medians over ``2 * repeat`` pairs of loads. Weights of 16 floats in
    memory, which calibrations packed before (a dispatch of one workgroup, no file pages),
    cost lavapipe's CPU 155 us a dispatch and its GPU 47.7 on the Zen 4 host, where this measured
    199-236 and 82-141 in five fresh processes (SwiftShader: 148 and 16.1 against 189-208 and
    16-42; 2026-11-29).
    Run in fresh processes (:func:`_in_fresh_processes`), as the loads it prices are."""
    import mmap
    import tempfile

    def once(size: int) -> tuple[float, float, int]:  # on ``dev``, from ``f`` (below)
        rows = size // 4096
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with ComputeGraph(GraphConfig().replace(**SHADERS), device=dev) as g:
            for i in range(nbytes // size):
                src = ArraySource(np.frombuffer(mm, np.float32, rows * 1024, i * size).reshape(rows, 1024),
                                  mapping=mm, offset=i * size)
                g.prepack_tensor(g.add_tensorref(src, f"w{i}", shape=(rows, 1024), dtype=np.float32), "linear_4x4")
            g.encode_prepack()
            r = g.prepack()
            return r.cpu_encode_s, r.gpu_s, r.packing_dispatches

    with tempfile.TemporaryFile() as f, Device() as dev:
        f.write(np.random.default_rng(4).standard_normal(nbytes // 4, dtype=np.float32).tobytes())
        f.flush()
        pairs = _alternating(once, *sizes, repeat)
    per = [statistics.median((b[k] - a[k]) / max(b[2] - a[2], 1) for a, b in pairs) for k in (0, 1)]
    return max(per[0], 1e-6), max(per[1], 1e-7)


def _encoded(dev: Device, packer: str, arrays: list[np.ndarray],
             populated: bool = False) -> tuple[ComputeGraph, int]:
    """A graph packing ``arrays`` in one legacy command buffer, encoded and not submitted: (graph,
    packed bytes). ``populated``: the packed weights' memory gets its pages before (as a staged
    load's on a CPU renderer: scheduler.PrepackPlan.populates_destinations), not at the shader's
    first stores."""
    g = ComputeGraph(GraphConfig().replace(**SHADERS), device=dev)
    try:
        refs = [g.prepack_tensor(g.add_tensorref(a, f"w{i}"), packer) for i, a in enumerate(arrays)]
        g.prepare()
        if populated:
            g.memory.allocate_blocks(((g.values[r], False) for r in refs), populate=True)
        g.encode_prepack()
    except BaseException:
        g.destroy()
        raise
    return g, sum(g.values[x].nbytes for x in refs)


def _big_weights(size_mb: int) -> list[np.ndarray]:
    """``size_mb`` MiB of fp32 weights as 4 tensors of [size_mb * 16, 4096]."""
    rows = size_mb * 64
    return np.split(np.random.default_rng(1).standard_normal((rows, 4096), dtype=np.float32), 4)


def _settled_populate_share(size_mb: int, rounds: int = 3) -> float:
    """What a settled load (the third of a process on) pays of a first load's populating of the
    packing shaders' memory (LoadReport.populate_s): staged loads of synthetic:<4 x size_mb> in
    fresh processes (the device of ``$VKGRAPH_DEVICE``), the median over the settled loads against
    the first, the median over ``rounds`` processes. About 1 on SwiftShader, whose device memory
    is mapped anew for every load (a synthetic:256 load's 79-84 ms in each of five loads of a
    process), less on lavapipe, whose loads from the third on get pages the last one freed
    (synthetic:256: 95, 106, 36, 15 and 10 ms; synthetic:128: 0.40 of the first's). The loads
    populate whatever the device's choice (``prepack.populate_destinations = true``)."""
    from .bench import SETTLING_LOADS, load_in_subprocess

    shares = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "populate.toml"
        config.write_text('[prepack]\npopulate_destinations = true\nhost_packing = "never"\n')  # SHADERS
        for _ in range(rounds):
            loads = load_in_subprocess(f"synthetic:{4 * size_mb}", "staged", str(config), SETTLING_LOADS + 2,
                                       check="last")
            first = loads[0]["populate_s"]
            settled = statistics.median(r["populate_s"] for r in loads[SETTLING_LOADS:])
            shares.append(settled / first if first > 0 else 0.0)
    return statistics.median(shares)


def pack_gbps(packer: str, size_mb: int, repeat: int, dispatch_s: float, populated: bool = False) -> float:
    """GPU packing bandwidth of ``packer`` on the device of ``$VKGRAPH_DEVICE``: median of
    ``repeat`` packings of :func:`_big_weights` after a warm-up one (single GPU timings on a
    shared machine vary by +-30%), ``dispatch_s`` per dispatch taken off. Run in a fresh process
    (:func:`_in_fresh_processes`): in the calibration's own process, after its other
    measurements, it measured 2.3 GB/s on lavapipe (0.69 on SwiftShader) against 1.45..1.5
    (0.5..0.62) in fresh processes, which is what loads' packing ran at: a CPU renderer's worker
    threads fault in the pages of device memory new to the process at the shader's first stores.
    ``populated``: into memory whose pages were made before (:func:`_encoded`), as staged loads
    on CPU renderers pack."""
    arrays = _big_weights(size_mb)
    with Device() as dev:
        _pack(dev, packer, arrays, populated)
        runs = [_pack(dev, packer, arrays, populated) for _ in range(repeat)]
    return statistics.median(packed / max(gpu - len(arrays) * dispatch_s, 1e-9) / 1e9 for _, gpu, packed in runs)


def _in_fresh_processes(call: str, rounds: int = 3) -> Any:
    """The median of ``call`` (a call of a function of this module, as Python source; of a
    tuple, each value's median) run in ``rounds`` fresh Python processes on the same device
    (``$VKGRAPH_DEVICE``): on lavapipe a process packs at one of two speeds (linear_4x4:
    1.40..1.48 or 1.81..1.97 GB/s in eight processes in a row)."""
    from .bench import python_in_subprocess

    code = f"from vkgraph.tools import calibrate; print(calibrate.{call})"
    runs = [ast.literal_eval(python_in_subprocess(["-c", code]).splitlines()[-1]) for _ in range(rounds)]
    if isinstance(runs[0], tuple):  # each value's median
        return tuple(statistics.median(float(r[k]) for r in runs) for k in range(len(runs[0])))
    return statistics.median(float(r) for r in runs)


def _pack(dev: Device, packer: str, arrays: list[np.ndarray], populated: bool = False) -> tuple[float, float, int]:
    """(CPU encode s, GPU s, packed bytes) of packing ``arrays`` in one legacy command buffer
    (``populated``: :func:`_encoded`)."""
    g, packed = _encoded(dev, packer, arrays, populated)
    with g:
        r = g.prepack()
        return r.cpu_encode_s, r.gpu_s, packed


def contention_batches(alone: bool, model: str) -> tuple[float, float, float, float]:
    """A fresh process's first staged load of ``model`` on the device of ``$VKGRAPH_DEVICE``,
    its batches but the first and the last: the medians of each batch's CPU time (encoding and
    submitting it), GPU time, and the time each of those overlapped the other's work on the
    neighbouring batch. ``alone``: each batch waited for before the next is encoded (the same
    plan, nothing overlapping: prepack.Staged.wait_each)."""
    import gc

    from ..graph import prepack
    from ..models.registry import open_model
    from .bench import config_for

    prepack.Staged.wait_each = alone
    try:
        with open_model(model) as m, ComputeGraph(config_for("staged", None).replace(**SHADERS)) as g:
            m.build(g)
            g.prepare()
            gc.collect()
            spans = g.run_prepack().spans
    finally:
        prepack.Staged.wait_each = False

    def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
        return max(0.0, min(a1, b1) - max(a0, b0))

    rows = [(s.cpu_end_s - s.cpu_start_s, s.gpu_end_s - s.gpu_start_s,
             overlap(s.cpu_start_s, s.cpu_end_s, prev.gpu_start_s, prev.gpu_end_s),
             overlap(s.gpu_start_s, s.gpu_end_s, nxt.cpu_start_s, nxt.cpu_end_s))
            for prev, s, nxt in zip(spans, spans[1:], spans[2:])]
    return tuple(statistics.median(r[k] for r in rows) for k in range(4)) if rows else (0.0, 0.0, 0.0, 0.0)


def contention(size_mb: int, rounds: int = 5) -> tuple[float, float]:
    """(CPU rate, GPU rate) while both run, each relative to its speed alone: the first staged
    loads of synthetic:<8 x size_mb> in fresh processes, ``rounds`` with the batches one after
    the other (:func:`contention_batches` alone) and as many as staged loads run them, in turn.
    Over the time a batch's CPU (GPU) work overlapped the other's, it did its work alone less
    the time it ran outside the overlap. Measured before with encode-like CPU work (copies and
    an interpreter loop) against a packing command buffer, lavapipe's CPU rate came out at
    0.72 on the Zen 4 host, where its loads' CPU work took as long per batch with the GPU packing
    as without (synthetic:256, first loads, five fresh processes each: 8.50 against 8.64 ms).
    1.0 each where nothing overlapped (a load of fewer than three batches)."""
    model = f"synthetic:{8 * size_mb}"
    pairs = [tuple(_in_fresh_processes(f"contention_batches({alone}, {model!r})", rounds=1) for alone in (True, False))
             for _ in range(rounds)]
    med = statistics.median
    alone_cpu, alone_gpu = med(a[0] for a, _ in pairs), med(a[1] for a, _ in pairs)
    cpu, gpu, cpu_overlap, gpu_overlap = (med(b[k] for _, b in pairs) for k in range(4))
    clamp = lambda v: min(1.0, max(0.05, v))  # noqa: E731
    return (clamp((alone_cpu - cpu + cpu_overlap) / cpu_overlap) if cpu_overlap > 0 else 1.0,
            clamp((alone_gpu - gpu + gpu_overlap) / gpu_overlap) if gpu_overlap > 0 else 1.0)


def _median_of(values: list[Any]) -> Any:
    """The per-field median of several calibrations' values: floats and dicts of floats (key by
    key) and dataclasses (field by field); anything else (names, counts, flags) from the first."""
    first = values[0]
    if isinstance(first, float):
        return statistics.median(values)
    if isinstance(first, dict):
        return {k: _median_of([v[k] for v in values if k in v]) for k in first}
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{f.name: _median_of([getattr(v, f.name) for v in values])
                                             for f in dataclasses.fields(first)})
    return first


def calibrate_rounds(device: Device, rounds: int) -> tuple[Profile, dict[str, Any]]:
    """:func:`calibrate` ``rounds`` times, each rate the median over the rounds: on a shared
    machine single calibrations of the same rate differ by 10-50% (lavapipe on this 2-core VM:
    fresh_device_gbps 3.6 and 5.4, host packing 1.4 and 2.3 GB/s in two calibrations in a row)."""
    if rounds < 1:
        raise ValueError(f"calibrate: rounds must be >= 1, got {rounds}")
    results = [calibrate(device) for _ in range(rounds)]
    if rounds == 1:
        return results[0]
    profile = _median_of([p for p, _ in results])
    profile = dataclasses.replace(profile, source=f"{profile.source}, median of {rounds} calibrations")
    return profile, {"rounds": [raw for _, raw in results]}


#: a calibration's weights (MiB) and repeats per measurement (calibrate's defaults)
SIZE_MB, REPEAT = 32, 7


def load_rates(device: Device, dispatch_s: float, *, size_mb: int = SIZE_MB, repeat: int = REPEAT) -> dict[str, Any]:
    """The profile's rates of a load's bytes (the fields of :class:`Profile` they go to): the CPU's
    copies into touched and fresh memory, GPU packing (and on a CPU renderer into populated
    memory), the host forms' packing and populating fresh memory, and how much encoding and
    packing slow each other while both run (:func:`contention`), each as calibrate measures it
    (``dispatch_s``: a packing dispatch's cost, taken off the packing). The rates a shared host's
    speed moves (by a fifth or more within hours on this project's VM), which ``vkgraph simulate
    --validate --rates-now`` measures again to tell the model's error from that drift."""
    copy = _copy_gbps(device, size_mb << 20, "held")
    pack = {"linear_4x4": _in_fresh_processes(f"pack_gbps('linear_4x4', {size_mb}, {repeat}, {dispatch_s!r})")}
    pack["default"], pack["identity"] = pack["linear_4x4"], copy
    # GGML blocks split into planes, timed as the other host forms: SmolLM2's first loads on
    # lavapipe (66 MB of q4_1 in planes) took 0.056-0.059 s, priced at 0.048 when this was the
    # later loads' copy rate times the split's speed against a copy (2.96 GB/s)
    host = {name: _in_fresh_processes(f"host_pack_gbps({name!r}, {size_mb}, {repeat})")
            for name in (f"{fmt}_planes" for fmt in FORMATS)}
    # fp32 host forms: a cost a weight and a rate of its bytes (MiniLM's weights of 0.56-2.25 MiB)
    host_node = {}
    for name in ("linear_4x4", "transposed"):
        host_node[name], host[name] = _in_fresh_processes(f"host_pack_node_costs({name!r}, {size_mb}, {repeat})")
    host["default"] = host["linear_4x4"]
    host_4k = _in_fresh_processes(f"host_pack_4k_gbps({size_mb}, {repeat})") if device.is_cpu else None
    # staged loads on CPU renderers populate what the shaders write (scheduler.PrepackPlan.populates_destinations)
    populated = {"linear_4x4": _in_fresh_processes(f"pack_gbps('linear_4x4', {size_mb}, {repeat}, {dispatch_s!r}, "
                                                   "populated=True)")} if device.is_cpu else {}
    if populated:
        populated["default"] = populated["linear_4x4"]
    # on huge pages only while a load's weights fit in HUGE_PAGES_UP_TO_NBYTES (scheduler.py)
    huge_mb = min(4 * size_mb, HUGE_PAGES_UP_TO_NBYTES >> 20)
    cpu_rate, gpu_rate = contention(size_mb)
    return {"copy_gbps": copy, "fresh_copy_gbps": _in_fresh_processes(f"fresh_copy_gbps('fresh', {size_mb})"),
            "direct_copy_gbps": _in_fresh_processes(f"fresh_copy_gbps('block', {size_mb})")
            if device.host_visible_device_local else None,
            "pack_gbps": pack, "host_pack_gbps": host, "host_pack_node_s": host_node, "host_pack_4k_gbps": host_4k,
            "populated_pack_gbps": populated,
            "populate_gbps": _in_fresh_processes(f"populate_gbps({4 * size_mb})") if device.is_cpu else None,
            "populate_huge_gbps": _in_fresh_processes(f"populate_gbps({huge_mb}, huge_pages=True)")
            if device.is_cpu else None, "cpu_rate": cpu_rate, "gpu_rate": gpu_rate}


def calibrate(device: Device, *, size_mb: int = SIZE_MB, repeat: int = REPEAT) -> tuple[Profile, dict[str, Any]]:
    """Micro-benchmarks on ``device``; returns the profile and the raw measurements.

    Packing is measured the way a load packs: several tensors per command buffer, after a
    warm-up graph, so that the packed tensors get memory the previous graph freed (on lavapipe,
    where device memory is the process's heap, packing into pages never touched before is about
    twice as slow, and only the first load of a process does that for all its weights)."""
    nbytes = size_mb << 20
    source_read = _source_read_gbps(nbytes)
    submit_s, fence_s = _in_fresh_processes(f"batch_costs({repeat})")
    encode_node_s, dispatch_s = _in_fresh_processes(f"node_costs({repeat}, {nbytes})")
    encode_direct_s, settled_direct = _direct_writes(device, repeat) or (None, None)
    rates = load_rates(device, dispatch_s, size_mb=size_mb, repeat=repeat)
    fresh_device = _fresh_device_gbps(size_mb)
    # the weights a CPU renderer's loads write themselves (SmolLM2's GGML blocks, embeddings)
    fresh_direct = _fresh_device_gbps(size_mb, host_packed=True) if device.is_cpu else None
    settled_populate = _settled_populate_share(size_mb) if device.is_cpu else None
    execute = _execute_rates(device, repeat, 2 * nbytes)
    p = device.physical
    profile = Profile(p.name, p.host_visible_device_local, max(16, p.limits["minStorageBufferOffsetAlignment"]),
                      encode_node_s=encode_node_s, submit_s=submit_s, fence_latency_s=fence_s, dispatch_s=dispatch_s,
                      source=f"vkgraph simulate --calibrate on {p.name} ({p.driver}), {datetime.date.today()}",
                      source_read_gbps=source_read, cpu_renderer=device.is_cpu,
                      fresh_device_gbps=fresh_device, fresh_direct_gbps=fresh_direct, renderer=device.renderer,
                      simd_width=device.simd_width, max_texel_buffer_elements=p.limits["maxTexelBufferElements"],
                      execute=execute, encode_direct_s=encode_direct_s, settled_direct_gbps=settled_direct,
                      host_cpu=device.host_cpu, settled_populate_share=settled_populate, **rates)
    raw = {**rates, "fresh_device_gbps": fresh_device, "fresh_direct_gbps": fresh_direct,
           "settled_populate_share": settled_populate, "execute": dataclasses.asdict(execute),
           "source_read_gbps": source_read, "submit_s": submit_s, "fence_latency_s": fence_s,
           "encode_node_s": encode_node_s, "encode_direct_s": encode_direct_s, "settled_direct_gbps": settled_direct,
           "dispatch_s": dispatch_s}
    return profile, raw


def _host_cpu_toml(p: Profile) -> str:
    return f'\nhost_cpu = "{p.host_cpu}"  # the processor that ran the renderer' if p.host_cpu else ""


def _host_node_toml(p: Profile) -> str:
    if not p.host_pack_node_s:
        return ""
    rows = "\n".join(f"{k} = {v * 1e6:.4g}" for k, v in sorted(p.host_pack_node_s.items()))
    return f"""
[cpu.host_pack_node_us]  # a host form's cost a weight besides its bytes (its rate above: of its bytes alone)
{rows}
"""


def profile_toml(p: Profile) -> str:
    pack = "\n".join(f"{k} = {v:.4g}" for k, v in sorted(p.pack_gbps.items()))
    host = "\n".join(f"{k} = {v:.4g}" for k, v in sorted(p.host_pack_gbps.items()))
    return f"""# Measured by `vkgraph simulate --calibrate`.
source = "{p.source}"

[device]
name = "{p.name}"
host_visible_device_local = {str(p.host_visible_device_local).lower()}
staging_alignment = {p.staging_alignment}
cpu_renderer = {str(p.cpu_renderer).lower()}
renderer = "{p.renderer}"
simd_width = {p.simd_width}
max_texel_buffer_elements = {p.max_texel_buffer_elements}{_host_cpu_toml(p)}

[cpu]
copy_gbps = {p.copy_gbps:.4g}          # into already-touched memory
fresh_copy_gbps = {p.fresh_copy_gbps:.4g}    # into freshly allocated pages
source_read_gbps = {p.source_read_gbps:.4g}   # first read of weights through a file mapping
encode_node_us = {p.encode_node_s * 1e6:.4g}{_direct_toml(p)}
submit_us = {p.submit_s * 1e6:.4g}   # each command buffer: its memory block, recording, fence, submit

[cpu.host_pack_gbps]  # the CPU packing into device memory: host forms (prepack.host_packing = "cpu-renderer"), GGML blocks in planes
{host}
{_host_node_toml(p)}
[gpu]
fence_latency_us = {p.fence_latency_s * 1e6:.4g}
dispatch_us = {p.dispatch_s * 1e6:.4g}
fresh_device_gbps = {p.fresh_device_gbps:.4g}  # first touch of device memory new to the process (first loads); 0: free

[gpu.pack_gbps]  # per packer; on a CPU renderer into memory the shader's first stores fault in (legacy, reduce-peak)
{pack}
{_populated_toml(p)}
[contention]  # speed of CPU encoding and GPU packing, relative to each alone, while both run
cpu_rate = {p.cpu_rate:.3g}
gpu_rate = {p.gpu_rate:.3g}
{_execute_toml(p.execute)}"""


def _populated_toml(p: Profile) -> str:
    if not p.populated_pack_gbps:
        return ""
    rates = "\n".join(f"{k} = {v:.4g}" for k, v in sorted(p.populated_pack_gbps.items()))
    return f"""
[gpu.populated_pack_gbps]  # into memory populated before (staged loads on CPU renderers)
{rates}
"""


def _direct_toml(p: Profile) -> str:
    out = ""
    if p.encode_direct_s is not None:
        out += f"\nencode_direct_us = {p.encode_direct_s * 1e6:.4g}   # a weight written straight into device memory"
    if p.direct_copy_gbps is not None:
        out += f"\ndirect_copy_gbps = {p.direct_copy_gbps:.4g}   # into a fresh memory block of such weights (first loads)"
    if p.settled_direct_gbps is not None:
        out += f"\nsettled_direct_gbps = {p.settled_direct_gbps:.4g}   # their bytes in later loads"
    if p.fresh_direct_gbps is not None:
        out += f"\nfresh_direct_gbps = {p.fresh_direct_gbps:.4g}   # a first load's extra for them (0: free)"
    if p.host_pack_4k_gbps is not None:
        out += (f"\nhost_pack_4k_gbps = {p.host_pack_4k_gbps:.4g}   # host forms of 8 MiB fp32 weights into 4 KiB pages "
                "(loads of more than 128 MiB of CPU-written weights)")
    if p.populate_gbps is not None:
        out += f"\npopulate_gbps = {p.populate_gbps:.4g}   # a packing shader's fresh memory made at once (staged first loads)"
    if p.populate_huge_gbps is not None:
        out += f"\npopulate_huge_gbps = {p.populate_huge_gbps:.4g}   # the same on huge pages (loads of at most 128 MiB)"
    if p.settled_populate_share is not None:
        out += f"\nsettled_populate_share = {p.settled_populate_share:.4g}   # of that, what a settled load (the third on) pays"
    return out


def _execute_toml(e: ExecuteRates | None) -> str:
    if e is None:
        return ""
    weights = "\n".join(f"{k} = {v:.4g}" for k, v in sorted(e.weight_gbps.items()))
    gmacs = "\n".join(f"{k} = {v:.4g}" for k, v in sorted(e.gmacs.items()))
    gmacs = f"\n[execute.gmacs]  # a linear's multiply-adds, per format (none: not modelled)\n{gmacs}\n" if gmacs else ""
    return f"""
[execute]  # running a graph: vkgraph simulate --decode (tools/simulate_run.py)
host_us = {e.host_s * 1e6:.4g}       # one execute besides its dispatches: submit, fence, inputs, outputs
dispatch_us = {e.dispatch_s * 1e6:.4g}   # each dispatch besides its work
stream_gbps = {e.stream_gbps:.4g}   # bytes a memory-bound kernel moves
linear_dispatch_us = {e.linear_dispatch_s * 1e6:.4g}   # each linear's dispatch besides its rows and weight
linear_row_ns = {e.linear_row_s * 1e9:.4g}   # each weight row a linear's pass computes
threads = {e.threads}   # a CPU renderer's worker threads (0: a GPU)
attention_key_ns = {e.attention_key_s * 1e9:.4g}   # attention's work per row of its kernel (a head; a batch's heads sharing a key/value head) and key it sees
first_linear_us = {e.first_linear_s * 1e6:.4g}   # a linear pipeline's first dispatch in a process, beyond its work
first_dispatch_us = {e.first_dispatch_s * 1e6:.4g}   # any other pipeline's
wave_share = {e.wave_share:.3g}   # the share of a partial wave's idle SIMD batches a linear's rows and bytes pay
step_key_ns = {e.step_key_s * 1e9:.4g}   # attention's work per row and key with one query token (a decoded token)
gated_step = {e.gated_step:.3g}   # a gated linear's work against a plain one of its two weights: one token
gated_tiles = {e.gated_tiles:.3g}   # the same in tiles of tokens

[execute.weight_gbps]  # a linear's weight streamed, per format
{weights}
{gmacs}"""


VALIDATE_MODELS = ("synthetic:256", "minilm", "smollm2")
VALIDATE_MODES = ("legacy", "staged", "reduce-peak")


def validate(profile_name: str, models: tuple[str, ...] = VALIDATE_MODELS, repeat: int = 1,
             config: str | None = None, progress=None, loads: int = 4,
             rates_now: bool = False) -> list[dict[str, Any]]:
    """Simulated vs measured load time and peak staging in flight (the median high-water mark of the
    settled loads). Each cell is measured in ``repeat``
    fresh processes, interleaved round by round so that drift of the machine hits every cell
    alike; each process loads ``loads`` times. The first :data:`~vkgraph.bench.SETTLING_LOADS` loads of a process
    pay page faults on memory the process does not hold yet, which on a VM can cost several times
    the load itself and varies from run to run; the later loads reuse memory the process already
    had, as the simulator assumes. The loads follow each other with nothing in between (only the
    last is checked against the model's reference): work between loads changes which pages the
    next one gets, and on a VM pages the host must back again cost several times more to touch
    (benchmarks/fresh_pages.py). Rows carry the first loads (``fresh_*``), the second loads
    (``second_*``) and the settled ones (``measured_*``; median, min, max); ``load_error`` is the
    settled simulation against the settled loads' median, ``fresh_error`` the first-load
    simulation (``simulate(first_load=True)``) against the first loads' median. With
    ``rates_now`` the profile's load rates (:func:`load_rates`) are measured again before every
    round and that round's loads simulated with them too: ``fresh_error_now`` and
    ``load_error_now`` are the medians over the rounds of each round's error,
    ``simulated_fresh_now`` and ``simulated_load_now`` the medians of its simulations. That is the
    load model's own error, apart from how far the host's speed has moved since the profile was
    calibrated, and from its drift within the run (a shared VM's, by a fifth or more within
    minutes: rates measured once, before all the rounds, put SwiftShader's staged loads of
    synthetic:256 at +18% and +28% in two runs where the rates of a minute later simulated the
    loads then measured within 14%)."""
    from .bench import SETTLING_LOADS, config_for, load_in_subprocess

    if loads <= SETTLING_LOADS:
        raise ValueError(f"--loads must be > {SETTLING_LOADS}: the first {SETTLING_LOADS} loads of a process "
                         "fault in memory the process does not hold yet and are not compared")
    med = statistics.median
    profile = load_profile(profile_name)
    now: list[Profile] = []  # per round, with rates_now
    cells = [(model, mode) for model in models for mode in VALIDATE_MODES]
    fresh: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    second: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    settled: dict[tuple[str, str], list[list[dict[str, Any]]]] = {c: [] for c in cells}  # per round
    steps = len(cells) + rates_now  # a round's, for progress: its loads' processes and its rates
    for r in range(repeat):
        if rates_now:
            with Device() as dev:
                now.append(dataclasses.replace(profile, **load_rates(dev, profile.dispatch_s)))
            if progress:
                progress(r * steps + 1, repeat * steps)
        for i, (model, mode) in enumerate(cells):
            results = load_in_subprocess(model, mode, config, loads, check="last")
            fresh[(model, mode)].append(results[0])
            second[(model, mode)].append(results[1])
            settled[(model, mode)].append(results[SETTLING_LOADS:])
            if progress:
                progress(r * steps + rates_now + i + 1, repeat * steps)
    rows = []
    for model in models:
        nodes = model_nodes(model, profile, config_for(VALIDATE_MODES[0], config))
        for mode in VALIDATE_MODES:
            times = [x["load_s"] for run in settled[(model, mode)] for x in run]
            first = [x["load_s"] for x in fresh[(model, mode)]]
            m_load = med(times)
            m_staging = int(med(x["peak_staging_nbytes"] for run in settled[(model, mode)] for x in run))
            cfg = config_for(mode, config)
            sim = simulate(nodes, cfg, profile, mode)
            sim_first = simulate(nodes, cfg, profile, mode, first_load=True)
            rows.append({"model": model, "mode": mode, "measured_load_s": m_load, "measured_min_s": min(times),
                         "measured_max_s": max(times), "fresh_load_s": med(first),
                         "fresh_min_s": min(first), "fresh_max_s": max(first),
                         "simulated_fresh_s": sim_first.load_s,
                         "fresh_error": sim_first.load_s / med(first) - 1,
                         "second_load_s": med(x["load_s"] for x in second[(model, mode)]),
                         "simulated_load_s": sim.load_s, "load_error": sim.load_s / m_load - 1,
                         "measured_peak_staging": m_staging, "simulated_peak_staging": sim.peak_staging_nbytes,
                         "staging_error": (sim.peak_staging_nbytes / m_staging - 1) if m_staging else 0.0})
            if now:
                first_now = [simulate(nodes, cfg, p, mode, first_load=True).load_s for p in now]
                settled_now = [simulate(nodes, cfg, p, mode).load_s for p in now]
                rows[-1].update(simulated_fresh_now=med(first_now),
                                fresh_error_now=med(t / x - 1 for t, x in zip(first_now, first)),
                                simulated_load_now=med(settled_now),
                                load_error_now=med(t / med(x["load_s"] for x in run) - 1
                                                   for t, run in zip(settled_now, settled[(model, mode)])))
    return rows


def execute_rates_now() -> ExecuteRates:
    """One calibration's [execute] rates (:func:`_execute_rates`), measured in a fresh process on
    the device of ``$VKGRAPH_DEVICE``."""
    import json

    from .bench import python_in_subprocess

    code = ("import dataclasses, json; from vkgraph.runtime import Device; from vkgraph.tools import calibrate as c\n"
            "with Device() as d:\n"
            "    print(json.dumps(dataclasses.asdict(c._execute_rates(d, c.REPEAT, 2 * (c.SIZE_MB << 20))), "
            "default=float))")
    return ExecuteRates(**json.loads(python_in_subprocess(["-c", code]).splitlines()[-1]))


def validate_decode(profile_name: str, model: str = "smollm2", repeat: int = 3, prompt_tokens: int = 64,
                    new_tokens: int = 32, progress=None, rates_now: bool = False) -> dict[str, Any]:
    """Predicted (tools/simulate_run.py) vs measured prefill and decode speed: ``vkgraph bench
    decode --json`` in ``repeat`` fresh processes (the device of ``$VKGRAPH_DEVICE``), medians.
    With ``rates_now`` the profile's [execute] rates are also measured again before every
    process (:func:`execute_rates_now`) and that process's figures predicted with them:
    ``error_now`` is the median of those errors, ``simulated_now`` of those predictions: the run
    model's own error, apart from how far the host's speed has moved since the profile was
    calibrated and within the run (a shared VM's, by a fifth or more within minutes)."""
    import json

    from .bench import python_in_subprocess
    from .simulate_run import simulate_decode

    profile = load_profile(profile_name)
    pred = simulate_decode(model, profile, prompt_tokens, new_tokens)
    now = []  # per process, with rates_now
    runs = []
    for r in range(repeat):
        if rates_now:
            rates = execute_rates_now()
            now.append(simulate_decode(model, dataclasses.replace(profile, execute=rates), prompt_tokens, new_tokens))
            if progress:
                progress(2 * r + 1, 2 * repeat)
        out = python_in_subprocess(["-m", "vkgraph", "bench", "decode", "--model", model, "--prompt-tokens",
                                    str(prompt_tokens), "--new-tokens", str(new_tokens), "--json"])
        runs.append(json.loads(out.strip().splitlines()[-1]))
        if progress:
            progress((1 + rates_now) * (r + 1), (1 + rates_now) * repeat)
    row: dict[str, Any] = {"model": model, "profile": profile_name, "prompt_tokens": prompt_tokens,
                           "new_tokens": new_tokens, "repeat": repeat, "device": runs[0]["device"]}
    for key, predicted in (("prefill_tok_s", pred.prefill_tok_s), ("decode_tok_s", pred.decode_tok_s),
                           ("time_to_first_token_s", pred.time_to_first_token_s)):
        got = [x[key] for x in runs]
        row[key] = {"measured": statistics.median(got), "min": min(got), "max": max(got), "simulated": predicted,
                    "error": predicted / statistics.median(got) - 1}
        if now:
            row[key]["simulated_now"] = statistics.median(getattr(p, key) for p in now)
            row[key]["error_now"] = statistics.median(getattr(p, key) / x - 1 for p, x in zip(now, got))
    return row
