"""The ``vkgraph`` command: one module per command, each with its ``add_parser(sub)``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, Sequence

from .. import __version__
from ..errors import VkGraphError
from ..runtime.device import ENV_DEVICE
from . import bench, cache, info, run, simulate, tune


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vkgraph", description="Load, run, benchmark, simulate and tune models on a "
                                "Vulkan device with staged prepack (a re-creation of ExecuTorch's Vulkan backend).")
    p.add_argument("--version", action="version", version=f"vkgraph {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (info, run, bench, tune, simulate, cache):
        command.add_parser(sub)
    for leaf in _commands(p):
        leaf.add_argument("--device", help="renderer (lavapipe, swiftshader), device-name substring or ICD json "
                          f"path; default ${ENV_DEVICE}, else the first device of the system's ICDs")
    return p


def _commands(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parsers of the commands that run (``bench load``, not ``bench``)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield p
    for a in subs:
        for child in dict.fromkeys(a.choices.values()):  # aliases map to the same parser
            yield from _commands(child)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # --device is $VKGRAPH_DEVICE for this command: every device it opens, and its child processes
    saved = os.environ.get(ENV_DEVICE)
    if args.device:
        os.environ[ENV_DEVICE] = args.device
    try:
        code = args.fn(args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # the reader went away (`vkgraph ... | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141  # 128 + SIGPIPE
    except (VkGraphError, ValueError, OSError) as exc:
        print(f"vkgraph: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if saved is None:
            os.environ.pop(ENV_DEVICE, None)
        else:
            os.environ[ENV_DEVICE] = saved


if __name__ == "__main__":
    sys.exit(main())
