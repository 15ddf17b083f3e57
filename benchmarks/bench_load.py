"""Compare prepack modes: each load runs in a fresh process (`vkgraph bench load --json`), the
modes interleaved, and the medians are printed as a markdown table. Prints numbers only.

    .venv/bin/python benchmarks/bench_load.py --model synthetic:512 --repeat 3 [--config F]
"""

from __future__ import annotations

import argparse
import statistics

from vkgraph.tools.bench import load_in_subprocess

MODES = ("legacy", "staged", "reduce-peak")
CACHE_MODES = ("cold-cache", "warm-cache")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:512")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--config")
    ap.add_argument("--cache", action="store_true", help="also measure cold-cache and warm-cache loads")
    args = ap.parse_args()
    modes = MODES + (CACHE_MODES if args.cache else ())
    load_in_subprocess(args.model, "staged", args.config)  # generate the weights file and warm the shader caches
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for m in modes:  # cold-cache right before warm-cache: warm reads the file cold just wrote
            runs[m].extend(load_in_subprocess(args.model, m, args.config))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
           for m, rs in runs.items()}
    total = runs["staged"][0]["total_constant_nbytes"]
    print(f"{args.model}: {total / 2**20:.1f} MiB of constants, median of {args.repeat} fresh processes per mode\n")
    print("| mode | load_s | vs legacy | vs staged | cpu_encode_s | fence_wait_s | gpu_s | submits | packing dispatches | "
          "peak staging in flight | peak RSS delta | RssAnon delta | zero-copy | output_ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        d = med[m]
        ok = all(r["output_ok"] for r in runs[m])
        print(f"| {m} | {d['load_s']:.3f} | {d['load_s'] / med['legacy']['load_s']:.2f}x | "
              f"{d['load_s'] / med['staged']['load_s']:.2f}x | {d['cpu_encode_s']:.3f} | "
              f"{d['fence_wait_s']:.3f} | {d['gpu_s']:.3f} | {d['submits']:.0f} | {d['packing_dispatches']:.0f} | "
              f"{d['peak_staging_nbytes'] / 2**20:.1f} MiB | "
              f"{d['peak_rss_delta_nbytes'] / 2**20:.0f} MiB ({d['peak_rss_delta_nbytes'] / total:.2f}x) | "
              f"{d['rss_anon_delta_nbytes'] / 2**20:.1f} MiB ({d['rss_anon_delta_nbytes'] / total:.3f}x) | "
              f"{d['zero_copy_tensors']:.0f} | {ok} |")


if __name__ == "__main__":
    main()
