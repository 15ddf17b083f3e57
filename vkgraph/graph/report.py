"""The load report of ``run_prepack()`` / ``prepack()`` and its Chrome trace (ARCHITECTURE.md §3 step 7).

Times are host ``perf_counter`` seconds relative to the start of the load. GPU spans come from
timestamp queries, moved onto the host clock with an offset measured once per device.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CommandBufferSpan:
    """One prepack command buffer: its nodes, bytes, and when the CPU and GPU worked on it."""

    index: int
    nodes: int
    staging_nbytes: int
    packing_dispatches: int
    cpu_start_s: float  # encode (staging copies + recording) began
    cpu_end_s: float  # submitted
    gpu_start_s: float | None = None  # from timestamps, on the host clock
    gpu_end_s: float | None = None
    #: the CPU wrote the batch's weights that it packs itself, after the submit, until then
    #: (scheduler.PrepackPlan.writes_after_submit); cpu_end_s where it wrote none then
    writes_end_s: float | None = None

    @property
    def cpu_intervals(self) -> list[tuple[float, float]]:
        """When the CPU worked on the batch: encoding it, then writing its weights after the submit."""
        after = [(self.cpu_end_s, self.writes_end_s)] if self.writes_end_s and self.writes_end_s > self.cpu_end_s else []
        return [(self.cpu_start_s, self.cpu_end_s), *after]

    @property
    def gpu_s(self) -> float:
        if self.gpu_start_s is None or self.gpu_end_s is None:
            return 0.0
        return max(0.0, self.gpu_end_s - self.gpu_start_s)


@dataclass
class LoadReport:
    mode: str  # "legacy" | "staged" | "reduce-peak"
    nodes: int
    total_constant_nbytes: int
    total_staged_nbytes: int
    device: str = ""  # the device's name
    load_s: float = 0.0
    cpu_encode_s: float = 0.0
    #: of cpu_encode_s, making the pages of what packing shaders write at once (staged loads on
    #: CPU renderers: scheduler.PrepackPlan.populates_destinations)
    populate_s: float = 0.0
    fence_wait_s: float = 0.0
    peak_staging_nbytes: int = 0  # high-water mark of staging bytes in flight (measured)
    staging_allocated_nbytes: int = 0  # most staging memory allocated at once (ring + oversized batches)
    peak_device_nbytes: int = 0
    packing_dispatches: int = 0
    direct_writes: int = 0  # identity weights written straight into host-visible device memory
    cache_hits: int = 0  # packed tensors taken from the packed-weight cache (no staging, no dispatch)
    cache_misses: int = 0
    zero_copy_tensors: int = 0  # cache hits whose device memory is the cache file's pages
    cache_save_s: float = 0.0  # writing the cache after the load (not part of load_s)
    retried_after: str = ""  # why a staged attempt failed before this reduce-peak load ("auto" mode)
    tensor_paths: dict[str, str] = field(default_factory=dict)  # packed | copy | zero-copy (cache) | in-place
    spans: list[CommandBufferSpan] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)  # CPU blocked on fences
    #: {packer: [GPU seconds, nodes]} from a timestamp after every node that records GPU work (its
    #: upload and packing; where a device overlaps nodes, each is charged until its own end),
    #: largest first; direct writes record none
    packer_gpu_s: dict[str, list] = field(default_factory=dict)

    @property
    def submits(self) -> int:
        return len(self.spans)

    @property
    def gpu_s(self) -> float:
        return sum(s.gpu_s for s in self.spans)

    @property
    def bytes_per_submit(self) -> list[int]:
        return [s.staging_nbytes for s in self.spans]

    @property
    def overlap(self) -> float:
        """Fraction of GPU time during which the CPU was encoding (0 when there was no GPU time)."""
        gpu = self.gpu_s
        if gpu <= 0:
            return 0.0
        cpu = [c for s in self.spans for c in s.cpu_intervals]
        both = 0.0
        for s in self.spans:
            if s.gpu_start_s is None:
                continue
            for c0, c1 in cpu:
                both += max(0.0, min(s.gpu_end_s, c1) - max(s.gpu_start_s, c0))
        return min(1.0, both / gpu)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("spans", "waits", "tensor_paths")}
        d.update(
            submits=self.submits,
            gpu_s=self.gpu_s,
            gpu_s_per_cmd=[s.gpu_s for s in self.spans],
            bytes_per_submit=self.bytes_per_submit,
            overlap=self.overlap,
        )
        return d

    def format_packers(self) -> str:
        """GPU time per packer as a Markdown table, largest first."""
        total = sum(sec for sec, _ in self.packer_gpu_s.values()) or 1.0
        lines = ["| packer | GPU ms | share | nodes |", "|---|---|---|---|"]
        lines += [f"| {name} | {sec * 1e3:.1f} | {sec / total:.0%} | {n} |" for name, (sec, n) in self.packer_gpu_s.items()]
        return "\n".join(lines)

    def format_table(self, extra: tuple[tuple[str, str], ...] = ()) -> str:
        """The report as aligned ``name  value`` lines, ``extra`` rows (the caller's) last."""
        mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
        per = self.bytes_per_submit
        rows = [
            ("device", self.device),
            ("mode", self.mode),
            ("prepack nodes", str(self.nodes)),
            ("constant bytes", mib(self.total_constant_nbytes)),
            ("staged bytes", mib(self.total_staged_nbytes)),
            ("load time", f"{self.load_s:.3f} s"),
            ("CPU encode", f"{self.cpu_encode_s:.3f} s"),
            ("of which populating", f"{self.populate_s:.3f} s"),
            ("fence wait", f"{self.fence_wait_s:.3f} s"),
            ("GPU time", f"{self.gpu_s:.3f} s"),
            ("submits", str(self.submits)),
            ("bytes per submit", f"min {mib(min(per))}, max {mib(max(per))}" if per else "-"),
            ("peak staging in flight", mib(self.peak_staging_nbytes)),
            ("staging allocated", mib(self.staging_allocated_nbytes)),
            ("peak device memory", mib(self.peak_device_nbytes)),
            ("packing dispatches", str(self.packing_dispatches)),
            ("direct writes", str(self.direct_writes)),
            ("cache hits / misses", f"{self.cache_hits} / {self.cache_misses} ({self.zero_copy_tensors} zero-copy)"),
            ("CPU/GPU overlap", f"{self.overlap:.0%}"),
            *extra,
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def chrome_trace(self) -> dict[str, Any]:
        """Trace-event JSON: CPU encode spans and fence waits on one track, GPU command-buffer
        spans on another (open in Perfetto or chrome://tracing)."""
        us = lambda s: round(s * 1e6, 3)  # noqa: E731
        ev: list[dict[str, Any]] = [
            {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "CPU (encode + submit)"}},
            {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "GPU (command buffers)"}},
            {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": f"vkgraph prepack ({self.mode})"}},
        ]
        for s in self.spans:
            args = {"nodes": s.nodes, "staging_nbytes": s.staging_nbytes, "packing_dispatches": s.packing_dispatches}
            ev.append({"ph": "X", "pid": 1, "tid": 1, "cat": "cpu", "name": f"encode cmd {s.index}",
                       "ts": us(s.cpu_start_s), "dur": us(s.cpu_end_s - s.cpu_start_s), "args": args})
            for c0, c1 in s.cpu_intervals[1:]:
                ev.append({"ph": "X", "pid": 1, "tid": 1, "cat": "write", "name": f"writes of cmd {s.index}",
                           "ts": us(c0), "dur": us(c1 - c0)})
            if s.gpu_start_s is not None:
                ev.append({"ph": "X", "pid": 1, "tid": 2, "cat": "gpu", "name": f"cmd {s.index}",
                           "ts": us(s.gpu_start_s), "dur": us(s.gpu_s), "args": args})
        for w0, w1 in self.waits:
            ev.append({"ph": "X", "pid": 1, "tid": 1, "cat": "wait", "name": "fence wait", "ts": us(w0), "dur": us(w1 - w0)})
        return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": self.to_dict()}

    def write_trace(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.chrome_trace()))
