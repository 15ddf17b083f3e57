"""Pictures of a load (``--plot FILE.png``): CPU encode and GPU spans per command buffer, fence
waits, and staging memory in use over time. Needs matplotlib (``pip install vkgraph[plot]``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import VkGraphError


@dataclass
class Span:
    index: int
    cpu_start_s: float
    cpu_end_s: float
    gpu_start_s: float | None
    gpu_end_s: float | None
    staging_nbytes: int
    writes_end_s: float | None = None  # the CPU's writes after the submit ended (report.CommandBufferSpan)


def staging_in_use(spans: Sequence[Span]) -> list[tuple[float, int]]:
    """(time, bytes) steps: a batch's staging is in use from its encode start until its GPU work
    ends. Measured GPU times are timestamps moved onto the host clock (offset error about half a
    submit round trip), so at batch boundaries the curve may briefly exceed the ring."""
    events = []
    for s in spans:
        end = s.gpu_end_s if s.gpu_end_s is not None else s.cpu_end_s
        events += [(s.cpu_start_s, s.staging_nbytes), (end, -s.staging_nbytes)]
    out, level = [(0.0, 0)], 0
    for t, d in sorted(events, key=lambda e: (e[0], e[1])):
        level += d
        out.append((t, level))
    return out


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or a clear error when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VkGraphError("--plot needs matplotlib: pip install 'vkgraph[plot]'") from None
    return plt


def plot_timeline(spans: Sequence[Span], waits: Sequence[tuple[float, float]], title: str, path: str | Path) -> None:
    plt = pyplot()
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for s in spans:
        ax.broken_barh([(s.cpu_start_s, s.cpu_end_s - s.cpu_start_s)], (1.6, 0.8), color="tab:blue", alpha=0.8)
        if s.writes_end_s is not None and s.writes_end_s > s.cpu_end_s:  # weights written after the submit
            ax.broken_barh([(s.cpu_end_s, s.writes_end_s - s.cpu_end_s)], (1.6, 0.8), color="tab:blue", alpha=0.4)
        if s.gpu_start_s is not None and s.gpu_end_s is not None:
            ax.broken_barh([(s.gpu_start_s, s.gpu_end_s - s.gpu_start_s)], (0.1, 0.8), color="tab:orange", alpha=0.8)
    ax.broken_barh([(a, b - a) for a, b in waits], (2.5, 0.4), color="tab:red", alpha=0.6)
    ax.set_yticks([0.5, 2.0, 2.7], ["GPU (cmd buffers)", "CPU (encode)", "fence wait"])
    ax.set_title(title)
    steps = staging_in_use(spans)
    mem.step([t for t, _ in steps], [b / 2**20 for _, b in steps], where="post", color="tab:green")
    mem.set_ylabel("staging MiB")
    mem.set_xlabel("seconds since the load started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
