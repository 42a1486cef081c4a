"""Finding processes that tests leave behind.

The worker agent exports ``BROKER_AGENT_DIR=<its state dir>`` to every task it starts, so a
test can find every live (non-zombie) process an agent started by reading ``/proc``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def agent_task_processes(state_dirs: Path | Iterable[Path]) -> list[int]:
    """Pids of live processes started by the agents of ``state_dirs`` (one dir or several)."""
    dirs = [state_dirs] if isinstance(state_dirs, (str, Path)) else list(state_dirs)
    marks = [os.fsencode(f"BROKER_AGENT_DIR={d}") for d in dirs]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(mark in environ for mark in marks):
            found.append(int(entry.name))
    return found
