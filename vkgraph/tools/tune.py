"""``vkgraph tune``: sweep prepack thresholds, staging ring and reduce-peak mode, each point
loaded in fresh processes (median of K), and write the fastest config that fits a memory budget.

Each fresh process loads three times and the third load is the point's time: the first two
loads of a process fault in memory the process does not hold yet (see
:data:`~vkgraph.bench.SETTLING_LOADS`), which on a VM varies several-fold between identical
runs and has nothing to do with the thresholds; the first loads are kept and shown next to it.

Load times on a shared machine are noisy (see README), so a sweep's winner is not trusted on its
own: the finalists, the configs that put the default off the sweep's Pareto front, and the
default are measured again, interleaved round by round so that drift hits all of them alike. A
config replaces the default only when it is faster beyond the spread of both (its slowest
confirmation run beats the default's fastest). The front is then drawn from every run of each
config, with a rank test deciding which differences in load time are beyond the noise."""

from __future__ import annotations

import datetime
import itertools
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..config import GraphConfig, load_config
from ..paths import DEFAULT_CONFIG
from .bench import SETTLING_LOADS, load_in_subprocess

MiB = 1 << 20

#: The default sweep: byte thresholds (steady, initial), node thresholds (steady, initial),
#: staging ring and reduce-peak mode.
GRID = {
    "threshold_nbytes": [4 * MiB, 10 * MiB, 32 * MiB],
    "initial_threshold_nbytes": [2 * MiB, 10 * MiB],
    "threshold_nodes": [256],
    "initial_threshold_nodes": [64],
    "staging_ring_nbytes": [0, 96 * MiB],  # 0 = the default
    "reduce_peak_memory": [False, True],
}


def in_force(prepack: dict[str, Any]) -> dict[str, Any]:
    """``prepack`` settings with every 0 ("the default") replaced by the value in force."""
    p = GraphConfig().replace(**{f"prepack.{k}": v for k, v in prepack.items()}).resolved.prepack
    return {k: getattr(p, k) for k in prepack}


#: configs/default.toml's prepack values for the swept keys, measured in every sweep for comparison.
DEFAULT = in_force({k: getattr(load_config(DEFAULT_CONFIG, env={}).prepack, k) for k in GRID})


@dataclass
class Point:
    prepack: dict[str, Any]
    load_s: float = 0.0  # median
    #: peak device memory of the load (packed weights + staging, as allocated): what the device
    #: must hold, and exact, where the process's RSS also moves with how the allocator reuses
    #: memory the previous load freed
    peak_nbytes: int = 0
    times: list[float] = field(default_factory=list)  # every measured load time (third load of a process)
    peaks: list[int] = field(default_factory=list)
    rss_peaks: list[int] = field(default_factory=list)  # peak RSS delta of each measured load
    first_times: list[float] = field(default_factory=list)  # the first load of each process
    device: str = ""  # the device the loads ran on (their reports name it)

    @property
    def runs(self) -> int:
        return len(self.times)

    @property
    def spread_s(self) -> tuple[float, float]:
        return (min(self.times), max(self.times)) if self.times else (self.load_s, self.load_s)

    @property
    def peak_spread(self) -> tuple[int, int]:
        return (min(self.peaks), max(self.peaks)) if self.peaks else (self.peak_nbytes, self.peak_nbytes)

    @property
    def rss_peak_nbytes(self) -> int | None:
        return int(statistics.median(self.rss_peaks)) if self.rss_peaks else None

    @property
    def first_load_s(self) -> float | None:
        return statistics.median(self.first_times) if self.first_times else None

    def add_runs(self, times: list[float], peaks: list[int], rss_peaks: list[int], first_times: list[float]) -> None:
        self.times += times
        self.peaks += peaks
        self.rss_peaks += rss_peaks
        self.first_times += first_times
        self.load_s = statistics.median(self.times)
        self.peak_nbytes = int(statistics.median(self.peaks))

    def label(self) -> str:
        p = self.prepack
        return (f"thr {p['threshold_nbytes'] // MiB}/{p['initial_threshold_nbytes'] // MiB} MiB, "
                f"nodes {p['threshold_nodes']}/{p['initial_threshold_nodes']}, "
                f"ring {p['staging_ring_nbytes'] // MiB} MiB, reduce {p['reduce_peak_memory']}")


def grid_points(grid: dict[str, list] = GRID) -> list[Point]:
    keys = list(grid)
    return [Point(in_force(dict(zip(keys, values)))) for values in itertools.product(*(grid[k] for k in keys))]


def config_text(prepack: dict[str, Any], comments: Iterable[str] = ()) -> str:
    lines = [f"# {c}" for c in comments] + ["", "[prepack]"]
    for k, v in prepack.items():
        lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else v}")
    return "\n".join(lines) + "\n"


def load_once(model: str, prepack: dict[str, Any]) -> list[dict[str, Any]]:
    """Three loads of ``model`` with these prepack settings in a fresh process (``bench load --json``):
    the first two settle the process's memory, the third is measured."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_text(prepack))
        path = f.name
    try:
        return load_in_subprocess(model, "reduce-peak" if prepack["reduce_peak_memory"] else "staged", path,
                                  loads=SETTLING_LOADS + 1)
    finally:
        Path(path).unlink(missing_ok=True)


def record(point: Point, results: list[dict[str, Any]]) -> None:
    """The loads of one fresh process: the first is kept apart, the last is the point's run."""
    first, result = results[0], results[-1]
    point.device = result["device"]
    point.add_runs([result["load_s"]], [result["peak_device_nbytes"]], [result["peak_rss_delta_nbytes"]],
                   [first["load_s"]])


def measure(model: str, point: Point, repeat: int) -> Point:
    for _ in range(repeat):
        record(point, load_once(model, point.prepack))
    return point


def rank_p_value(a: list[float], b: list[float]) -> float:
    """One-sided exact Mann-Whitney test: the chance, were ``a`` and ``b`` samples of one
    distribution, that ``a``'s values would beat (be smaller than) ``b``'s in at least as many of
    the pairs as they do (a tie counts half)."""
    n, m = len(a), len(b)
    u = sum((x < y) + 0.5 * (x == y) for x in a for y in b)
    # ways[i][j][k]: orderings of i values of a and j of b in which a's beat b's in k pairs
    ways = [[[0] * (n * m + 1) for _ in range(m + 1)] for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 or j == 0:
                ways[i][j][0] = 1
                continue
            for k in range(i * j + 1):
                # the largest value is b's (every a beats it: j-1 more b's left, i pairs won) or a's
                ways[i][j][k] = (ways[i][j - 1][k - i] if k >= i else 0) + ways[i - 1][j][k]
    total = sum(ways[n][m])
    return sum(ways[n][m][k] for k in range(n * m + 1) if k >= u - 1e-9) / total


#: significance level of "beyond the noise" for load times
ALPHA = 0.05


def faster_beyond_noise(a: list[float], b: list[float]) -> bool:
    """Runs ``a`` are faster than runs ``b`` beyond the noise: the rank test says so at
    :data:`ALPHA`. Runs too few for the test ever to say so (its smallest p-value, 1 / C(n+m, n),
    above ALPHA: 2 and 4 runs, for instance) fall back to every run of ``a`` beating every run of
    ``b``; with one run each that is the plain comparison."""
    if not a or not b:
        return False
    if 1 / math.comb(len(a) + len(b), len(a)) > ALPHA:
        return max(a) < min(b)
    return rank_p_value(a, b) <= ALPHA


def dominates(q: Point, p: Point) -> bool:
    """``q`` is better than ``p`` beyond the noise: on one axis it is better beyond the noise
    (load times: :func:`faster_beyond_noise`; peak memory: all of its runs below all of ``p``'s)
    and on the other axis ``p`` is not. With one run per point this is the usual Pareto dominance.
    More runs make the rank test stronger, where the min..max spreads of two configs only
    ever widen and overlap more."""
    qt, pt = q.times or [q.load_s], p.times or [p.load_s]
    (qm0, qm1), (pm0, pm1) = q.peak_spread, p.peak_spread
    faster, slower = faster_beyond_noise(qt, pt), faster_beyond_noise(pt, qt)
    smaller, larger = qm1 < pm0, qm0 > pm1
    return (faster and not larger) or (smaller and not slower)


def dominators(points: list[Point], p: Point) -> list[Point]:
    """The points that :func:`dominate <dominates>` ``p``."""
    return [q for q in points if q is not p and dominates(q, p)]


def pareto(points: list[Point]) -> list[Point]:
    """Points no other point :func:`dominates` (beats beyond the noise), fastest first."""
    front = [p for p in points if not dominators(points, p)]
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


@dataclass
class Confirmation:
    """Finalists and the default re-measured in interleaved rounds."""

    points: list[Point]  # finalists (fresh Point objects: only confirmation runs), default last
    default: Point
    winner: Point  # the default when nothing beats it beyond the noise

    @property
    def significant(self) -> bool:
        return self.winner is not self.default


def beats(p: Point, default: Point) -> bool:
    """``p`` is faster than ``default`` beyond the noise: every one of its runs beats every run of
    the default (with 5 rounds each, a chance of 1 in 252 when both are equally fast)."""
    return bool(p.times and default.times) and p.spread_s[1] < default.spread_s[0]


def confirm(model: str, finalists: list[Point], default_prepack: dict[str, Any], rounds: int,
            progress: Callable[[int, int], None] | None = None) -> Confirmation:
    """Measure ``finalists`` and the default again, ``rounds`` times each, one of each per round
    in turn; the winner is the fastest finalist that :func:`beats` the default, else the default."""
    points: list[Point] = []
    for f in finalists:
        if f.prepack != default_prepack and all(f.prepack != p.prepack for p in points):
            points.append(Point(dict(f.prepack)))
    points.append(Point(dict(default_prepack)))
    default = points[-1]
    total, done = rounds * len(points), 0
    for _ in range(rounds):
        for p in points:
            record(p, load_once(model, p.prepack))
            done += 1
            if progress:
                progress(done, total)
    better = [p for p in points[:-1] if beats(p, default)]
    winner = min(better, key=lambda p: p.load_s) if better else default
    return Confirmation(points, default, winner)


def pooled(measured: list[Point], conf: Confirmation) -> list[Point]:
    """The sweep's points with the confirmation runs of the re-measured ones added: every run of
    each config, for the table and the front."""
    out = []
    for p in measured:
        q = Point(dict(p.prepack), p.load_s, p.peak_nbytes)
        for runs in [p] + [c for c in conf.points if c.prepack == p.prepack]:
            if runs.times:
                q.add_runs(runs.times, runs.peaks, runs.rss_peaks, runs.first_times)
        out.append(q)
    return out


def tuned_config(best: Point, model: str, device: str, default: Point | None, note: str = "") -> str:
    lo, hi = best.spread_s
    comments = [
        f"Tuned by `vkgraph tune --model {model}` on {datetime.date.today()}, device {device}.",
        (f"Measured: load {best.load_s:.3f} s (min {lo:.3f}, max {hi:.3f}, {best.runs} fresh processes), "
         f"peak device memory {best.peak_nbytes / MiB:.0f} MiB (peak RSS delta {(best.rss_peak_nbytes or 0) / MiB:.0f} MiB)."),
    ]
    if default is not None and default is not best:
        dlo, dhi = default.spread_s
        comments.append(f"configs/default.toml measured in the same rounds: load {default.load_s:.3f} s "
                        f"(min {dlo:.3f}, max {dhi:.3f}), peak {default.peak_nbytes / MiB:.0f} MiB.")
    if note:
        comments.append(note)
    return config_text(best.prepack, comments)


def plot_tune(points: list[Point], front: list[Point], default: Point, best: Point | None, title: str,
              path: str | Path) -> None:
    """Load time (median, min..max bars) against peak memory, the Pareto front joined."""
    from .plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for p in points:
        lo, hi = p.spread_s
        ax.errorbar(p.peak_nbytes / MiB, p.load_s, yerr=[[p.load_s - lo], [hi - p.load_s]], fmt="o",
                    color="tab:orange" if p in front else "tab:gray", ms=5, capsize=2, alpha=0.8)
    fr = sorted(front, key=lambda p: p.peak_nbytes)
    ax.plot([p.peak_nbytes / MiB for p in fr], [p.load_s for p in fr], "-", color="tab:orange", label="Pareto front")
    ax.plot(default.peak_nbytes / MiB, default.load_s, "s", color="tab:blue", ms=9, mfc="none", label="default")
    if best is not None:
        ax.plot(best.peak_nbytes / MiB, best.load_s, "*", color="tab:red", ms=13, label="chosen")
    ax.set_xlabel("peak device memory: packed weights + staging (MiB)")
    ax.set_ylabel("load time (s), median; bars min..max")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
