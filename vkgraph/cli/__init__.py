"""The ``vkgraph`` command: one module per command, each with its ``add_parser(sub)``."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import __version__
from ..errors import VkGraphError
from . import bench, cache, info, run, simulate, tune


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vkgraph", description="Load, run, benchmark, simulate and tune models on a "
                                "Vulkan device with staged prepack (a re-creation of ExecuTorch's Vulkan backend).")
    p.add_argument("--version", action="version", version=f"vkgraph {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (info, run, bench, tune, simulate, cache):
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (VkGraphError, ValueError, OSError) as exc:
        print(f"vkgraph: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
