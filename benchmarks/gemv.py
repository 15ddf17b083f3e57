"""Quantized GEMV (the decode step's linears) on the default renderer: GPU time of SmolLM2's
decode shapes per GGML format, with the CPU-renderer layout (rows per invocation, weights as texel
buffers: vkgraph.ops.CPU_KERNELS) and without it, next to numpy's GEMV of the same weights in float32;
then SmolLM2's decode speed with each. Same process, same machine.

    python benchmarks/gemv.py [--formats q4_0 q4_1 q8_0] [--no-decode]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vkgraph import ops
from vkgraph.graph import ComputeGraph

#: SmolLM2-135M's linears at decode: MLP up/gate, down, attention, and a slice of the head
SHAPES = [(1536, 576), (576, 1536), (576, 576), (8192, 576)]
BLOCK = {"q4_0": 18, "q4_1": 20, "q8_0": 34}


def gemv_ms(fmt: str, repeat: int = 10) -> tuple[float, float, float]:
    """(GPU ms of the four GEMVs, best of ``repeat``; numpy ms of the same; max relative error)."""
    import gguf
    from gguf.quants import dequantize, quantize

    qt = getattr(gguf.GGMLQuantizationType, fmt.upper())
    rng = np.random.default_rng(0)
    feeds, refs, weights = {}, [], []
    with ComputeGraph() as g:
        for i, (n, k) in enumerate(SHAPES):
            raw = quantize(rng.standard_normal((n, k)).astype(np.float32), qt)
            weights.append(dequantize(raw, qt).astype(np.float32))
            feeds[f"x{i}"] = rng.standard_normal((1, k)).astype(np.float32)
            g.set_output(ops.linear(g, g.add_input((1, k), np.float32, f"x{i}"), g.add_tensorref(raw, f"w{i}", quant=fmt)),
                         f"y{i}")
            refs.append(feeds[f"x{i}"] @ weights[-1].T)
        g.run_prepack()
        g.encode_execute(profile=True)
        best = float("inf")
        for _ in range(repeat):
            got = g.execute(feeds)
            best = min(best, sum(sec for sec, _ in g.execute_profile().values()))
    err = max(float(np.abs(got[f"y{i}"] - r).max() / np.abs(r).max()) for i, r in enumerate(refs))
    t_np = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for (x, w) in zip(feeds.values(), weights):
            x @ w.T
        t_np = min(t_np, time.perf_counter() - t0)
    return best * 1e3, t_np * 1e3, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", nargs="*", default=list(BLOCK))
    ap.add_argument("--no-decode", action="store_true", help="skip the SmolLM2 decode")
    args = ap.parse_args()
    with ComputeGraph() as g:
        print(f"Device: {g.device.physical.name}\n")
    print("| format | layout | GPU ms (4 GEMVs) | weights GB/s | numpy fp32 ms | vs numpy | max rel error |")
    print("|---|---|---|---|---|---|---|")
    for fmt in args.formats:
        nbytes = sum(n * k // 32 * BLOCK[fmt] for n, k in SHAPES)
        for cpu in (False, True):
            ops.CPU_KERNELS = cpu
            ms, np_ms, err = gemv_ms(fmt)
            print(f"| {fmt} | {'rows + texel' if cpu else 'row per invocation'} | {ms:.2f} | {nbytes / ms / 1e6:.2f} | "
                  f"{np_ms:.2f} | {np_ms / ms:.2f}x | {err:.1e} |")
    if not args.no_decode:
        from vkgraph.tools.bench import decode_bench

        print("\nSmolLM2-135M (Q4_1), 8-token prompt, 16 new tokens:\n")
        print("| layout | decode tok/s | prefill tok/s | GPU ms per token | of which linear_quant |")
        print("|---|---|---|---|---|")
        for cpu in (False, True):
            ops.CPU_KERNELS = cpu
            r = decode_bench("smollm2", 8, 16, prefill_chunk=0)
            prof = decode_bench("smollm2", 8, 4, profile=True, prefill_chunk=0).profile  # timestamps after every dispatch
            gpu_ms = sum(sec for sec, _ in prof.values()) * 1e3
            lin_ms = prof.get("linear_quant", (0.0, 0))[0] * 1e3
            print(f"| {'rows + texel' if cpu else 'row per invocation'} | {r.decode_tok_s:.2f} | {r.prefill_tok_s:.2f} | "
                  f"{gpu_ms:.1f} | {lin_ms:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
