"""The README's walkthrough, line by line: each command there runs here and exits 0.

The lines are read from README.md itself (the indented block after "A walkthrough"), so the
README and this test cannot drift apart. They run in order in a scratch directory holding the
repository's ``inventory.yaml`` and ``examples/`` (a line may read what an earlier one wrote:
``broker status runs/demo`` reads the dry run's journal).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def walkthrough_lines(readme: Path = REPO / "README.md") -> list[str]:
    """The commands of the README's walkthrough block, in order."""
    text = readme.read_text(encoding="utf-8").splitlines()
    start = next(k for k, line in enumerate(text) if line.startswith("A walkthrough"))
    lines: list[str] = []
    for line in text[start + 1:]:
        if line.startswith("    "):
            lines.append(line.strip())
        elif lines:
            break  # the end of the indented block
    return lines


def test_the_walkthrough_block_is_found_and_is_all_broker_commands():
    lines = walkthrough_lines()
    assert len(lines) >= 5, lines
    assert all(line.startswith("broker ") for line in lines), lines


@pytest.mark.slow
def test_every_line_of_the_readme_walkthrough_exits_0(tmp_path):
    shutil.copy(REPO / "inventory.yaml", tmp_path / "inventory.yaml")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for line in walkthrough_lines():
        argv = shlex.split(line)
        done = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
