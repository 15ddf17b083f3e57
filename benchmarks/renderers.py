"""lavapipe and SwiftShader side by side: load time of each prepack mode (fresh processes, modes
interleaved, medians), packing throughput (constant bytes / staged load time), peak RSS delta of a
staged load, SmolLM2 decode speed, and the thresholds `vkgraph tune` chose for each renderer
(configs/tuned-<renderer>.toml, written by the tune runs in README.md). Prints a markdown table,
numbers only.

    .venv/bin/python benchmarks/renderers.py [--model synthetic:256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from vkgraph.config import load_config
from vkgraph.paths import CONFIG_DIR
from vkgraph.tools.bench import load_in_subprocess

RENDERERS = ("lavapipe", "swiftshader")
MODES = ("legacy", "staged", "reduce-peak")
PROMPT = "The capital of France is"


def decode_tok_s(renderer: str, tokens: int) -> float:
    cmd = [sys.executable, "-m", "vkgraph", "run", "--model", "smollm2", "--prompt", PROMPT,
           "--max-new-tokens", str(tokens), "--json", "--device", renderer]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["tokens_per_s"]


def tuned(renderer: str) -> str:
    path = CONFIG_DIR / f"tuned-{renderer}.toml"
    if not path.is_file():
        return "not tuned"
    p = load_config(path, env={}).resolved.prepack
    mib = lambda n: f"{n / 2**20:g}"  # noqa: E731
    return (f"thr {mib(p.threshold_nbytes)}/{mib(p.initial_threshold_nbytes)} MiB, ring {mib(p.staging_ring_nbytes)} MiB, "
            f"reduce {str(p.reduce_peak_memory).lower()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="SmolLM2 tokens to generate per run")
    args = ap.parse_args()
    runs: dict[tuple[str, str], list[dict]] = {(r, m): [] for r in RENDERERS for m in MODES}
    tok_s: dict[str, list[float]] = {r: [] for r in RENDERERS}
    for r in RENDERERS:  # weights file and shader caches first
        os.environ["VKGRAPH_DEVICE"] = r
        load_in_subprocess(args.model, "staged")
    for _ in range(args.repeat):
        for r in RENDERERS:
            os.environ["VKGRAPH_DEVICE"] = r
            for m in MODES:
                runs[(r, m)].extend(load_in_subprocess(args.model, m))
            tok_s[r].append(decode_tok_s(r, args.tokens))
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("load_s", "peak_rss_delta_nbytes")}
           for k, v in runs.items()}
    total = runs[(RENDERERS[0], "staged")][0]["total_constant_nbytes"]
    devices = {r: runs[(r, "staged")][0]["device"] for r in RENDERERS}
    print(f"{args.model} ({total / 2**20:.1f} MiB of constants), medians of {args.repeat} fresh processes; "
          f"SmolLM2 decode: {args.tokens} tokens after a short prompt\n")
    print("| renderer | device | legacy load_s | staged load_s | reduce-peak load_s | staged GB/s | "
          "staged peak RSS delta | SmolLM2 decode tok/s | tuned thresholds | all outputs ok |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in RENDERERS:
        ok = all(x["output_ok"] for m in MODES for x in runs[(r, m)])
        staged = med[(r, "staged")]
        print(f"| {r} | {devices[r]} | {med[(r, 'legacy')]['load_s']:.3f} | {staged['load_s']:.3f} | "
              f"{med[(r, 'reduce-peak')]['load_s']:.3f} | {total / staged['load_s'] / 1e9:.2f} | "
              f"{staged['peak_rss_delta_nbytes'] / 2**20:.0f} MiB | {statistics.median(tok_s[r]):.1f} | {tuned(r)} | {ok} |")


if __name__ == "__main__":
    main()
