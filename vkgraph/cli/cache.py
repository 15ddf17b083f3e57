"""``vkgraph cache info|verify|clear FILE``: inspect a packed-weight cache file."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_cache(args: argparse.Namespace) -> int:
    from ..cache.format import PackedWeightFile

    path = Path(args.path)
    if args.action == "clear":
        removed = [p for p in (path, *(path.with_name(path.name + s) for s in (".lock", ".sources.json")))
                   if p.exists()]
        for p in removed:
            p.unlink()
        print(f"removed {', '.join(map(str, removed))}" if removed else f"{path}: nothing to remove")
        return 0
    f = PackedWeightFile(path)
    try:
        if args.action == "verify":
            bad = f.verify()
            print(f"{path}: {len(f.entries)} entries, {len(bad)} with a checksum mismatch")
            for key in bad:
                print(f"  bad: {key}")
            return 1 if bad else 0
        total = sum(e.nbytes for e in f.entries.values())
        ident = f.identity
        print(f"{path}: {len(f.entries)} entries, {total / 2**20:.1f} MiB packed, file {f.size / 2**20:.1f} MiB")
        print(f"built for: {ident.get('driver')} (vendor {ident.get('vendor_id')}, device {ident.get('device_id')})")
        for e in sorted(f.entries.values(), key=lambda e: e.offset):
            print(f"  {e.nbytes:>12}  {e.layout:<28} {e.key.split('|', 1)[0]}")
        return 0
    finally:
        f.close()


def add_parser(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="inspect, verify or clear a packed-weight cache file")
    cache.add_argument("action", choices=["info", "verify", "clear"])
    cache.add_argument("path")
    cache.set_defaults(fn=cmd_cache)
