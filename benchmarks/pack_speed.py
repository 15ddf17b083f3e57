"""Cold staged loads against the copy floor (issue 20, item 4): each load in a fresh process,
interleaved with `vkgraph bench load --mode copy-floor` (the same constants' bytes read from the
model's files into freshly allocated memory by numpy, nothing packed) in fresh processes of the
same run. Prints medians and the floor / load ratio (1.0: a load at the speed of that copy).
Runs: the default config; the default with `prepack.host_packing = "never"` (packing shaders on
every device: the default on all but SwiftShader, where the CPU packs: graph/packers.py's
HOST_PACKING_RENDERERS); configs/fast-load.toml.

    .venv/bin/python benchmarks/pack_speed.py [--model synthetic:512] [--repeat 5] [--device swiftshader]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vkgraph.paths import CONFIG_DIR  # noqa: E402
from vkgraph.tools.bench import FLOOR, load_in_subprocess  # noqa: E402

SHADERS = "staged, default.toml + host_packing = \"never\""
RUNS = [("copy floor (numpy)", FLOOR, None), ("staged, default.toml", "staged", None), (SHADERS, "staged", SHADERS),
        ("staged, fast-load.toml", "staged", str(CONFIG_DIR / "fast-load.toml"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:512")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", help="renderer or device name (sets VKGRAPH_DEVICE)")
    args = ap.parse_args()
    if args.device:
        os.environ["VKGRAPH_DEVICE"] = args.device
    with tempfile.TemporaryDirectory() as tmp:
        shaders = Path(tmp) / "shaders.toml"
        shaders.write_text('[prepack]\nhost_packing = "never"\n')
        configs = {SHADERS: str(shaders)}
        for config in (None, str(shaders)):  # the weights file exists and the shader caches are warm
            load_in_subprocess(args.model, "staged", config)
        times: dict[str, list[float]] = {name: [] for name, _, _ in RUNS}
        info: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, mode, config in RUNS:
                (r,) = load_in_subprocess(args.model, mode, configs.get(config, config))
                times[name].append(r["load_s"])
                info[name] = r
    total = info[RUNS[0][0]]["total_constant_nbytes"]
    floor = statistics.median(times[RUNS[0][0]])
    device = next((r["device"] for r in info.values() if "device" in r), "")
    print(f"{args.model}: {total / 2**20:.1f} MiB of constants on {device}; medians of {args.repeat} fresh processes\n")
    print("| run | load_s (min..max) | GB/s | floor / load | packing dispatches | output_ok |")
    print("|---|---|---|---|---|---|")
    for name, mode, _ in RUNS:
        t = times[name]
        med = statistics.median(t)
        r = info[name]
        print(f"| {name} | {med:.3f} ({min(t):.3f}..{max(t):.3f}) | {total / med / 1e9:.2f} | {floor / med:.2f}x | "
              f"{r.get('packing_dispatches', '-')} | {r.get('output_ok', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
