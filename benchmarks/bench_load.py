"""Compare prepack modes: each load runs in a fresh process (`vkgraph bench load --json`), the
modes interleaved, and the medians are printed as a markdown table. Prints numbers only.

    .venv/bin/python benchmarks/bench_load.py --model synthetic:512 --repeat 3 [--config F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MODES = ("legacy", "staged", "reduce-peak")


def one(model: str, mode: str, config: str | None) -> dict:
    cmd = [sys.executable, "-m", "vkgraph", "bench", "load", "--model", model, "--mode", mode, "--json"]
    if config:
        cmd += ["--config", config]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:512")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--config")
    args = ap.parse_args()
    one(args.model, "staged", args.config)  # generate the weights file and warm the shader caches
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for m in MODES:
            runs[m].append(one(args.model, m, args.config))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
           for m, rs in runs.items()}
    total = runs["staged"][0]["total_constant_nbytes"]
    print(f"{args.model}: {total / 2**20:.1f} MiB of constants, median of {args.repeat} fresh processes per mode\n")
    print("| mode | load_s | vs legacy | cpu_encode_s | fence_wait_s | gpu_s | submits | peak staging | peak RSS delta | overlap | output_ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in MODES:
        d = med[m]
        ok = all(r["output_ok"] for r in runs[m])
        print(f"| {m} | {d['load_s']:.3f} | {d['load_s'] / med['legacy']['load_s']:.2f}x | {d['cpu_encode_s']:.3f} | "
              f"{d['fence_wait_s']:.3f} | {d['gpu_s']:.3f} | {d['submits']:.0f} | {d['peak_staging_nbytes'] / 2**20:.1f} MiB | "
              f"{d['peak_rss_delta_nbytes'] / 2**20:.0f} MiB ({d['peak_rss_delta_nbytes'] / total:.2f}x) | {d['overlap']:.0%} | {ok} |")


if __name__ == "__main__":
    main()
