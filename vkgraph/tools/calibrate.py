"""Measure a simulator profile on the current device (``vkgraph simulate --calibrate``) and
compare the simulator with measured loads (``vkgraph simulate --validate``)."""

from __future__ import annotations

import datetime
import statistics
import time
from typing import Any

import numpy as np

from ..config import GraphConfig
from ..graph.compute_graph import ComputeGraph
from ..ggml import FORMATS
from ..graph.packers import get_packer
from ..graph.values import ArraySource, TensorRef
from ..runtime import Buffer, CommandPool, Device, Fence, MemoryKind
from .simulate import Profile, load_profile, model_nodes, simulate


def _median(f, repeat: int = 3) -> float:
    return statistics.median(f() for _ in range(repeat))


def _copy_gbps(dev: Device, nbytes: int, fresh: bool) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    keep = Buffer(dev, nbytes, MemoryKind.UPLOAD)
    keep.write(src)

    def once() -> float:
        t0 = time.perf_counter()
        if fresh:
            with Buffer(dev, nbytes, MemoryKind.UPLOAD) as b:
                b.write(src)
                return time.perf_counter() - t0
        keep.write(src)
        return time.perf_counter() - t0

    try:
        return nbytes / _median(once) / 1e9
    finally:
        keep.destroy()


def _source_read_gbps(nbytes: int) -> float:
    """First read of a file through a fresh mapping (page faults; the file is in the page cache),
    as loads read weights from safetensors/GGUF files."""
    import mmap
    import os
    import tempfile

    data = np.random.default_rng(2).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(data)
    dst[:] = data  # touched destination: what is timed is reading the mapping
    with tempfile.NamedTemporaryFile() as f:
        f.write(data.tobytes())
        f.flush()

        def once() -> float:
            with open(f.name, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    t0 = time.perf_counter()
                    np.copyto(dst, np.frombuffer(mm, np.uint8))
                    t = time.perf_counter() - t0
                    t_copy = _time_copy(dst, data)
                    return t - t_copy
                finally:
                    del mm
        os.sync()
        extra = _median(once, 5)
        # 0 means "free": the mapping read no slower than plain memory (within timer noise)
        return nbytes / extra / 1e9 if extra > 1e-3 else 0.0


def _time_copy(dst: np.ndarray, src: np.ndarray) -> float:
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def _host_pack_gbps(packer: str, arrays: list[np.ndarray], repeat: int) -> float:
    """The packer's host form (graph.packers) packing ``arrays`` into freshly allocated memory,
    as a host-packed load writes straight into fresh device pages."""
    p = get_packer(packer)
    refs = [TensorRef(f"w{i}", a.shape, a.dtype, ArraySource(a), quant=packer if packer in FORMATS else "")
            for i, a in enumerate(arrays)]

    def once() -> float:
        outs = [np.empty(p.packed_nbytes(r), np.uint8) for r in refs]
        t0 = time.perf_counter()
        for r, a, out in zip(refs, arrays, outs):
            p.pack_host(r, a.reshape(-1).view(np.uint8), out)
        return time.perf_counter() - t0

    once()
    return sum(a.nbytes for a in arrays) / _median(once, repeat) / 1e9


def _round_trip(dev: Device) -> tuple[float, float]:
    """(submit seconds, fence latency seconds) of an empty command buffer."""
    with CommandPool(dev) as pool, Fence(dev) as fence:
        (cmd,) = pool.allocate()
        cmd.begin()
        cmd.end()
        submits, trips = [], []
        for _ in range(100):
            t0 = time.perf_counter()
            dev.submit([cmd], fence)
            t1 = time.perf_counter()
            fence.wait()
            trips.append(time.perf_counter() - t0)
            submits.append(t1 - t0)
            fence.reset()
    s = statistics.median(submits)
    return s, max(statistics.median(trips) - s, 0.0)


def _encoded(dev: Device, packer: str, arrays: list[np.ndarray], quant: str = "") -> tuple[ComputeGraph, int, float]:
    """A graph packing ``arrays`` in one legacy command buffer, encoded and not submitted: (graph,
    packed bytes, perf_counter at the start of encoding, which the load report's times are
    relative to)."""
    g = ComputeGraph(GraphConfig(), device=dev)
    try:
        refs = [g.prepack_tensor(g.add_tensorref(a, f"w{i}", quant=quant), packer) for i, a in enumerate(arrays)]
        g.prepare()
        t0 = time.perf_counter()
        g.encode_prepack()
    except BaseException:
        g.destroy()
        raise
    return g, sum(g.values[x].nbytes for x in refs), t0


def _pack(dev: Device, packer: str, arrays: list[np.ndarray], quant: str = "") -> tuple[float, float, int]:
    """(CPU encode s, GPU s, packed bytes) of packing ``arrays`` in one legacy command buffer."""
    g, packed, _ = _encoded(dev, packer, arrays, quant)
    with g:
        r = g.prepack()
        return r.cpu_encode_s, r.gpu_s, packed


def _cpu_work(src: np.ndarray, dst: np.ndarray, units: int) -> tuple[float, float]:
    """Encode-like CPU work: per unit, copy ``src`` into ``dst`` and some interpreter work.
    Returns (start, end) on the perf_counter clock."""
    t0 = time.perf_counter()
    for u in range(units):
        off = (u * src.nbytes) % (dst.nbytes - src.nbytes)
        dst[off:off + src.nbytes] = src
        x = 0
        for k in range(1500):
            x += k
    return t0, time.perf_counter()


def _contention(dev: Device, arrays: list[np.ndarray], repeat: int) -> tuple[float, float]:
    """(CPU rate, GPU rate) while both run, each relative to its speed alone. Rounds alternate a
    packing command buffer alone, encode-like CPU work alone (about half the GPU's time), and
    the two together; the rates come from the medians: over their overlap, each did its work
    alone minus the time it ran outside the overlap."""
    import threading

    rng = np.random.default_rng(3)
    src = rng.integers(0, 255, 256 << 10, dtype=np.uint8)
    dst = np.ones(64 << 20, np.uint8)

    _pack(dev, "linear_4x4", arrays)  # warm-up (the memory it frees is what the next graphs get)
    c0, c1 = _cpu_work(src, dst, 20)
    t_unit = (c1 - c0) / 20
    gpu_alone, cpu_alone, gpu_both, cpu_both, overlaps = [], [], [], [], []
    units = 0
    for _ in range(repeat):
        gpu_alone.append(_pack(dev, "linear_4x4", arrays)[1])
        units = units or max(10, int(gpu_alone[0] / 2 / t_unit))
        c0, c1 = _cpu_work(src, dst, units)
        cpu_alone.append(c1 - c0)
        g, _, t0 = _encoded(dev, "linear_4x4", arrays)
        with g:
            box: dict[str, Any] = {}
            th = threading.Thread(target=lambda: box.setdefault("report", g.prepack()))
            th.start()
            c0, c1 = _cpu_work(src, dst, units)
            th.join()
        span = box["report"].spans[0]
        gpu_both.append(span.gpu_s)
        cpu_both.append(c1 - c0)
        overlaps.append(min(c1, t0 + span.gpu_end_s) - max(c0, t0 + span.gpu_start_s))
    med = statistics.median
    overlap = med(overlaps)
    if overlap <= 0:
        return 1.0, 1.0
    clamp = lambda v: min(1.0, max(0.05, v))  # noqa: E731
    return (clamp((med(cpu_alone) - med(cpu_both) + overlap) / overlap),
            clamp((med(gpu_alone) - med(gpu_both) + overlap) / overlap))


def calibrate(device: Device, *, size_mb: int = 32, repeat: int = 7) -> tuple[Profile, dict[str, Any]]:
    """Micro-benchmarks on ``device``; returns the profile and the raw measurements.

    Packing is measured the way a load packs: several tensors per command buffer, after a
    warm-up graph, so that the packed tensors get memory the previous graph freed (on lavapipe,
    where device memory is the process's heap, packing into pages never touched before is about
    twice as slow, and only the first load of a process does that for all its weights)."""
    import gguf
    from gguf.quants import quantize

    nbytes = size_mb << 20
    copy = _copy_gbps(device, nbytes, fresh=False)
    fresh = _copy_gbps(device, nbytes, fresh=True)
    source_read = _source_read_gbps(nbytes)
    submit_s, fence_s = _round_trip(device)
    tiny = [np.ones((4, 4), np.float32) for _ in range(200)]
    enc, gpu_tiny, _ = min((_pack(device, "linear_4x4", tiny) for _ in range(repeat)), key=lambda t: t[0])
    encode_node_s = max(enc / len(tiny), 1e-6)
    dispatch_s = max(gpu_tiny / len(tiny), 1e-7)
    rng = np.random.default_rng(1)
    rows = size_mb * 64  # [rows, 4096] fp32 = size_mb MiB, packed as 4 tensors
    big = np.split(rng.standard_normal((rows, 4096), dtype=np.float32), 4)
    pack = {}

    def pack_gbps(packer: str, arrays: list[np.ndarray], quant: str = "") -> float:
        """Median of ``repeat`` packings after a warm-up one: single GPU timings on a shared
        machine vary by +-30%."""
        _pack(device, packer, arrays, quant)
        runs = [_pack(device, packer, arrays, quant) for _ in range(repeat)]
        return statistics.median(packed / max(gpu - len(arrays) * dispatch_s, 1e-9) / 1e9 for _, gpu, packed in runs)

    pack["linear_4x4"] = pack_gbps("linear_4x4", big)
    host = {name: _host_pack_gbps(name, big, repeat) for name in ("linear_4x4", "transposed")}
    for fmt, kind in (("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q4_1", gguf.GGMLQuantizationType.Q4_1),
                      ("q8_0", gguf.GGMLQuantizationType.Q8_0)):
        blocks = [quantize(a[: rows // 8], kind) for a in big]
        pack[fmt] = pack_gbps(fmt, blocks, fmt)
        host[fmt] = _host_pack_gbps(fmt, blocks, repeat)
    pack["default"] = pack["linear_4x4"]
    pack["identity"] = copy
    host["default"] = host["linear_4x4"]
    cpu_rate, gpu_rate = _contention(device, big, repeat)
    p = device.physical
    profile = Profile(p.name, p.host_visible_device_local, max(16, p.limits["minStorageBufferOffsetAlignment"]),
                      copy, fresh, encode_node_s, submit_s, fence_s, dispatch_s, pack,
                      source=f"vkgraph simulate --calibrate on {p.name} ({p.driver}), {datetime.date.today()}",
                      source_read_gbps=source_read, cpu_rate=cpu_rate, gpu_rate=gpu_rate, cpu_renderer=device.is_cpu,
                      host_pack_gbps=host)
    raw = {"copy_gbps": copy, "fresh_copy_gbps": fresh, "source_read_gbps": source_read, "submit_s": submit_s,
           "fence_latency_s": fence_s, "encode_node_s": encode_node_s, "dispatch_s": dispatch_s, "pack_gbps": pack,
           "host_pack_gbps": host, "cpu_rate": cpu_rate, "gpu_rate": gpu_rate}
    return profile, raw


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

[cpu]
copy_gbps = {p.copy_gbps:.4g}          # into already-touched memory
fresh_copy_gbps = {p.fresh_copy_gbps:.4g}    # into freshly allocated pages
source_read_gbps = {p.source_read_gbps:.4g}   # first read of weights through a file mapping
encode_node_us = {p.encode_node_s * 1e6:.4g}
submit_us = {p.submit_s * 1e6:.4g}

[cpu.host_pack_gbps]  # the CPU packing into fresh pages (prepack.host_packing = "cpu-renderer")
{host}

[gpu]
fence_latency_us = {p.fence_latency_s * 1e6:.4g}
dispatch_us = {p.dispatch_s * 1e6:.4g}

[gpu.pack_gbps]
{pack}

[contention]  # speed of CPU encoding and GPU packing, relative to each alone, while both run
cpu_rate = {p.cpu_rate:.3g}
gpu_rate = {p.gpu_rate:.3g}
"""


VALIDATE_MODELS = ("synthetic:256", "synthetic:1024", "smollm2")
VALIDATE_MODES = ("legacy", "staged", "reduce-peak")


def validate(profile_name: str, models: tuple[str, ...] = VALIDATE_MODELS, repeat: int = 1,
             config: str | None = None, progress=None, loads: int = 4) -> list[dict[str, Any]]:
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
    (``second_*``) and the settled ones (``measured_*``; median, min, max); the error is against
    the settled loads' median."""
    from .bench import SETTLING_LOADS, config_for, load_in_subprocess

    if loads <= SETTLING_LOADS:
        raise ValueError(f"--loads must be > {SETTLING_LOADS}: the first {SETTLING_LOADS} loads of a process "
                         "fault in memory the process does not hold yet and are not compared")
    profile = load_profile(profile_name)
    cells = [(model, mode) for model in models for mode in VALIDATE_MODES]
    fresh: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    second: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    settled: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    for r in range(repeat):
        for i, (model, mode) in enumerate(cells):
            results = load_in_subprocess(model, mode, config, loads, check="last")
            fresh[(model, mode)].append(results[0])
            second[(model, mode)].append(results[1])
            settled[(model, mode)] += results[SETTLING_LOADS:]
            if progress:
                progress(r * len(cells) + i + 1, repeat * len(cells))
    rows = []
    for model in models:
        nodes = model_nodes(model)
        for mode in VALIDATE_MODES:
            times = [x["load_s"] for x in settled[(model, mode)]]
            first = [x["load_s"] for x in fresh[(model, mode)]]
            m_load = statistics.median(times)
            m_staging = int(statistics.median(x["peak_staging_nbytes"] for x in settled[(model, mode)]))
            sim = simulate(nodes, config_for(mode, config), profile, mode)
            rows.append({"model": model, "mode": mode, "measured_load_s": m_load, "measured_min_s": min(times),
                         "measured_max_s": max(times), "fresh_load_s": statistics.median(first),
                         "fresh_min_s": min(first), "fresh_max_s": max(first),
                         "second_load_s": statistics.median(x["load_s"] for x in second[(model, mode)]),
                         "simulated_load_s": sim.load_s, "load_error": sim.load_s / m_load - 1,
                         "measured_peak_staging": m_staging, "simulated_peak_staging": sim.peak_staging_nbytes,
                         "staging_error": (sim.peak_staging_nbytes / m_staging - 1) if m_staging else 0.0})
    return rows
