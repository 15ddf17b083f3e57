"""``vkgraph tune``: sweep prepack thresholds, staging ring and reduce-peak mode, each point
loaded in fresh processes (median of K), and write the fastest config that fits a memory budget."""

from __future__ import annotations

import datetime
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

MiB = 1 << 20

#: The default sweep: byte thresholds (steady, initial), node thresholds (steady, initial),
#: staging ring and reduce-peak mode.
GRID = {
    "threshold_nbytes": [4 * MiB, 10 * MiB, 32 * MiB],
    "initial_threshold_nbytes": [2 * MiB, 10 * MiB],
    "threshold_nodes": [256],
    "initial_threshold_nodes": [64],
    "staging_ring_nbytes": [0, 96 * MiB],  # 0 = default (30 MiB)
    "reduce_peak_memory": [False, True],
}
#: configs/default.toml's prepack values, measured in every sweep for comparison.
DEFAULT = {"threshold_nbytes": 10 * MiB, "initial_threshold_nbytes": 10 * MiB, "threshold_nodes": 256,
           "initial_threshold_nodes": 64, "staging_ring_nbytes": 0, "reduce_peak_memory": False}


@dataclass
class Point:
    prepack: dict[str, Any]
    load_s: float = 0.0
    peak_nbytes: int = 0  # peak RSS delta of the load: what a device's memory must hold
    runs: int = 0

    def label(self) -> str:
        p = self.prepack
        return (f"thr {p['threshold_nbytes'] // MiB}/{p['initial_threshold_nbytes'] // MiB} MiB, "
                f"nodes {p['threshold_nodes']}/{p['initial_threshold_nodes']}, "
                f"ring {(p['staging_ring_nbytes'] // MiB) or 'default'}, reduce {p['reduce_peak_memory']}")


def grid_points(grid: dict[str, list] = GRID) -> list[Point]:
    keys = list(grid)
    return [Point(dict(zip(keys, values))) for values in itertools.product(*(grid[k] for k in keys))]


def config_text(prepack: dict[str, Any], comments: Iterable[str] = ()) -> str:
    lines = [f"# {c}" for c in comments] + ["", "[prepack]"]
    for k, v in prepack.items():
        lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else v}")
    return "\n".join(lines) + "\n"


def measure(model: str, point: Point, repeat: int) -> Point:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_text(point.prepack))
        path = f.name
    try:
        results = []
        for _ in range(repeat):
            mode = "reduce-peak" if point.prepack["reduce_peak_memory"] else "staged"
            cmd = [sys.executable, "-m", "vkgraph", "bench", "load", "--model", model, "--mode", mode,
                   "--config", path, "--json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        Path(path).unlink(missing_ok=True)
    point.load_s = statistics.median(r["load_s"] for r in results)
    point.peak_nbytes = int(statistics.median(r["peak_rss_delta_nbytes"] for r in results))
    point.runs = repeat
    return point


def pareto(points: list[Point]) -> list[Point]:
    """Points no other point beats on both load time and peak memory, fastest first."""
    front = [p for p in points
             if not any(q.load_s <= p.load_s and q.peak_nbytes <= p.peak_nbytes
                        and (q.load_s < p.load_s or q.peak_nbytes < p.peak_nbytes) for q in points)]
    return sorted(front, key=lambda p: p.load_s)


def best_within(points: list[Point], max_peak_nbytes: int | None) -> Point | None:
    fits = [p for p in points if max_peak_nbytes is None or p.peak_nbytes <= max_peak_nbytes]
    return min(fits, key=lambda p: p.load_s) if fits else None


def tune(model: str, repeat: int, points: list[Point], progress: Callable[[int, int], None] | None = None) -> list[Point]:
    out = []
    for i, p in enumerate(points):
        out.append(measure(model, p, repeat))
        if progress:
            progress(i + 1, len(points))
    return out


def tuned_config(best: Point, model: str, device: str, default: Point | None) -> str:
    comments = [
        f"Tuned by `vkgraph tune --model {model}` on {datetime.date.today()}, device {device}.",
        f"Measured: load {best.load_s:.3f} s, peak RSS delta {best.peak_nbytes / MiB:.0f} MiB (median of {best.runs}).",
    ]
    if default is not None:
        comments.append(f"configs/default.toml measured in the same run: load {default.load_s:.3f} s, "
                         f"peak {default.peak_nbytes / MiB:.0f} MiB.")
    return config_text(best.prepack, comments)
