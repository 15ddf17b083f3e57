"""``vkgraph run``: the main job. Load a model with staged prepack, run it, check or show it."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..config import GraphConfig, load_config
from ..models.registry import KNOWN_MODELS, SAMPLE_TEXTS, ModelRef, resolve
from ..paths import DEFAULT_CONFIG
from ..tools.bench import terminal_progress


def _config(args: argparse.Namespace) -> GraphConfig:
    cfg = load_config(args.config or DEFAULT_CONFIG)
    return cfg.replace(prepack__reduce_peak_memory=True) if args.reduce_peak else cfg


def cmd_run_minilm(args: argparse.Namespace, ref: ModelRef) -> int:
    from ..models import minilm

    texts = args.text or list(SAMPLE_TEXTS)
    res = minilm.embed(texts, _config(args), path=ref.path, progress=None if args.json else terminal_progress("prepack"))
    if args.trace:
        res.report.write_trace(args.trace)
    if args.json:
        print(json.dumps({"device": res.report.device, "embeddings": res.vectors.tolist(),
                          "cosine": res.cosine().tolist(), "load": res.report.to_dict()}))
        return 0
    print(res.report.format_table())
    print(f"\n{len(texts)} embeddings of {res.vectors.shape[1]} floats; cosine similarities:")
    for i, t in enumerate(texts):
        sims = "  ".join(f"{c:6.3f}" for c in res.cosine()[i])
        print(f"  {sims}   {t[:60]!r}")
    return 0


def cmd_run_llama(args: argparse.Namespace, ref: ModelRef) -> int:
    from ..models.llama import LlamaSession

    cfg = _config(args)
    prompt = args.prompt or "The capital of France is"
    stream = None if args.json else (lambda piece: (sys.stdout.write(piece), sys.stdout.flush()))
    with LlamaSession(ref.path, cfg, progress=None if args.json else terminal_progress("prepack")) as s:
        if args.trace:
            s.report.write_trace(args.trace)
        if not args.json:
            print(s.report.format_table())
            print(f"\nprompt: {prompt!r}{' (chat template)' if args.chat else ''}\n---")
        gen = s.generate(prompt, args.max_new_tokens, chat=args.chat, on_token=stream)
    if args.json:
        print(json.dumps({"device": s.report.device, "tokens": gen.tokens, "text": gen.text, "first_logits": gen.first_logits.tolist(),
                          "load": s.report.to_dict(), "tokens_per_s": gen.tokens_per_s}))
    else:
        print(f"\n---\n{len(gen.tokens)} tokens after a {gen.prompt_tokens}-token prompt, {gen.tokens_per_s:.1f} tokens/s")
    return 0


def cmd_run_program(args: argparse.Namespace) -> int:
    from ..pte import list_ops, load_program
    from ..pte.program import program_inputs

    if args.list_ops:
        uses = list_ops(args.model)
        if args.json:
            print(json.dumps([{"where": u.where, "node": u.node, "op": u.name, "supported": u.support or "no"}
                              for u in uses], indent=2))
        else:
            print(f"{'where':<12} {'node':>5}  {'op':<44} supported")
            for u in uses:
                print(f"{u.where:<12} {u.node:>5}  {u.name:<44} {u.support or 'NO'}")
        return 0 if all(u.supported for u in uses) else 1
    with load_program(args.model, _config(args)) as prog:
        inputs = program_inputs(prog.inputs, args.inputs)
        outputs = prog.run(*inputs)
        report = prog.report
    if args.save:
        np.savez(args.save, **{f"output_{k}": y for k, y in enumerate(outputs)})
    summary = [{"name": f"output_{k}", "shape": list(y.shape), "dtype": str(y.dtype),
                "min": float(np.min(y)) if y.size else None, "max": float(np.max(y)) if y.size else None}
               for k, y in enumerate(outputs)]
    if args.json:
        print(json.dumps({"model": args.model, "device": report.device if report else "", "outputs": summary,
                          "load": report.to_dict() if report else None}, indent=2))
        return 0
    if report is not None:
        print(report.format_table())
    print(f"\n{args.model}: {len(inputs)} inputs ({'from ' + args.inputs if args.inputs else 'random, seed 0'}), "
          f"{len(outputs)} outputs")
    for s in summary:
        print(f"  {s['name']}: {tuple(s['shape'])} {s['dtype']}  min {s['min']:.6g}  max {s['max']:.6g}"
              if s["min"] is not None else f"  {s['name']}: {tuple(s['shape'])} {s['dtype']}")
    if args.save:
        print(f"outputs written to {args.save}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..tools.bench import load_model

    if args.model.endswith(".pte"):
        return cmd_run_program(args)
    if args.list_ops or args.inputs or args.save:
        raise ValueError("--list-ops, --inputs and --save are for ExecuTorch programs (--model FILE.pte)")
    ref = resolve(args.model)
    if ref.kind == "bert":
        return cmd_run_minilm(args, ref)
    if ref.kind == "llama":
        return cmd_run_llama(args, ref)
    mode = "reduce-peak" if args.reduce_peak else "staged"
    print(f"loading {args.model} ({mode}, config {args.config or 'configs/default.toml'})")
    r = load_model(args.model, mode, args.config, trace=args.trace, progress=True)
    if args.json:
        print(json.dumps({"model": r.model, "device": r.report.device, "output_ok": r.output_ok, "load": r.report.to_dict(),
                          "peak_rss_delta_nbytes": r.peak_rss_delta_nbytes}, indent=2))
    else:
        print(r.report.format_table((("peak RSS delta", f"{r.peak_rss_delta_nbytes / 2**20:.1f} MiB"),)))
        print(f"forward pass vs numpy: max |error| {r.max_abs_error:.2e} -> {'OK' if r.output_ok else 'MISMATCH'}")
        if args.trace:
            print(f"trace written to {args.trace} (open in Perfetto or chrome://tracing)")
    return 0 if r.output_ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="the main job: load a model with staged prepack, run it, check it")
    run.add_argument("--model", default="synthetic:256",
                     help=f"{KNOWN_MODELS} (default synthetic:256)")
    run.add_argument("--text", action="append", help="a sentence to embed (minilm; repeat for several)")
    run.add_argument("--prompt", help="the prompt (smollm2)")
    run.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (smollm2)")
    run.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (smollm2, default 32)")
    run.add_argument("--config", help="TOML config (default configs/default.toml)")
    run.add_argument("--reduce-peak", action="store_true", help="ET-VK's reduce-peak-memory mode")
    run.add_argument("--trace", help="write a Chrome trace of the load to this file")
    run.add_argument("--list-ops", action="store_true", help="print each op of a .pte program and whether vkgraph "
                     "supports it (exit status 1 when one is not)")
    run.add_argument("--inputs", help="a .npz with input_0, input_1, ... in the program's input order (.pte; "
                     "default: random, seed 0)")
    run.add_argument("--save", help="write the program's outputs to this .npz as output_0, output_1, ... (.pte)")
    run.add_argument("--json", action="store_true")
    run.set_defaults(fn=cmd_run)
