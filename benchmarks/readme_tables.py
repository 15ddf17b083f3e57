"""Regenerate the measured tables and outputs in README.md from the commands that print them.

Each generated block in the README names its command and holds what it printed:

    <!-- generated: python benchmarks/bench_load.py --model synthetic:256 -->
    ...stdout of that command...
    <!-- /generated -->

``<!-- generated console: CMD -->`` wraps the output as a console session (a fenced block
starting with ``$ CMD``). Commands run from the repository root with ``.venv/bin`` first on
PATH, one after the other (never two measurements at once). Prints numbers only; never fails on
a number. ``make readme-tables`` runs them all.

    .venv/bin/python benchmarks/readme_tables.py [--only TEXT] [--list] [--check]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OPEN = re.compile(r"^<!-- generated(?P<console> console)?: (?P<cmd>.+?) -->$")
CLOSE = "<!-- /generated -->"


@dataclass
class Block:
    cmd: str
    console: bool
    start: int  # line index of the opening marker
    end: int  # line index of the closing marker


def blocks(lines: list[str]) -> list[Block]:
    """The generated blocks of the README's ``lines``; ValueError naming the line when a marker
    is unpaired."""
    out, current = [], None
    for i, line in enumerate(lines):
        m = OPEN.match(line.strip())
        if m:
            if current is not None:
                raise ValueError(f"README.md:{i + 1}: generated block inside the one opened at line {current.start + 1}")
            current = Block(m["cmd"], bool(m["console"]), i, -1)
        elif line.strip() == CLOSE:
            if current is None:
                raise ValueError(f"README.md:{i + 1}: {CLOSE} without an opening marker")
            current.end = i
            out.append(current)
            current = None
    if current is not None:
        raise ValueError(f"README.md:{current.start + 1}: generated block never closed")
    return out


def check_command(cmd: str) -> str | None:
    """Why ``cmd`` cannot be run from the repository root, or None."""
    argv = shlex.split(cmd)
    if argv[0] == "vkgraph":
        return None
    if argv[0] == "python" and len(argv) > 1 and (ROOT / argv[1]).is_file():
        return None
    return f"{cmd!r}: neither `vkgraph ...` nor `python <script in the repository> ...`"


def run(block: Block) -> list[str]:
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(block.cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{block.cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    text = proc.stdout.strip("\n")
    if block.console:
        return ["```", f"$ {block.cmd}", *text.splitlines(), "```"]
    return text.splitlines()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="regenerate only the blocks whose command contains this text")
    ap.add_argument("--list", action="store_true", help="list the blocks' commands and stop")
    ap.add_argument("--check", action="store_true", help="check the markers and commands, run nothing")
    args = ap.parse_args()
    lines = README.read_text().splitlines()
    found = blocks(lines)
    problems = [p for p in (check_command(b.cmd) for b in found) if p]
    if args.check or args.list:
        for b in found:
            print(f"README.md:{b.start + 1}: {b.cmd}")
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    chosen = [b for b in found if not args.only or args.only in b.cmd]
    # replace from the end so that earlier line numbers stay valid
    for b in sorted(chosen, key=lambda b: b.start, reverse=True):
        t0 = time.perf_counter()
        print(f"running: {b.cmd}", file=sys.stderr, flush=True)
        new = run(b)
        lines[b.start + 1:b.end] = new
        README.write_text("\n".join(lines) + "\n")  # each block as soon as it is measured
        print(f"  {len(new)} lines, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
