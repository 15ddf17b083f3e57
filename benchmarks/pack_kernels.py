"""The packing shaders against a copy of the same bytes (issue 20, item 4: what bounds packing).

One process: MLP weights of MiniLM's shapes (8 pairs of fp32 [1536, 384] and [384, 1536], 37.7
MB) staged and packed by each shader packer, and the same bytes moved by vkCmdCopyBuffer from
staging (an identity weight made to go through staging), as one batch of a staged load each: the packing
runs alone, after the CPU staged everything, into device memory the load populated (on CPU
renderers; graph/scheduler.PrepackPlan.populates_destinations). Rounds alternate the order;
prints each one's GPU time (timestamps), the least and the median over the rounds, and its
speed against the copy's.

    python benchmarks/pack_kernels.py [--device swiftshader] [--rounds 8] [--pairs 8]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import numpy as np

from vkgraph.config import load_config
from vkgraph.graph import ComputeGraph
from vkgraph.graph.packers import IdentityPacker, get_packer
from vkgraph.runtime import Device

PACKERS = ["linear_4x4", "transposed", "texture3d_width_packed"]


class StagedCopy(IdentityPacker):
    """The identity packer through staging and vkCmdCopyBuffer even where the CPU could write
    device memory itself (no host form: graph.packers.packs_on_host)."""

    name = "copy"
    host_form = False


def gpu_seconds(device: Device, config, packer, weights: list[np.ndarray]) -> float:
    """GPU seconds of one staged load of ``weights`` packed by ``packer``, all in one batch."""
    with ComputeGraph(config, device=device) as g:
        for i, w in enumerate(weights):
            g.prepack_tensor(g.add_tensorref(w, f"w{i}"), packer)
        report = g.run_prepack()
        assert report.submits == 1, report.submits
        return report.gpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="renderer (lavapipe, swiftshader) or device-name substring")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=8, help="pairs of [1536, 384] and [384, 1536] weights")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s, dtype=np.float32) for _ in range(args.pairs) for s in ((1536, 384), (384, 1536))]
    nbytes = sum(w.nbytes for w in weights)
    config = load_config()
    one_batch = 2 * nbytes
    config = replace(config, prepack=replace(config.prepack, threshold_nbytes=one_batch, initial_threshold_nbytes=one_batch,
                                             staging_ring_nbytes=one_batch, threshold_nodes=4096,
                                             initial_threshold_nodes=4096))
    runs = {"vkCmdCopyBuffer": StagedCopy(), **{name: get_packer(name) for name in PACKERS}}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with Device(prefer=args.device) as device:
        if not device.physical.timestamps_supported:
            print(f"{device.physical.name}: no timestamp queries")
            return 1
        for name, packer in runs.items():  # compile, and fault in what the driver keeps
            gpu_seconds(device, config, packer, weights[:2])
        for r in range(args.rounds):
            for name, packer in (list(runs.items()) if r % 2 == 0 else list(runs.items())[::-1]):
                times[name].append(gpu_seconds(device, config, packer, weights))
        print(f"{device.physical.name}: {nbytes / 1e6:.1f} MB of fp32 weights ({args.pairs} pairs of [1536, 384] and "
              f"[384, 1536]) in one staged batch, GPU time, {args.rounds} rounds\n")
    copy = min(times["vkCmdCopyBuffer"])
    print("| packer | GPU ms: least / median | GB/s (least) | against the copy |")
    print("|---|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {min(t) * 1e3:.1f} / {statistics.median(t) * 1e3:.1f} | {nbytes / min(t) / 1e9:.2f} | "
              f"{copy / min(t):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
