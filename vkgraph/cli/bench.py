"""``vkgraph bench load``: one or more measured loads in this process; ``vkgraph bench decode``:
tokens per second of a llama model, with GPU time per op kind; ``vkgraph bench embed``: sentences
per second of a BERT encoder next to numpy's (numbers, never pass/fail)."""

from __future__ import annotations

import argparse
import json

from ..models.registry import KNOWN_MODELS
from ..tools.bench import FLOOR, MODES


def cmd_bench_load(args: argparse.Namespace) -> int:
    from ..tools.bench import bench_json, copy_floor, load_model

    if args.loads < 1:
        raise ValueError(f"--loads must be >= 1, not {args.loads}")
    if args.mode == FLOOR:  # no device: the same bytes copied into fresh memory
        out = copy_floor(args.model)
        print(json.dumps(out) if args.json else "\n".join(f"{k:<22} {v}" for k, v in out.items()))
        return 0

    def summary(r) -> dict:
        out = bench_json(r, args.mode)
        if not args.profile:
            del out["packer_gpu_s"]
        return out

    for i in range(args.loads - 1):  # earlier loads in this process: printed, not plotted or traced
        r = load_model(args.model, args.mode, args.config, verify=args.check == "every")
        line = {**summary(r), "load_index": i}
        print(json.dumps(line) if args.json else f"load {i}: {line['load_s']:.4f} s, output_ok {r.output_ok}")
        if r.output_ok is False:
            return 1
    r = load_model(args.model, args.mode, args.config, trace=args.trace)
    out = summary(r)
    if args.loads > 1:
        out["load_index"] = args.loads - 1
    if args.plot:
        from ..tools.plot import Span, plot_timeline

        spans = [Span(s.index, s.cpu_start_s, s.cpu_end_s, s.gpu_start_s, s.gpu_end_s, s.staging_nbytes,
                      s.writes_end_s)
                 for s in r.report.spans]
        plot_timeline(spans, r.report.waits, f"{args.model}, {args.mode}: load {r.report.load_s:.3f} s", args.plot)
    if args.json:
        print(json.dumps(out))
    else:
        width = max(map(len, out))
        for k, v in out.items():
            if k != "packer_gpu_s":
                print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
        if args.profile:
            print(f"\nGPU time per packer (a timestamp after every prepack node with GPU work): {r.report.gpu_s * 1e3:.1f} ms "
                  f"in {r.report.submits} command buffers\n")
            print(r.report.format_packers())
    return 0 if r.output_ok else 1


def _print_profile(title: str, per: str, profile: dict[str, tuple[float, int]]) -> None:
    total = sum(sec for sec, _ in profile.values())
    print(f"\n{title}: {total * 1000:.1f} ms\n")
    print(f"| op kind | ms / {per} | share | dispatches / {per} |")
    print("|---|---|---|---|")
    for kind, (sec, n) in profile.items():
        print(f"| {kind} | {sec * 1000:.2f} | {sec / total:.0%} | {n} |")


def batch_counts(sizes: list[int]) -> str:
    """``[64, 64, 32, 1, 1]`` (a prefill plan, llama.prefill_schedule) as ``"2 of 64, 1 of 32, then
    2 one-token steps"``."""
    out = [f"{sizes.count(n)} of {n}" for n in dict.fromkeys(sizes) if n > 1]
    if 1 in sizes:
        steps = sizes.count(1)
        out.append(("then " if out else "") + f"{steps} one-token step{'s' if steps > 1 else ''}")
    return ", ".join(out)


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..tools.bench import decode_bench

    r = decode_bench(args.model, args.prompt_tokens, args.new_tokens, args.config, profile=args.profile,
                     prefill_chunk=args.prefill_chunk, repeat=args.repeat)
    if args.json:
        print(json.dumps(asdict(r)))
        return 0
    print(f"{r.model} on {r.device}: {r.prompt_tokens}-token prompt, {r.new_tokens} new tokens, "
          f"{r.dispatches_per_token} dispatches per token; the session made in {r.session_s:.3f} s")
    how = f"batches: {batch_counts(r.prefill_batches)}" if r.prefill_chunk else "fed token by token"
    if r.int8_activations:
        how += ", int8 activations"
    if r.repeat > 1:
        how += f"; the best of {r.repeat} rounds, as the decode; time to first token: the first round's"
    print(f"prefill {r.prefill_tok_s:.2f} tok/s ({how})  time to first token {r.time_to_first_token_s:.3f} s"
          f"  decode {r.decode_tok_s:.2f} tok/s  (prefill {r.prefill_tok_s / r.decode_tok_s:.1f}x decode)")
    if r.prefill_profile and r.prefill_batches:
        _print_profile(f"GPU time of the prompt's last batch ({r.prefill_batches[-1]} tokens), by op kind", "batch",
                       r.prefill_profile)
    if r.profile:
        _print_profile("GPU time per decoded token, by op kind (timestamps after every dispatch)", "token", r.profile)
    return 0


def cmd_bench_embed(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..tools.bench import embed_bench

    rows = embed_bench(args.model, args.batch or [1, 32], args.repeat, args.config)
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
        return 0
    print(f"{rows[0].model} on {rows[0].device}: median of {rows[0].repeat} forwards after a warm-up; numpy: "
          f"float32 on the CPU, same process")
    print("\n| batch | tokens per sentence | vkgraph sentences/s | numpy sentences/s | vkgraph / numpy | max abs difference |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.batch} | {r.seq} | {r.vkgraph_sentences_s:.1f} | {r.numpy_sentences_s:.1f} | "
              f"{r.vkgraph_sentences_s / r.numpy_sentences_s:.2f}x | {r.max_abs_difference:.1e} |")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (numbers, never pass/fail timing)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bl = bench_sub.add_parser("load", help="one model load in this process")
    bl.add_argument("--model", default="synthetic:256",
                    help=f"{KNOWN_MODELS} (default synthetic:256)")
    bl.add_argument("--mode", choices=(*MODES, FLOOR), default="staged",
                    help="cold-cache: staged load that writes a fresh packed-weight cache; warm-cache: load from it; "
                         f"{FLOOR}: no load, the constants' bytes read into fresh memory by numpy (what a load is "
                         "compared with)")
    bl.add_argument("--config", help="TOML config (default configs/default.toml)")
    bl.add_argument("--trace", help="write a Chrome trace of the load to this file")
    bl.add_argument("--json", action="store_true")
    bl.add_argument("--plot", help="write a PNG of the load's timeline and staging memory")
    bl.add_argument("--profile", action="store_true", help="GPU time per packer (upload and packing of each node)")
    bl.add_argument("--loads", type=int, default=1,
                    help="load N times in this process (one report each; the first pays the fresh process's page faults)")
    bl.add_argument("--check", choices=("every", "last"), default="every",
                    help="run the model and compare with its reference after every load, or only the last "
                         "(earlier loads then follow each other with nothing in between; output_ok null)")
    bl.set_defaults(fn=cmd_bench_load)
    bd = bench_sub.add_parser("decode", help="prompt and greedy decoding of a llama model: tokens per second")
    bd.add_argument("--model", default="smollm2", help="smollm2 or a llama .gguf file (default smollm2)")
    bd.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (the sample prompt repeated)")
    bd.add_argument("--new-tokens", type=int, default=16, help="tokens to decode")
    bd.add_argument("--prefill-chunk", type=int, default=None,
                    help="prompt tokens per batched execute, a remainder of at most half as many in a batch of "
                         "half the size (default 64; 0: token by token)")
    bd.add_argument("--repeat", type=int, default=1,
                    help="rounds of prompt and decoding in the session, each from position 0: the rates of the "
                         "fastest (default 1)")
    bd.add_argument("--config", help="TOML config (default configs/default.toml)")
    bd.add_argument("--profile", action="store_true", help="GPU time per op kind of each decode step")
    bd.add_argument("--json", action="store_true")
    bd.set_defaults(fn=cmd_bench_decode)
    be = bench_sub.add_parser("embed", help="sentence embeddings of a BERT encoder: sentences per second, and numpy's")
    be.add_argument("--model", default="minilm", help="minilm or a BERT checkpoint directory (default minilm)")
    be.add_argument("--batch", type=int, action="append",
                    help="sentences per forward (repeatable; default 1 and 32)")
    be.add_argument("--repeat", type=int, default=5, help="timed forwards per batch size (median; default 5)")
    be.add_argument("--config", help="TOML config (default configs/default.toml)")
    be.add_argument("--json", action="store_true", help="one JSON line per batch size")
    be.set_defaults(fn=cmd_bench_embed)
