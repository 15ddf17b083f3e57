"""A/B of vkgraph.ops' kernel policy (its upper-case constants: LINEAR_TILE_ROWS_CPU,
LINEAR_TOKENS_GPU, CPU_KERNELS, ...) on SmolLM2: one session per variant, built with the
constants set, all in one process, then rounds of a prompt batch and decode steps with the
variants' order reversed every other round (a host's speed drifts within minutes: the README's
A/B figures are taken this way). Prints each variant's batch and step wall time (min and median
over the rounds), with --profile the median over the rounds of each op kind's GPU ms in a batch
and in a round's last step (timestamps after every dispatch slow small ones), and how far
its logits are from the first variant's (a change of policy must not change the results beyond
float rounding).

    python benchmarks/policy_ab.py [--rounds 8] [--prompt-tokens 64] [--steps 8] [--profile]
        [--device lavapipe] [--config configs/fast-prefill.toml] VARIANT [VARIANT ...]

VARIANT is ``default`` (the constants as shipped) or ``NAME=VALUE[;NAME=VALUE...]``, VALUE a
Python literal: e.g. ``LINEAR_TILE_ROWS_CPU=8`` or ``"LINEAR_TOKENS_GPU=1"``.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time

import numpy as np

from vkgraph import ops


def parse_variant(text: str) -> dict[str, object]:
    """``NAME=VALUE;...`` as {NAME: value}; ``default`` as {}. Exits naming a constant ops lacks or
    a value that is not a literal."""
    if text == "default":
        return {}
    out: dict[str, object] = {}
    for part in filter(None, text.split(";")):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name.isupper() or not hasattr(ops, name):
            sys.exit(f"policy_ab: {part!r} is not NAME=VALUE of a constant of vkgraph.ops")
        try:
            out[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            sys.exit(f"policy_ab: {name}: {value!r} is not a Python literal")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", metavar="VARIANT")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="the batch (one prefill entry point of this size)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps a round, after the batch")
    ap.add_argument("--profile", action="store_true", help="GPU time per op kind (timestamps after every dispatch)")
    ap.add_argument("--device", default=None, help="renderer (lavapipe, swiftshader) or device-name substring")
    ap.add_argument("--config", default=None,
                    help="a config file every variant's session takes (e.g. configs/fast-prefill.toml)")
    args = ap.parse_args()
    if min(args.rounds, args.steps, args.prompt_tokens) < 1:
        ap.error("--rounds, --steps and --prompt-tokens must be >= 1")
    if args.device:
        os.environ["VKGRAPH_DEVICE"] = args.device
    from vkgraph.config import load_config
    from vkgraph.errors import ConfigError
    from vkgraph.models.llama import LlamaSession  # after VKGRAPH_DEVICE is set

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        sys.exit(f"policy_ab: {exc}")

    variants = {text: parse_variant(text) for text in args.variants}
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 40000, args.prompt_tokens)]
    sessions: dict[str, LlamaSession] = {}
    try:
        for text, consts in variants.items():
            saved = {name: getattr(ops, name) for name in consts}
            try:
                for name, value in consts.items():
                    setattr(ops, name, value)
                sessions[text] = LlamaSession(config=config, prefill=args.prompt_tokens,
                                              max_context=args.prompt_tokens + args.steps, profile=args.profile)
            finally:
                for name, value in saved.items():
                    setattr(ops, name, value)
        first = next(iter(sessions.values()))
        print(f"{first.graph.device.physical.name}: {args.prompt_tokens}-token batch, then {args.steps} decode steps; "
              f"{args.rounds} rounds, the variants' order reversed every other round\n")
        batch: dict[str, list[float]] = {t: [] for t in sessions}
        step: dict[str, list[float]] = {t: [] for t in sessions}
        logits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        profiles: dict[str, list[tuple[dict, dict]]] = {t: [] for t in sessions}
        for r in range(args.rounds):
            order = list(sessions.items())
            for text, s in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                after_prompt = s.prefill(ids)
                batch[text].append(time.perf_counter() - t0)
                prof_batch = s.graph.execute_profile() if args.profile else {}
                t0 = time.perf_counter()
                for i in range(args.steps):
                    after_steps = s.step(ids[i % len(ids)], args.prompt_tokens + i)
                step[text].append((time.perf_counter() - t0) / args.steps)
                logits[text] = (after_prompt, after_steps)
                profiles[text].append((prof_batch, s.graph.execute_profile() if args.profile else {}))
        ref = logits[next(iter(sessions))]
        ms = lambda xs: f"{min(xs) * 1e3:.1f} / {statistics.median(xs) * 1e3:.1f}"  # noqa: E731
        print("| variant | batch ms (min / median) | step ms (min / median) | max logit difference |")
        print("|---|---|---|---|")
        for text in sessions:
            diff = max(float(np.abs(a - b).max()) for a, b in zip(logits[text], ref))
            print(f"| {text} | {ms(batch[text])} | {ms(step[text])} | {diff:.1e} |")
        if args.profile:
            for text, rounds in profiles.items():
                def top(which: int) -> str:
                    kinds = {k for r in rounds for k in r[which]}
                    med = {k: statistics.median(r[which].get(k, (0.0, 0))[0] for r in rounds) for k in kinds}
                    return ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1])[:4])
                print(f"\n{text}: GPU ms (medians) a batch: {top(0)}; a step: {top(1)}")
    finally:
        for s in sessions.values():
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
