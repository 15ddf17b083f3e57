"""``vkgraph bench load``: one or more measured loads in this process (numbers, never pass/fail)."""

from __future__ import annotations

import argparse
import json

from ..models.registry import KNOWN_MODELS
from ..tools.bench import MODES


def cmd_bench_load(args: argparse.Namespace) -> int:
    from ..tools.bench import bench_json, load_model

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
        from ..tools.plot import Span, plot_timeline

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


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (numbers, never pass/fail timing)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bl = bench_sub.add_parser("load", help="one model load in this process")
    bl.add_argument("--model", default="synthetic:256",
                    help=f"{KNOWN_MODELS} (default synthetic:256)")
    bl.add_argument("--mode", choices=MODES, default="staged",
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
