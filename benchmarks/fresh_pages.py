"""What first-touch page faults cost a legacy load here, and whether the simulator's encode model
holds once they are taken out. Prints numbers only.

Each round builds and prepares the model's graph, then, right before the timed legacy load, fills
two fresh host-visible buffers of the legacy staging size one after the other ("probe 1" gets
whatever pages the kernel hands out after the round's other work, "probe 2" the pages probe 1 just
gave back), then encodes and submits the load and prints its CPU encode and GPU times next to the
simulator's. On a VM whose balloon device reports free guest pages to the host, probe 1 often runs
at the host's first-touch rate (the host must back the pages again) while probe 2 runs at the
calibrated ``fresh_copy_gbps``; the legacy load after the probes then finds recycled pages too.

    .venv/bin/python benchmarks/fresh_pages.py --model smollm2 --rounds 5 [--no-probe]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vkgraph.config import load_config
from vkgraph.graph import ComputeGraph
from vkgraph.models.registry import open_model
from vkgraph.paths import DEFAULT_CONFIG
from vkgraph.runtime import Buffer, MemoryKind
from vkgraph.tools.simulate import load_profile, model_nodes, simulate


def fill_gbps(device, data: np.ndarray) -> float:
    with Buffer(device, data.nbytes, MemoryKind.UPLOAD) as b:
        t0 = time.perf_counter()
        b.write(data)
        return data.nbytes / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, synthetic:<MB>, minilm, ...")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", default="profiles/lavapipe.toml")
    ap.add_argument("--no-probe", action="store_true", help="load without the probe buffers (the baseline)")
    args = ap.parse_args()

    cfg = load_config(DEFAULT_CONFIG)
    sim = simulate(model_nodes(args.model), cfg, load_profile(args.profile), "legacy")
    print(f"simulated legacy load of {args.model}: encode {sim.cpu_encode_s:.3f} s, GPU {sim.gpu_s:.3f} s, "
          f"load {sim.load_s:.3f} s; staging {sim.staging_allocated_nbytes / 2**20:.1f} MiB")
    data = np.random.default_rng(0).integers(0, 255, sim.staging_allocated_nbytes, dtype=np.uint8)
    print("| round | probe 1 GB/s | probe 2 GB/s | encode s | GPU s | load s |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        with open_model(args.model) as model, ComputeGraph(cfg) as g:
            model.build(g)
            g.prepare()
            probes = ("-", "-") if args.no_probe else tuple(f"{fill_gbps(g.device, data):.2f}" for _ in range(2))
            g.encode_prepack()
            rep = g.prepack()
        print(f"| {r} | {probes[0]} | {probes[1]} | {rep.cpu_encode_s:.3f} | {rep.gpu_s:.3f} | {rep.load_s:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
