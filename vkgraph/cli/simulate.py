"""``vkgraph simulate``: predict a load from a device profile; ``--calibrate`` measures a profile,
``--validate`` compares the simulator with measured loads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..models.registry import KNOWN_MODELS


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..runtime import Device
    from ..tools.calibrate import calibrate, profile_toml

    with Device(args.device) as dev:
        profile, raw = calibrate(dev)
    text = profile_toml(profile)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"profile written to {args.out}")
    print(json.dumps(raw, indent=2) if args.json else text)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ..tools.bench import terminal_progress
    from ..tools.calibrate import VALIDATE_MODELS, validate

    models = tuple(args.models.split(",")) if args.models else VALIDATE_MODELS
    rows = validate(args.profile, models, args.repeat, args.config,
                    None if args.json else terminal_progress("validate", "processes"), args.loads)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"simulated ({args.profile}) vs measured ({args.repeat} fresh processes, interleaved; "
          f"{args.loads} loads each):\n")
    print("| model | mode | measured load_s, settled loads (3rd on): median (min..max) | simulated | error "
          "| 1st load of a process: median (min..max) | 2nd load: median | peak staging in flight measured / simulated | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mode']} | {r['measured_load_s']:.3f} ({r['measured_min_s']:.3f}.."
              f"{r['measured_max_s']:.3f}) | {r['simulated_load_s']:.3f} | {r['load_error']:+.0%} | "
              f"{r['fresh_load_s']:.3f} ({r['fresh_min_s']:.3f}..{r['fresh_max_s']:.3f}) | {r['second_load_s']:.3f} | "
              f"{r['measured_peak_staging'] / 2**20:.1f} / {r['simulated_peak_staging'] / 2**20:.1f} MiB | "
              f"{r['staging_error']:+.1%} |")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..paths import DEFAULT_CONFIG
    from ..tools.simulate import load_profile, model_nodes, simulate

    if args.calibrate:
        return cmd_calibrate(args)
    if args.validate:
        return cmd_validate(args)

    profile = load_profile(args.profile)
    cfg = load_config(args.config or DEFAULT_CONFIG)
    sim = simulate(model_nodes(args.model), cfg, profile, args.mode)
    if args.plot:
        from ..tools.plot import Span, plot_timeline

        spans = [Span(b.index, b.cpu_start_s, b.cpu_end_s, b.gpu_start_s, b.gpu_end_s, b.staging_nbytes)
                 for b in sim.batches]
        plot_timeline(spans, [], f"{args.model} on {profile.name}, {sim.mode} (simulated): {sim.load_s:.3f} s",
                      args.plot)
    if args.json:
        print(json.dumps({"model": args.model, "profile": profile.name, **sim.to_dict()}))
        return 0
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    print(f"{args.model} on {profile.name} ({sim.mode}), predicted:")
    for k, v in (("load time", f"{sim.load_s:.3f} s"), ("CPU encode", f"{sim.cpu_encode_s:.3f} s"),
                 ("fence wait", f"{sim.fence_wait_s:.3f} s"), ("GPU time", f"{sim.gpu_s:.3f} s"),
                 ("submits", sim.submits), ("constant bytes", mib(sim.total_constant_nbytes)),
                 ("peak staging in flight", mib(sim.peak_staging_nbytes)),
                 ("staging allocated", mib(sim.staging_allocated_nbytes)), ("peak device memory", mib(sim.peak_device_nbytes)),
                 ("packing dispatches", sim.packing_dispatches)):
        print(f"  {k:<20} {v}")
    print("  batch  nodes  staged      cpu start..end     gpu start..end")
    for b in sim.batches[:12]:
        print(f"  {b.index:>5}  {b.nodes:>5}  {mib(b.staging_nbytes):>9}  {b.cpu_start_s:7.3f}..{b.cpu_end_s:7.3f}  "
              f"{b.gpu_start_s:7.3f}..{b.gpu_end_s:7.3f}")
    if len(sim.batches) > 12:
        print(f"  ... {len(sim.batches) - 12} more")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="predict a load (time, memory, submits) from a device profile")
    sim.add_argument("--profile", default="lavapipe", help="profile TOML or a name in profiles/ (default lavapipe)")
    sim.add_argument("--model", default="synthetic:256",
                     help=f"{KNOWN_MODELS} (default synthetic:256)")
    sim.add_argument("--config", help="TOML config (default configs/default.toml)")
    sim.add_argument("--mode", choices=["legacy", "staged", "reduce-peak"], help="default: from the config")
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--plot", help="write a PNG of the predicted timeline and staging memory")
    sim.add_argument("--calibrate", action="store_true", help="measure a profile on this device (see --out)")
    sim.add_argument("--out", help="with --calibrate: write the profile here (e.g. profiles/<device>.toml)")
    sim.add_argument("--validate", action="store_true",
                     help="compare the simulator with measured loads (legacy, staged, reduce-peak)")
    sim.add_argument("--models", help="with --validate: comma-separated (default synthetic:256,synthetic:1024,smollm2)")
    sim.add_argument("--repeat", type=int, default=1, help="with --validate: fresh processes per point")
    sim.add_argument("--loads", type=int, default=4,
                     help="with --validate: loads per process (> 2); the error is against the loads after the "
                          "second (the first two fault in memory the process does not hold yet)")
    sim.set_defaults(fn=cmd_simulate)
