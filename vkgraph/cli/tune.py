"""``vkgraph tune``: sweep prepack thresholds in fresh processes and write the best config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..models.registry import KNOWN_MODELS


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tools.bench import terminal_progress
    from ..tools.tune import (ALPHA, DEFAULT, GRID, Point, best_within, confirm, dominators, grid_points, pareto, plot_tune,
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
    device = next(p.device for p in swept if p.device)  # as the measured loads' reports name it
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    tn = sub.add_parser("tune", help="sweep prepack thresholds in fresh processes and write the best config")
    tn.add_argument("--model", default="synthetic:256", help=f"{KNOWN_MODELS} (default synthetic:256)")
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
