"""README.md: every table of measured numbers is a generated block that names the command which
prints it (benchmarks/readme_tables.py regenerates them), so no table outlives the code."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_tables  # noqa: E402

DECIMAL = re.compile(r"(?<![\d.])\d+\.\d+(?![\d.])")  # 1.23, not a version such as 22.3.6
README_LINES = (ROOT / "README.md").read_text().splitlines()


def test_generated_blocks_pair_up_and_name_runnable_commands():
    found = readme_tables.blocks(README_LINES)
    assert found
    assert [p for p in map(readme_tables.check_command, (b.cmd for b in found)) if p] == []


def test_every_table_with_measured_numbers_is_generated():
    inside = set()
    for b in readme_tables.blocks(README_LINES):
        inside.update(range(b.start, b.end))
    stray = [f"README.md:{i + 1}: {line}" for i, line in enumerate(README_LINES)
             if line.startswith("|") and DECIMAL.search(line) and i not in inside]
    assert stray == []


def test_unpaired_markers_are_named():
    with pytest.raises(ValueError, match="README.md:2: generated block never closed"):
        readme_tables.blocks(["x", "<!-- generated: vkgraph info -->", "y"])
    with pytest.raises(ValueError, match="README.md:1: <!-- /generated --> without"):
        readme_tables.blocks(["<!-- /generated -->"])

