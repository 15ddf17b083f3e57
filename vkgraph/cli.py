"""The ``vkgraph`` command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .errors import VkGraphError


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _device_infos() -> tuple[str, list[dict[str, Any]]]:
    from .runtime import Instance
    from .runtime._vk import call, vk
    from .runtime.instance import version_str

    loader = version_str(call(vk.vkEnumerateInstanceVersion))
    with Instance(validation=False) as inst:
        return loader, [p.info() for p in inst.physical_devices()]


def cmd_info(args: argparse.Namespace) -> int:
    loader, devices = _device_infos()
    if args.json:
        print(json.dumps({"loader_version": loader, "devices": devices}, indent=2))
        return 0
    print(f"Vulkan loader {loader}; {len(devices)} device(s)")
    for i, d in enumerate(devices):
        lim = d["limits"]
        print(f"\ndevice {i}: {d['name']}  [{d['type']}]")
        print(f"  driver                      {d['driver']}")
        print(f"  api version                 {d['api_version']}")
        print(f"  device-local host-visible   {'yes' if d['host_visible_device_local'] else 'no'}")
        for h in d["memory_heaps"]:
            print(f"  memory heap {h['index']}               {_mib(h['size'])}{' device-local' if h['device_local'] else ''}")
        for t in d["memory_types"]:
            print(f"  memory type {t['index']:<2}              heap {t['heap']}: {'|'.join(t['flags']) or '-'}")
        print(f"  maxStorageBufferRange       {lim['maxStorageBufferRange']} ({_mib(lim['maxStorageBufferRange'])})")
        print(f"  maxMemoryAllocationSize     {lim['maxMemoryAllocationSize']} ({_mib(lim['maxMemoryAllocationSize'])})")
        print(f"  max workgroup size          {lim['maxComputeWorkGroupSize']} ({lim['maxComputeWorkGroupInvocations']} invocations)")
        print(f"  maxPushConstantsSize        {lim['maxPushConstantsSize']}")
        print(f"  timestamps                  {'yes' if d['timestamps'] else 'no'} (period {lim['timestampPeriod']} ns)")
        print(f"  timeline semaphores         {'yes' if d['timeline_semaphore'] else 'no'}")
        print(f"  extensions                  {', '.join(d['extensions']) or '-'}")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    import numpy as np

    from .runtime import Device
    from .smoke import axpby

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(args.n, dtype=np.float32)
    y = rng.standard_normal(args.n, dtype=np.float32)
    alpha, beta = 1.5, -0.25
    t0 = time.perf_counter()
    with Device(args.device, validation=args.validation or None) as dev:
        print(f"device: {dev.name} ({dev.physical.driver})")
        res = axpby(dev, x, y, alpha, beta)
    wall = time.perf_counter() - t0
    expect = alpha * x + beta * y
    err = float(np.max(np.abs(res.y - expect)))
    ok = bool(np.allclose(res.y, expect, rtol=1e-5, atol=1e-5))
    gpu = f", dispatch {res.gpu_ns / 1e6:.3f} ms (timestamps)" if res.gpu_ns is not None else ""
    print(f"compute smoke test: y = {alpha}*x + {beta}*y on {args.n} floats: max |error| {err:.2e} "
          f"-> {'OK' if ok else 'MISMATCH'} ({wall:.3f} s total{gpu})")
    return 0 if ok else 1


DEFAULT_TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]


def cmd_run_minilm(args: argparse.Namespace) -> int:
    from .bench import CONFIG_DIR, terminal_progress
    from .config import load_config
    from .models import minilm

    texts = args.text or DEFAULT_TEXTS
    cfg = load_config(args.config or CONFIG_DIR / "default.toml")
    if args.reduce_peak:
        cfg = cfg.replace(prepack__reduce_peak_memory=True)
    path = None if args.model == "minilm" else args.model
    res = minilm.embed(texts, cfg, path=path, progress=None if args.json else terminal_progress("prepack"))
    if args.trace:
        res.report.write_trace(args.trace)
    if args.json:
        print(json.dumps({"embeddings": res.vectors.tolist(), "cosine": res.cosine().tolist(),
                          "load": res.report.to_dict()}))
        return 0
    print(res.report.format_table())
    print(f"\n{len(texts)} embeddings of {res.vectors.shape[1]} floats; cosine similarities:")
    for i, t in enumerate(texts):
        sims = "  ".join(f"{c:6.3f}" for c in res.cosine()[i])
        print(f"  {sims}   {t[:60]!r}")
    return 0


def cmd_run_llama(args: argparse.Namespace) -> int:
    from .bench import CONFIG_DIR, terminal_progress
    from .config import load_config
    from .models.llama import LlamaSession

    cfg = load_config(args.config or CONFIG_DIR / "default.toml")
    if args.reduce_peak:
        cfg = cfg.replace(prepack__reduce_peak_memory=True)
    path = None if args.model == "smollm2" else args.model
    prompt = args.prompt or "The capital of France is"
    stream = None if args.json else (lambda piece: (sys.stdout.write(piece), sys.stdout.flush()))
    with LlamaSession(path, cfg, progress=None if args.json else terminal_progress("prepack")) as s:
        if args.trace:
            s.report.write_trace(args.trace)
        if not args.json:
            print(s.report.format_table())
            print(f"\nprompt: {prompt!r}{' (chat template)' if args.chat else ''}\n---")
        gen = s.generate(prompt, args.max_new_tokens, chat=args.chat, on_token=stream)
    if args.json:
        print(json.dumps({"tokens": gen.tokens, "text": gen.text, "first_logits": gen.first_logits.tolist(),
                          "load": s.report.to_dict(), "tokens_per_s": gen.tokens_per_s}))
    else:
        print(f"\n---\n{len(gen.tokens)} tokens after a {gen.prompt_tokens}-token prompt, {gen.tokens_per_s:.1f} tokens/s")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .bench import load_model, model_kind

    kind = model_kind(args.model)
    if kind == "bert":
        return cmd_run_minilm(args)
    if kind == "llama":
        return cmd_run_llama(args)
    mode = "reduce-peak" if args.reduce_peak else "staged"
    print(f"loading {args.model} ({mode}, config {args.config or 'configs/default.toml'})")
    r = load_model(args.model, mode, args.config, trace=args.trace, progress=True)
    if args.json:
        print(json.dumps({"model": r.model, "output_ok": r.output_ok, "load": r.report.to_dict(),
                          "peak_rss_delta_nbytes": r.peak_rss_delta_nbytes}, indent=2))
    else:
        print(r.report.format_table())
        print(f"{'peak RSS delta':<18}  {r.peak_rss_delta_nbytes / 2**20:.1f} MiB")
        print(f"forward pass vs numpy: max |error| {r.max_abs_error:.2e} -> {'OK' if r.output_ok else 'MISMATCH'}")
        if args.trace:
            print(f"trace written to {args.trace} (open in Perfetto or chrome://tracing)")
    return 0 if r.output_ok else 1


def cmd_bench_load(args: argparse.Namespace) -> int:
    from .bench import bench_json, load_model

    if args.loads < 1:
        raise ValueError(f"--loads must be >= 1, not {args.loads}")
    for i in range(args.loads - 1):  # earlier loads in this process: printed, not plotted or traced
        r = load_model(args.model, args.mode, args.config, verify=args.check == "every")
        line = {**bench_json(r, args.mode), "load_index": i}
        print(json.dumps(line) if args.json else f"load {i}: {line['load_s']:.4f} s, output_ok {r.output_ok}")
        if r.output_ok is False:
            return 1
    r = load_model(args.model, args.mode, args.config, trace=args.trace)
    out = bench_json(r, args.mode)
    if args.loads > 1:
        out["load_index"] = args.loads - 1
    if args.plot:
        from .plot import Span, plot_timeline

        spans = [Span(s.index, s.cpu_start_s, s.cpu_end_s, s.gpu_start_s, s.gpu_end_s, s.staging_nbytes)
                 for s in r.report.spans]
        plot_timeline(spans, r.report.waits, f"{args.model}, {args.mode}: load {r.report.load_s:.3f} s", args.plot)
    if args.json:
        print(json.dumps(out))
    else:
        width = max(map(len, out))
        for k, v in out.items():
            print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0 if r.output_ok else 1


def cmd_cache(args: argparse.Namespace) -> int:
    from .cache.format import PackedWeightFile

    path = Path(args.path)
    if args.action == "clear":
        removed = [p for p in (path, path.with_name(path.name + ".lock")) if p.exists()]
        for p in removed:
            p.unlink()
        print(f"removed {', '.join(map(str, removed))}" if removed else f"{path}: nothing to remove")
        return 0
    f = PackedWeightFile(path)
    try:
        if args.action == "verify":
            bad = f.verify()
            print(f"{path}: {len(f.entries)} entries, {len(bad)} with a checksum mismatch")
            for key in bad:
                print(f"  bad: {key}")
            return 1 if bad else 0
        total = sum(e.nbytes for e in f.entries.values())
        ident = f.identity
        print(f"{path}: {len(f.entries)} entries, {total / 2**20:.1f} MiB packed, file {f.size / 2**20:.1f} MiB")
        print(f"built for: {ident.get('driver')} (vendor {ident.get('vendor_id')}, device {ident.get('device_id')})")
        for e in sorted(f.entries.values(), key=lambda e: e.offset):
            print(f"  {e.nbytes:>12}  {e.layout:<28} {e.key.split('|', 1)[0]}")
        return 0
    finally:
        f.close()


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate, profile_toml
    from .runtime import Device

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
    from .bench import terminal_progress
    from .calibrate import VALIDATE_MODELS, validate

    models = tuple(args.models.split(",")) if args.models else VALIDATE_MODELS
    rows = validate(args.profile, models, args.repeat, args.config,
                    None if args.json else terminal_progress("validate", "processes"), args.loads)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"simulated ({args.profile}) vs measured ({args.repeat} fresh processes, interleaved; "
          f"{args.loads} loads each):\n")
    print("| model | mode | measured load_s, settled loads (3rd on): median (min..max) | simulated | error "
          "| 1st load of a process: median (min..max) | 2nd load: median | peak staging measured / simulated | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mode']} | {r['measured_load_s']:.3f} ({r['measured_min_s']:.3f}.."
              f"{r['measured_max_s']:.3f}) | {r['simulated_load_s']:.3f} | {r['load_error']:+.0%} | "
              f"{r['fresh_load_s']:.3f} ({r['fresh_min_s']:.3f}..{r['fresh_max_s']:.3f}) | {r['second_load_s']:.3f} | "
              f"{r['measured_peak_staging'] / 2**20:.1f} / {r['simulated_peak_staging'] / 2**20:.1f} MiB | "
              f"{r['staging_error']:+.1%} |")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from .bench import CONFIG_DIR
    from .config import load_config
    from .simulate import load_profile, model_nodes, simulate

    if args.calibrate:
        return cmd_calibrate(args)
    if args.validate:
        return cmd_validate(args)

    profile = load_profile(args.profile)
    cfg = load_config(args.config or CONFIG_DIR / "default.toml")
    sim = simulate(model_nodes(args.model), cfg, profile, args.mode)
    if args.plot:
        from .plot import Span, plot_timeline

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
                 ("peak staging", mib(sim.peak_staging_nbytes)), ("peak device memory", mib(sim.peak_device_nbytes)),
                 ("packing dispatches", sim.packing_dispatches)):
        print(f"  {k:<20} {v}")
    print("  batch  nodes  staged      cpu start..end     gpu start..end")
    for b in sim.batches[:12]:
        print(f"  {b.index:>5}  {b.nodes:>5}  {mib(b.staging_nbytes):>9}  {b.cpu_start_s:7.3f}..{b.cpu_end_s:7.3f}  "
              f"{b.gpu_start_s:7.3f}..{b.gpu_end_s:7.3f}")
    if len(sim.batches) > 12:
        print(f"  ... {len(sim.batches) - 12} more")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from .bench import terminal_progress
    from .runtime import Instance
    from .tune import (ALPHA, DEFAULT, GRID, Point, best_within, confirm, dominators, grid_points, pareto, plot_tune,
                       pooled, tune, tuned_config)

    points = grid_points(GRID if not args.quick else {k: v[:1] if k != "reduce_peak_memory" else v
                                                       for k, v in GRID.items()})
    if not any(p.prepack == DEFAULT for p in points):
        points.append(Point(dict(DEFAULT)))
    swept = tune(args.model, args.repeat, points, None if args.json else terminal_progress("tune", "loads"))
    budget = args.max_peak_mb * (1 << 20) if args.max_peak_mb else None
    fits = sorted((p for p in swept if budget is None or p.peak_nbytes <= budget), key=lambda p: p.load_s)
    if not fits:
        print(f"no config fits --max-peak-mb {args.max_peak_mb}", file=sys.stderr)
        return 1
    measured, conf, note = swept, None, "Chosen from the sweep alone (--confirm 0)."
    chosen = best_within(swept, budget)
    if args.confirm > 0:
        default = next(p for p in swept if p.prepack == DEFAULT)
        finalists = [p for p in fits if p.prepack != DEFAULT][: args.finalists]
        # the configs that put the default off the sweep's front get a second look too
        challengers = dominators(swept, default)
        conf = confirm(args.model, finalists + challengers, DEFAULT, args.confirm,
                       None if args.json else terminal_progress("confirm", "loads"))
        measured = pooled(swept, conf)
        if budget is None or conf.default.peak_nbytes <= budget:
            chosen = conf.winner
            note = ("Faster than the default beyond the noise in interleaved confirmation rounds." if conf.significant
                    else "No swept config beat configs/default.toml beyond the measurement noise: these are its values.")
        else:
            chosen = min((p for p in conf.points[:-1] if p.peak_nbytes <= budget), key=lambda p: p.load_s,
                         default=None) or chosen
            note = "configs/default.toml does not fit the memory budget; fastest confirmed finalist."
    default = next(p for p in measured if p.prepack == DEFAULT)
    front = pareto(measured)
    with Instance() as inst:
        device = inst.physical_devices()[0].name
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(tuned_config(chosen, args.model, device, conf.default if conf else default, note))
    if args.plot:
        plot_tune(measured, front, default, next((p for p in measured if p.prepack == chosen.prepack), None),
                  f"vkgraph tune {args.model} on {device}", args.plot)

    def row(p: Point) -> dict:
        return {**p.prepack, "load_s": p.load_s, "min_s": p.spread_s[0], "max_s": p.spread_s[1],
                "runs": p.runs, "peak_nbytes": p.peak_nbytes, "peak_rss_delta_nbytes": p.rss_peak_nbytes,
                "first_load_s": p.first_load_s}

    beaten_by = dominators(measured, default)
    if args.json:
        print(json.dumps({"points": [row(p) for p in measured], "pareto": [measured.index(p) for p in front],
                          "best": next(i for i, p in enumerate(measured) if p.prepack == chosen.prepack),
                          "default": measured.index(default), "default_on_front": default in front,
                          "default_beaten_by": [measured.index(q) for q in beaten_by], "chosen": row(chosen),
                          "chosen_is_default": chosen.prepack == DEFAULT,
                          "confirmation": [row(p) for p in conf.points] if conf else []}))
        return 0
    print(f"\n{args.model}: {len(measured)} configs, {args.repeat} fresh process(es) each"
          + (f", plus {args.confirm} confirmation rounds for {len(conf.points)} of them" if conf else "")
          + "; load_s is the third load of each process (the first two fault in memory the process does not hold yet; "
          "the first is shown apart)\n")
    print("| config | load_s median | min..max | runs | first load | peak device memory | peak RSS delta | pareto |")
    print("|---|---|---|---|---|---|---|---|")
    for p in sorted(measured, key=lambda p: p.load_s):
        tag = " (default)" if p is default else ""
        lo, hi = p.spread_s
        print(f"| {p.label()}{tag} | {p.load_s:.3f} | {lo:.3f}..{hi:.3f} | {p.runs} | {p.first_load_s:.3f} | "
              f"{p.peak_nbytes / 2**20:.1f} MiB | {(p.rss_peak_nbytes or 0) / 2**20:.0f} MiB | {'*' if p in front else ''} |")
    print(f"\ndefault is {'on' if default in front else 'not on'} the Pareto front "
          "(off it: another config is faster beyond the noise at no more memory, or smaller at a time not "
          f"slower beyond the noise; noise: one-sided rank test, p <= {ALPHA})"
          + "".join(f"\n  beaten by: {q.label()}" for q in beaten_by))
    if conf:
        print(f"\nconfirmation: {args.confirm} interleaved rounds\n")
        print("| config | load_s median | min..max | vs default |")
        print("|---|---|---|---|")
        for p in conf.points:
            lo, hi = p.spread_s
            tag = " (default)" if p is conf.default else ""
            print(f"| {p.label()}{tag} | {p.load_s:.3f} | {lo:.3f}..{hi:.3f} | {p.load_s / conf.default.load_s - 1:+.0%} |")
    print(f"\nchosen: {chosen.label()}: {chosen.load_s:.3f} s. {note}")
    if args.out:
        print(f"written to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vkgraph", description=__doc__)
    p.add_argument("--version", action="version", version=f"vkgraph {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="devices, driver, memory types, limits, extensions")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(fn=cmd_info)

    smoke = sub.add_parser("smoke", help="run one compute dispatch and check it against numpy")
    smoke.add_argument("--device", help="device-name substring or ICD json path (default: $VKGRAPH_DEVICE, first)")
    smoke.add_argument("--validation", action="store_true", help="enable the Khronos validation layer")
    smoke.add_argument("-n", type=int, default=1_000_003, help="number of floats (default 1000003)")
    smoke.add_argument("--seed", type=int, default=0)
    smoke.set_defaults(fn=cmd_smoke)

    run = sub.add_parser("run", help="the main job: load a model with staged prepack, run it, check it")
    run.add_argument("--model", default="synthetic:256",
                     help="synthetic:<MB> (default synthetic:256), minilm, smollm2, a BERT checkpoint directory "
                          "or a llama .gguf file")
    run.add_argument("--text", action="append", help="a sentence to embed (minilm; repeat for several)")
    run.add_argument("--prompt", help="the prompt (smollm2)")
    run.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (smollm2)")
    run.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (smollm2, default 32)")
    run.add_argument("--config", help="TOML config (default configs/default.toml)")
    run.add_argument("--reduce-peak", action="store_true", help="ET-VK's reduce-peak-memory mode")
    run.add_argument("--trace", help="write a Chrome trace of the load to this file")
    run.add_argument("--json", action="store_true")
    run.set_defaults(fn=cmd_run)

    bench = sub.add_parser("bench", help="benchmarks (numbers, never pass/fail timing)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bl = bench_sub.add_parser("load", help="one model load in this process")
    bl.add_argument("--model", default="synthetic:256",
                    help="synthetic:<MB>, minilm, smollm2, a BERT checkpoint directory or a llama .gguf file")
    bl.add_argument("--mode", choices=["legacy", "staged", "reduce-peak", "cold-cache", "warm-cache"], default="staged",
                    help="cold-cache: staged load that writes a fresh packed-weight cache; warm-cache: load from it")
    bl.add_argument("--config", help="TOML config (default configs/default.toml)")
    bl.add_argument("--trace", help="write a Chrome trace of the load to this file")
    bl.add_argument("--json", action="store_true")
    bl.add_argument("--plot", help="write a PNG of the load's timeline and staging memory")
    bl.add_argument("--loads", type=int, default=1,
                    help="load N times in this process (one report each; the first pays the fresh process's page faults)")
    bl.add_argument("--check", choices=("every", "last"), default="every",
                    help="run the model and compare with its reference after every load, or only the last "
                         "(earlier loads then follow each other with nothing in between; output_ok null)")
    bl.set_defaults(fn=cmd_bench_load)

    tn = sub.add_parser("tune", help="sweep prepack thresholds in fresh processes and write the best config")
    tn.add_argument("--model", default="synthetic:256")
    tn.add_argument("--max-peak-mb", type=int, help="memory budget for the chosen config (peak device memory: packed weights + staging)")
    tn.add_argument("--repeat", type=int, default=1, help="loads per config (median), each in a fresh process")
    tn.add_argument("--out", help="write the best config here (e.g. configs/tuned-<device>.toml)")
    tn.add_argument("--quick", action="store_true", help="a small grid (reduce-peak on/off at the first values)")
    tn.add_argument("--confirm", type=int, default=5,
                    help="interleaved rounds re-measuring the finalists and the default (0: trust the sweep)")
    tn.add_argument("--finalists", type=int, default=3, help="fastest configs within budget to confirm")
    tn.add_argument("--plot", help="write a PNG of load time vs peak memory with the Pareto front")
    tn.add_argument("--json", action="store_true")
    tn.set_defaults(fn=cmd_tune)

    sim = sub.add_parser("simulate", help="predict a load (time, memory, submits) from a device profile")
    sim.add_argument("--profile", default="lavapipe", help="profile TOML or a name in profiles/ (default lavapipe)")
    sim.add_argument("--model", default="synthetic:256",
                     help="synthetic:<MB>, smollm2, minilm, FILE.gguf, or llama-3.2-1b|llama-3.2-3b|llama-3-8b:<fp32|fp16|q4_0|q4_1|q8_0>")
    sim.add_argument("--config", help="TOML config (default configs/default.toml)")
    sim.add_argument("--mode", choices=["legacy", "staged", "reduce-peak"], help="default: from the config")
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--plot", help="write a PNG of the predicted timeline and staging memory")
    sim.add_argument("--calibrate", action="store_true", help="measure a profile on this device (see --out)")
    sim.add_argument("--out", help="with --calibrate: write the profile here (e.g. profiles/<device>.toml)")
    sim.add_argument("--device", help="with --calibrate: device-name substring or ICD json path")
    sim.add_argument("--validate", action="store_true",
                     help="compare the simulator with measured loads (legacy, staged, reduce-peak)")
    sim.add_argument("--models", help="with --validate: comma-separated (default synthetic:256,synthetic:1024,smollm2)")
    sim.add_argument("--repeat", type=int, default=1, help="with --validate: fresh processes per point")
    sim.add_argument("--loads", type=int, default=4,
                     help="with --validate: loads per process (> 2); the error is against the loads after the "
                          "second (the first two fault in memory the process does not hold yet)")
    sim.set_defaults(fn=cmd_simulate)

    cache = sub.add_parser("cache", help="inspect, verify or clear a packed-weight cache file")
    cache.add_argument("action", choices=["info", "verify", "clear"])
    cache.add_argument("path")
    cache.set_defaults(fn=cmd_cache)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (VkGraphError, ValueError, OSError) as exc:
        print(f"vkgraph: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
