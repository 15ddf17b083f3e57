"""Page faults a load takes, next to its CPU encode and GPU times and the simulator's prediction.
Prints numbers only.

On lavapipe device memory is the process's heap, so every page of staging or packed weights
that the process did not already hold is faulted in during the load: by the CPU while it copies
into staging, by the "GPU" while it writes packed weights. Which pages the process still holds
from its previous load depends on what glibc's malloc gave back to the kernel; its environment
variables change that without touching vkgraph, e.g. keep every freed byte:

    .venv/bin/python benchmarks/page_faults.py --model synthetic:256 --mode legacy --loads 5
    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=17179869184 \\
        .venv/bin/python benchmarks/page_faults.py --model synthetic:256 --mode legacy --loads 5

Faults are minor page faults of the whole process (getrusage), in MiB of 4 KiB pages; for
staged and reduce-peak loads the CPU and the GPU overlap, so only the load's total is shown.
"""

from __future__ import annotations

import argparse
import gc
import resource

from vkgraph.graph import ComputeGraph
from vkgraph.models.registry import open_model
from vkgraph.tools.bench import config_for
from vkgraph.tools.simulate import load_profile, model_nodes, simulate


def faulted_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * resource.getpagesize() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:256", help="synthetic:<MB>, smollm2, minilm, ...")
    ap.add_argument("--mode", default="legacy", choices=["legacy", "staged", "reduce-peak"])
    ap.add_argument("--loads", type=int, default=5, help="loads in this process, one after the other")
    ap.add_argument("--profile", default="profiles/lavapipe.toml")
    args = ap.parse_args()

    cfg = config_for(args.mode, None)
    sim = simulate(model_nodes(args.model), cfg, load_profile(args.profile), args.mode)
    print(f"simulated {args.mode} load of {args.model}: encode {sim.cpu_encode_s:.3f} s, GPU {sim.gpu_s:.3f} s, "
          f"load {sim.load_s:.3f} s")
    print("| load | encode s | GPU s | load s | faulted while encoding MiB | faulted while the GPU packs MiB |")
    print("|---|---|---|---|---|---|")
    with open_model(args.model) as model:
        for i in range(args.loads):
            with ComputeGraph(cfg) as g:
                model.build(g)
                g.prepare()
                gc.collect()
                f0 = faulted_mib()
                if args.mode == "legacy":
                    g.encode_prepack()
                    f1 = faulted_mib()
                    rep = g.prepack()
                    during = f"{f1 - f0:.0f} | {faulted_mib() - f1:.0f}"
                else:
                    rep = g.run_prepack()
                    during = f"{faulted_mib() - f0:.0f} (whole load) | -"
            print(f"| {i} | {rep.cpu_encode_s:.3f} | {rep.gpu_s:.3f} | {rep.load_s:.3f} | {during} |", flush=True)


if __name__ == "__main__":
    main()
