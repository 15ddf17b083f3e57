"""Issue 20's figures before and after, on this machine in one run: the tree at ``--rev`` (default
efbc549, the last commit before issue 20's work: the prompt token by token, a quantized linear a
row per invocation) extracted by ``git archive`` into a temporary directory, against this
checkout. Fresh processes alternate between the trees (a host's speed drifts within minutes);
the figures are medians over ``--repeat`` processes each:

- SmolLM2: a 64-token prompt, then 32 greedy tokens, twice in a process, the faster of the two
  rounds (``vkgraph bench decode --repeat 2``; a tree without it feeds the prompt token by token
  through ``LlamaSession.step``, as that tree did); the time to the first token is the first
  round's;
- synthetic:512: a cold load (``vkgraph bench load``, staged and legacy), and this checkout's
  first-touch copy of the same bytes (``--mode copy-floor``), the floor a load is measured against.

    .venv/bin/python benchmarks/before_after.py [--rev efbc549] [--repeat 3] [--device swiftshader]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vkgraph.tools.bench import python_in_subprocess  # noqa: E402

PROMPT, NEW = 64, 32
ROUNDS = 2  # of prompt and decoding in a process: the rates are the faster round's (bench decode --repeat)
LOAD_MODEL = "synthetic:512"

#: a tree without ``bench decode``: the prompt token by token, then greedy decoding; one JSON line
STEPS = """
import json, sys, time
import numpy as np
from vkgraph.models.llama import LlamaSession
from vkgraph.models.registry import SAMPLE_PROMPT, resolve
P, N, R = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
with LlamaSession(resolve("smollm2").path) as s:
    session_s = time.perf_counter() - t
    sample = s.tokenizer.encode(SAMPLE_PROMPT)
    prompts, decodes = [], []
    for _ in range(R):
        t0 = time.perf_counter()
        for pos, tok in enumerate((sample * (P // len(sample) + 1))[:P]):
            logits = s.step(tok, pos)
        token = int(np.argmax(logits))
        prompts.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        for i in range(N):
            token = int(np.argmax(s.step(token, P + i)))
        decodes.append(time.perf_counter() - t1)
    print(json.dumps({"device": s.report.device, "prefill_tok_s": P / min(prompts), "decode_tok_s": N / min(decodes),
                      "time_to_first_token_s": prompts[0], "session_s": session_s, "prefill_batches": [1] * P}))
"""


def run_json(tree: Path, args: list[str]) -> dict:
    """``python args`` in a fresh process in ``tree`` (python_in_subprocess); its last JSON line."""
    out = python_in_subprocess(args, tree)
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def decode(tree: Path) -> dict:
    if "def decode_bench" in (tree / "vkgraph/tools/bench.py").read_text():
        return run_json(tree, ["-m", "vkgraph", "bench", "decode", "--model", "smollm2", "--prompt-tokens", str(PROMPT),
                               "--new-tokens", str(NEW), "--repeat", str(ROUNDS), "--json"])
    return run_json(tree, ["-c", STEPS, str(PROMPT), str(NEW), str(ROUNDS)])


def load(tree: Path, mode: str) -> dict:
    return run_json(tree, ["-m", "vkgraph", "bench", "load", "--model", LOAD_MODEL, "--mode", mode, "--json"])


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="efbc549")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", help="renderer or device name (sets VKGRAPH_DEVICE)")
    args = ap.parse_args()
    if args.device:
        os.environ["VKGRAPH_DEVICE"] = args.device
    with tempfile.TemporaryDirectory(prefix="vkgraph-before-") as tmp:
        before = Path(tmp)
        archive = subprocess.run(["git", "archive", "--format=tar", args.rev], cwd=ROOT, capture_output=True, check=False)
        if archive.returncode:
            sys.exit(f"git archive {args.rev}: {archive.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(before, filter="data")
        trees = {"before": before, "after": ROOT}
        runs = {("decode", t): (lambda t=t: decode(trees[t])) for t in trees}
        runs |= {(mode, t): (lambda t=t, mode=mode: load(trees[t], mode)) for t in trees for mode in ("staged", "legacy")}
        runs[("copy-floor", "after")] = lambda: load(ROOT, "copy-floor")
        for f in runs.values():  # each tree's shaders compiled and the weights file made before timing
            f()
        results: dict[tuple[str, str], list[dict]] = {key: [] for key in runs}
        for i in range(args.repeat):
            for key in list(runs) if i % 2 == 0 else list(runs)[::-1]:
                results[key].append(runs[key]())

    def med(key: tuple[str, str], field: str) -> float:
        return statistics.median(r[field] for r in results[key])

    device = results[("decode", "after")][0]["device"]
    head = git("rev-parse", "--short", "HEAD")
    print(f"Device: {device}. before: {args.rev} ({git('show', '-s', '--format=%cs', args.rev)}), after: {head}; "
          f"medians of {args.repeat} fresh processes each, the trees in turn\n")
    floor = med(("copy-floor", "after"), "load_s")
    rows = [
        (f"SmolLM2 {PROMPT}-token prompt, tok/s", lambda t: f"{med(('decode', t), 'prefill_tok_s'):.1f}"),
        ("  fed as", lambda t: "token by token" if max(results[("decode", t)][0]["prefill_batches"]) == 1
         else "batches of " + ", ".join(str(n) for n in sorted(set(results[("decode", t)][0]["prefill_batches"]), reverse=True))),
        (f"decode tok/s ({NEW} tokens)", lambda t: f"{med(('decode', t), 'decode_tok_s'):.1f}"),
        ("prefill / decode", lambda t: f"{med(('decode', t), 'prefill_tok_s') / med(('decode', t), 'decode_tok_s'):.1f}x"),
        ("time to first token, s", lambda t: f"{med(('decode', t), 'time_to_first_token_s'):.3f}"),
        (f"{LOAD_MODEL} cold load, staged, s", lambda t: f"{med(('staged', t), 'load_s'):.3f}"),
        ("  copy floor / load", lambda t: f"{floor / med(('staged', t), 'load_s'):.2f}x"),
        (f"{LOAD_MODEL} cold load, legacy, s", lambda t: f"{med(('legacy', t), 'load_s'):.3f}"),
        ("  copy floor / load", lambda t: f"{floor / med(('legacy', t), 'load_s'):.2f}x"),
    ]
    print(f"| | before ({args.rev}) | after ({head}) |\n|---|---|---|")
    for name, cell in rows:
        print(f"| {name} | {cell('before')} | {cell('after')} |")
    print(f"\n{LOAD_MODEL}'s first-touch copy floor (numpy, this checkout): {floor:.3f} s; every load's output checked: "
          f"{all(r.get('output_ok') for (mode, _), rs in results.items() if mode in ('staged', 'legacy') for r in rs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
