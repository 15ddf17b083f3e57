"""``vkgraph simulate``: predict a load from a device profile; ``--calibrate`` measures a profile,
``--validate`` compares the simulator with measured loads."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..models.registry import KNOWN_MODELS


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..runtime import Device
    from ..tools.calibrate import calibrate_rounds, profile_toml

    with Device(args.device) as dev:
        profile, raw = calibrate_rounds(dev, args.rounds)
    text = profile_toml(profile)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"profile written to {args.out}")
    print(json.dumps(raw, indent=2) if args.json else text)
    return 0


def _validate_profile(args: argparse.Namespace) -> str:
    """--validate's profile: --profile, else the one calibrated on the device it measures
    (tools.simulate.shipped_profile: the shipped profile of the device's exact name, such as
    profiles/lavapipe-256.toml for lavapipe at 256 bits, and of several such the one measured on
    this host's processor, else profiles/<renderer>.toml; a device none is shipped for, a
    discrete GPU say, needs --profile). A profile of another renderer is
    refused: its rates are not that device's, and every error it printed would be the difference
    between two devices. One of the same renderer under another name (lavapipe at another SIMD
    width or LLVM) is used with a warning on stderr: a CPU renderer's rates are its host's
    (profiles/lavapipe.toml, measured at 512 bits on an AVX-512 host, put SmolLM2's prompt at 3.8x
    the speed lavapipe measured at 256 bits on an AVX2 host); so is one measured with another
    processor than this host's, where the profile names it."""
    from ..errors import ConfigError
    from ..runtime import Device
    from ..tools.simulate import load_profile, shipped_profile

    with Device(args.device) as dev:
        renderer, name, host = dev.renderer, dev.name, dev.host_cpu
    shipped = shipped_profile(renderer, name, host)
    if args.profile is None and shipped is None:
        raise ConfigError(None, "--profile", f"no profile is shipped for {name!r} (renderer {renderer!r}): measure "
                                             "one with vkgraph simulate --calibrate --out <file>, then pass --profile <file>")
    chosen = args.profile or shipped.stem
    profile = load_profile(chosen)
    if profile.renderer != renderer or (not renderer and profile.name != name):
        raise ConfigError(chosen, "[device]", f"the profile is of {profile.name!r}, the device measured is {name!r} "
                                              "(--device or $VKGRAPH_DEVICE picks the device)")
    if profile.name != name:
        print(f"warning: {chosen}: the profile was measured on {profile.name!r}, this device is {name!r}: its rates "
              "may not be this device's (measure its own: vkgraph simulate --calibrate --out FILE, then --profile FILE)",
              file=sys.stderr)
    elif profile.host_cpu and host and profile.host_cpu != host:
        print(f"warning: {chosen}: the profile was measured with a {profile.host_cpu} processor, this host's is "
              f"{host}: a CPU renderer's rates are its host's (measure its own: vkgraph simulate --calibrate --out "
              "FILE, then --profile FILE)", file=sys.stderr)
    return chosen


def cmd_validate_decode(args: argparse.Namespace) -> int:
    from ..tools.bench import terminal_progress
    from ..tools.calibrate import validate_decode

    model = args.model or "smollm2"
    args.profile = _validate_profile(args)
    progress = None if args.json else terminal_progress("validate", "steps" if args.rates_now else "processes")
    row = validate_decode(args.profile, model, args.repeat, args.prompt_tokens, args.new_tokens, progress, args.rates_now)
    if args.json:
        print(json.dumps(row))
        return 0
    print(f"{model} on {row['device']}: simulated ({args.profile}) vs measured (vkgraph bench decode, "
          f"{args.prompt_tokens}-token prompt, {args.new_tokens} new tokens; {args.repeat} fresh processes):\n")
    now = " | simulated, rates measured before each process | error (median)" if args.rates_now else ""
    print(f"| | measured: median (min..max) | simulated | error{now} |")
    print("|---|---|---|---|" + ("---|---|" if now else ""))
    for key, label in (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s"),
                       ("time_to_first_token_s", "time to first token, s")):
        r = row[key]
        now = f" {r['simulated_now']:.3f} | {r['error_now']:+.0%} |" if args.rates_now else ""
        print(f"| {label} | {r['measured']:.3f} ({r['min']:.3f}..{r['max']:.3f}) | {r['simulated']:.3f} | "
              f"{r['error']:+.0%} |{now}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ..tools.bench import terminal_progress
    from ..tools.calibrate import VALIDATE_MODELS, validate

    if args.decode:
        return cmd_validate_decode(args)

    models = tuple(args.models.split(",")) if args.models else VALIDATE_MODELS
    args.profile = _validate_profile(args)
    progress = None if args.json else terminal_progress("validate", "steps" if args.rates_now else "processes")
    rows = validate(args.profile, models, args.repeat, args.config, progress, args.loads, args.rates_now)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"simulated ({args.profile}) vs measured ({args.repeat} fresh processes, interleaved; "
          f"{args.loads} loads each):\n")
    now = " | simulated, rates measured before each round | error (median)" if args.rates_now else ""
    print(f"| model | mode | 1st load of a process: median (min..max) | simulated | error{now} "
          f"| settled loads (3rd on): median (min..max) | simulated | error{now} "
          "| 2nd load: median | peak staging in flight measured / simulated | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if now else ""))

    def now_cells(r: dict, sim: str, err: str) -> str:
        return f" {r[sim]:.3f} | {r[err]:+.0%} |" if args.rates_now else ""

    for r in rows:
        print(f"| {r['model']} | {r['mode']} | "
              f"{r['fresh_load_s']:.3f} ({r['fresh_min_s']:.3f}..{r['fresh_max_s']:.3f}) | {r['simulated_fresh_s']:.3f} | "
              f"{r['fresh_error']:+.0%} |{now_cells(r, 'simulated_fresh_now', 'fresh_error_now')} "
              f"{r['measured_load_s']:.3f} ({r['measured_min_s']:.3f}..{r['measured_max_s']:.3f}) | "
              f"{r['simulated_load_s']:.3f} | {r['load_error']:+.0%} |{now_cells(r, 'simulated_load_now', 'load_error_now')} "
              f"{r['second_load_s']:.3f} | "
              f"{r['measured_peak_staging'] / 2**20:.1f} / {r['simulated_peak_staging'] / 2**20:.1f} MiB | "
              f"{r['staging_error']:+.1%} |")
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from ..tools.simulate import load_profile
    from ..tools.simulate_run import simulate_decode
    from .bench import batch_counts

    pred = simulate_decode(args.model or "smollm2", load_profile(args.profile), args.prompt_tokens, args.new_tokens)
    if args.json:
        print(json.dumps({"model": pred.model, "profile": pred.profile, "prompt_tokens": pred.prompt_tokens,
                          "new_tokens": pred.new_tokens,
                          "prefill_chunk": pred.prefill_chunk, "prefill_batches": pred.prefill_batches,
                          "prefill_tok_s": pred.prefill_tok_s,
                          "decode_tok_s": pred.decode_tok_s, "time_to_first_token_s": pred.time_to_first_token_s,
                          "dispatches_per_token": pred.step.dispatches,
                          "first_use_s": {"prompt": pred.first_use_s[0], "decode": pred.first_use_s[1]}}))
        return 0
    how = f"batches: {batch_counts(pred.prefill_batches)}" if pred.prefill_chunk else "token by token"
    print(f"{pred.model} on {pred.profile}, {pred.prompt_tokens}-token prompt, {pred.new_tokens} new tokens, predicted: prefill "
          f"{pred.prefill_tok_s:.2f} tok/s ({how})  time to first token {pred.time_to_first_token_s:.3f} s  "
          f"decode {pred.decode_tok_s:.2f} tok/s  ({pred.prefill_tok_s / pred.decode_tok_s:.1f}x)")
    if any(pred.first_use_s):
        print(f"(a fresh process: its pipelines' first dispatches, {pred.first_use_s[0] * 1e3:.1f} ms in the prompt "
              f"and {pred.first_use_s[1] * 1e3:.1f} ms in the first decoded token, included)")
    batches = [n for n in pred.prefill_batches if n > 1]
    last = batches[-1] if batches else pred.prefill_chunk
    for title, e in ((f"the last prefill batch ({last} tokens)", pred.prefill), ("one decoded token", pred.step)):
        print(f"\n{title}: {e.seconds * 1e3:.1f} ms, of which the host {e.seconds * 1e3 - sum(s for s, _ in e.by_kind.values()) * 1e3:.1f}\n")
        print("| op kind | ms | dispatches |")
        print("|---|---|---|")
        for k, (sec, n) in e.by_kind.items():
            print(f"| {k} | {sec * 1e3:.2f} | {n} |")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..paths import DEFAULT_CONFIG
    from ..tools.simulate import load_profile, model_nodes, simulate

    if args.rates_now and not args.validate:
        raise ValueError("--rates-now goes with --validate")
    if args.calibrate:
        return cmd_calibrate(args)
    if args.validate:
        return cmd_validate(args)
    args.profile = args.profile or "lavapipe"
    if args.decode:
        return cmd_decode(args)

    args.model = args.model or "synthetic:256"
    profile = load_profile(args.profile)
    cfg = load_config(args.config or DEFAULT_CONFIG)
    sim = simulate(model_nodes(args.model, profile, cfg), cfg, profile, args.mode, first_load=args.first_load)
    if args.plot:
        from ..tools.plot import Span, plot_timeline

        spans = [Span(b.index, b.cpu_start_s, b.cpu_end_s, b.gpu_start_s, b.gpu_end_s, b.staging_nbytes,
                      b.writes_end_s)
                 for b in sim.batches]
        plot_timeline(spans, [], f"{args.model} on {profile.name}, {sim.mode} (simulated): {sim.load_s:.3f} s",
                      args.plot)
    if args.json:
        print(json.dumps({"model": args.model, "profile": profile.name, **sim.to_dict()}))
        return 0
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    print(f"{args.model} on {profile.name} ({sim.mode}{', first load of a process' if args.first_load else ''}), "
          "predicted:")
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
    sim.add_argument("--profile", help="profile TOML or a name in profiles/ (default lavapipe; with --validate, the "
                                       "profile shipped for the device measured: the one of its name, such as "
                                       "lavapipe-256, measured on this host's processor where several are, else "
                                       "profiles/<renderer>.toml)")
    sim.add_argument("--model", help=f"{KNOWN_MODELS} (default synthetic:256; with --decode, smollm2)")
    sim.add_argument("--config", help="TOML config (default configs/default.toml)")
    sim.add_argument("--mode", choices=["legacy", "staged", "reduce-peak"], help="default: from the config")
    sim.add_argument("--first-load", action="store_true",
                     help="the first load of a fresh process (it faults in its device memory: [gpu] fresh_device_gbps, "
                          "or populates a packing shader's on the CPU: [cpu] populate_gbps); "
                          "default: a settled load")
    sim.add_argument("--decode", action="store_true",
                     help="predict prefill and decode speed of a llama model (as vkgraph bench decode) from the "
                          "profile's [execute] rates")
    sim.add_argument("--prompt-tokens", type=int, default=64, help="with --decode: prompt length (default 64)")
    sim.add_argument("--new-tokens", type=int, default=32,
                     help="with --decode: tokens decoded after the prompt (default 32)")
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--plot", help="write a PNG of the predicted timeline and staging memory")
    sim.add_argument("--calibrate", action="store_true", help="measure a profile on this device (see --out)")
    sim.add_argument("--out", help="with --calibrate: write the profile here (e.g. profiles/<device>.toml)")
    sim.add_argument("--rounds", type=int, default=1,
                     help="with --calibrate: calibrate this many times, each rate the median over them (default 1)")
    sim.add_argument("--validate", action="store_true",
                     help="compare the simulator with measured loads (legacy, staged, reduce-peak); with "
                          "--decode, with measured prefill and decode (--model, default smollm2)")
    sim.add_argument("--models", help="with --validate: comma-separated (default synthetic:256,minilm,smollm2)")
    sim.add_argument("--repeat", type=int, default=1, help="with --validate: fresh processes per point")
    sim.add_argument("--rates-now", action="store_true",
                     help="with --validate: also measure the profile's load rates (with --decode: its [execute] "
                          "rates) again on this device before every round (about a minute each) and simulate that "
                          "round with them: the model's error apart from the host's drift since the profile was "
                          "calibrated and during the run (the median of the rounds' errors)")
    sim.add_argument("--loads", type=int, default=4,
                     help="with --validate: loads per process (> 2); the first load is compared with the "
                          "first-load simulation, the loads after the second with the settled one (the first two "
                          "fault in memory the process does not hold yet)")
    sim.set_defaults(fn=cmd_simulate)
