"""The exported ExecuTorch programs of tests/data/programs on this machine's device: ops, weights,
load time, the tensors held in the textures the program asks for, and the largest error against
the eager PyTorch outputs saved next to them.

    .venv/bin/python benchmarks/programs.py [--device lavapipe|swiftshader]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vkgraph.pte import list_ops, load_program  # noqa: E402

PROGRAMS = ROOT / "tests" / "data" / "programs"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", help="renderer or device name (sets VKGRAPH_DEVICE)")
    args = ap.parse_args()
    if args.device:
        os.environ["VKGRAPH_DEVICE"] = args.device
    rows = []
    device = ""
    for pte in sorted(PROGRAMS.glob("*.pte")):
        uses = list_ops(pte)
        delegates = len({u.where for u in uses if u.where.startswith("delegate")})
        kernels = sum(u.where == "kernel" for u in uses)
        missing = sorted({u.name for u in uses if not u.supported})
        row = [pte.stem, f"{pte.stat().st_size / 1024:.0f}", str(len(uses)), str(delegates), str(kernels)]
        if missing:
            rows.append(row + ["-", "-", "-", "-", f"unsupported: {', '.join(missing)}"])
            continue
        with np.load(pte.with_suffix(".npz")) as d:
            inputs = [d[k] for k in sorted(d.files) if k.startswith("input_")]  # the first call
            refs = [d[k] for k in sorted(d.files) if k.startswith("output_")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            with load_program(pte) as prog:
                load_s = time.perf_counter() - t0
                device = prog.report.device
                in_place = prog.report.zero_copy_tensors
                held = [lw.storage() for _, lw in prog.graphs]
                outs = prog.run(*inputs)
        honoured = sum(n for n, _ in held)
        asked = honoured + sum(sum(kept.values()) for _, kept in held)
        err = max(float(np.abs(y.astype(np.float64) - r).max() / max(1.0, np.abs(r).max())) for y, r in zip(outs, refs))
        # the tolerances: fp32 1e-3, quantized 3e-2 (eager torchao quantizes activations too)
        tol = 3e-2 if any(q in u.name for u in uses for q in ("q4gsw", "quantize", "qparams")) else 1e-3
        rows.append(row + [f"{load_s * 1000:.0f}", str(in_place), f"{honoured} / {asked}", f"{err:.1e}",
                           f"{'ok' if err <= tol else 'MISMATCH'} ({tol:g})"])
    print(f"Device: {device}\n")
    head = ["program", "KiB", "ops", "delegates", "CPU kernels", "load + build ms", "weights in place",
            "in textures as asked", "max error / max(1, max|ref|)",
            "vs PyTorch (tolerance)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
