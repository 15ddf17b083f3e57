"""``vkgraph info``: devices, drivers, memory and limits; ``vkgraph smoke``: one dispatch checked."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _device_infos() -> tuple[str, list[dict[str, Any]]]:
    """Every device the loader reports (vkgraph's bundled ICDs included), the one commands use
    (``--device`` / ``$VKGRAPH_DEVICE``, else the default) marked ``selected``."""
    from ..runtime import loader_version
    from ..runtime.device import instance_for, preferred_device, select_physical_device

    loader = loader_version()
    prefer = preferred_device()
    with instance_for(prefer) as inst:
        devices = inst.physical_devices()
        chosen = select_physical_device(devices, prefer) if devices else None
        return loader, [dict(p.info(), selected=p is chosen) for p in devices]


def cmd_info(args: argparse.Namespace) -> int:
    loader, devices = _device_infos()
    if args.json:
        print(json.dumps({"loader_version": loader, "devices": devices}, indent=2))
        return 0
    print(f"Vulkan loader {loader}; {len(devices)} device(s)")
    for i, d in enumerate(devices):
        lim = d["limits"]
        print(f"\ndevice {i}: {d['name']}  [{d['type']}, {d['renderer']}]{'  (selected)' if d['selected'] else ''}")
        print(f"  driver                      {d['driver']}")
        print(f"  api version                 {d['api_version']}")
        print(f"  device-local host-visible   {'yes' if d['host_visible_device_local'] else 'no'}")
        for h in d["memory_heaps"]:
            print(f"  memory heap {h['index']}               {_mib(h['size'])}{' device-local' if h['device_local'] else ''}")
        for t in d["memory_types"]:
            print(f"  memory type {t['index']:<2}              heap {t['heap']}: {'|'.join(t['flags']) or '-'}")
        print(f"  maxStorageBufferRange       {lim['maxStorageBufferRange']} ({_mib(lim['maxStorageBufferRange'])})")
        print(f"  maxMemoryAllocationSize     {lim['maxMemoryAllocationSize']} ({_mib(lim['maxMemoryAllocationSize'])})")
        print(f"  max workgroup size          {lim['maxComputeWorkGroupSize']} ({lim['maxComputeWorkGroupInvocations']} invocations)")
        print(f"  subgroup size               {d['subgroup_size']}")
        print(f"  maxPushConstantsSize        {lim['maxPushConstantsSize']}")
        print(f"  timestamps                  {'yes' if d['timestamps'] else 'no'} (period {lim['timestampPeriod']} ns)")
        print(f"  timeline semaphores         {'yes' if d['timeline_semaphore'] else 'no'}")
        print(f"  extensions                  {', '.join(d['extensions']) or '-'}")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    import numpy as np

    from ..runtime import Device
    from ..tools.smoke import axpby

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(args.n, dtype=np.float32)
    y = rng.standard_normal(args.n, dtype=np.float32)
    alpha, beta = 1.5, -0.25
    t0 = time.perf_counter()
    with Device(args.device, validation=args.validation or None) as dev:
        print(f"device: {dev.name} ({dev.physical.driver})")
        res = axpby(dev, x, y, alpha, beta)
    wall = time.perf_counter() - t0
    expect = alpha * x + beta * y
    err = float(np.max(np.abs(res.y - expect)))
    ok = bool(np.allclose(res.y, expect, rtol=1e-5, atol=1e-5))
    gpu = f", dispatch {res.gpu_ns / 1e6:.3f} ms (timestamps)" if res.gpu_ns is not None else ""
    print(f"compute smoke test: y = {alpha}*x + {beta}*y on {args.n} floats: max |error| {err:.2e} "
          f"-> {'OK' if ok else 'MISMATCH'} ({wall:.3f} s total{gpu})")
    return 0 if ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    info = sub.add_parser("info", help="devices, driver, memory types, limits, extensions")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(fn=cmd_info)

    smoke = sub.add_parser("smoke", help="run one compute dispatch and check it against numpy")
    smoke.add_argument("--validation", action="store_true", help="enable the Khronos validation layer")
    smoke.add_argument("-n", type=int, default=1_000_003, help="number of floats (default 1000003)")
    smoke.add_argument("--seed", type=int, default=0)
    smoke.set_defaults(fn=cmd_smoke)
