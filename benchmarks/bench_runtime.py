"""Runtime micro-benchmarks: upload bandwidth into mapped buffers (fresh vs reused memory) and
the submit -> fence round trip. Prints numbers; asserts nothing.

    .venv/bin/python benchmarks/bench_runtime.py [--mib 256] [--device NAME]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from vkgraph.runtime import Buffer, CommandPool, Device, Fence, MemoryKind


def upload(dev: Device, src: np.ndarray, reuse: Buffer | None) -> float:
    t0 = time.perf_counter()
    buf = reuse or Buffer(dev, src.nbytes, MemoryKind.UPLOAD)
    buf.write(src)
    dt = time.perf_counter() - t0
    if reuse is None:
        buf.destroy()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--device")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    src = np.random.default_rng(0).integers(0, 255, size=args.mib << 20, dtype=np.uint8)
    with Device(args.device) as dev:
        print(f"device: {dev.name}")
        fresh = [upload(dev, src, None) for _ in range(args.repeat)]
        with Buffer(dev, src.nbytes, MemoryKind.UPLOAD) as ring:
            ring.write(src)  # first touch
            reused = [upload(dev, src, ring) for _ in range(args.repeat)]
        gb = src.nbytes / 1e9
        print(f"upload {args.mib} MiB into fresh mapped buffers:  {gb / statistics.median(fresh):6.2f} GB/s (median of {args.repeat})")
        print(f"upload {args.mib} MiB into a reused buffer:       {gb / statistics.median(reused):6.2f} GB/s")

        with CommandPool(dev) as pool, Fence(dev) as fence:
            (cmd,) = pool.allocate()
            cmd.begin()
            cmd.end()
            trips = []
            for _ in range(200):
                t0 = time.perf_counter()
                dev.submit([cmd], fence)
                fence.wait()
                trips.append(time.perf_counter() - t0)
                fence.reset()
        print(f"empty submit -> fence wait round trip: median {statistics.median(trips) * 1e6:.0f} us, "
              f"p90 {sorted(trips)[180] * 1e6:.0f} us (200 trips)")


if __name__ == "__main__":
    main()
