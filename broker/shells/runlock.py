"""Whether a daemon is attached to a run directory: an advisory lock its ``broker run`` holds.

``broker run`` holds an exclusive ``flock`` on ``RUN_DIR/daemon.lock`` for as long as it runs
(the file names its pid and host). The kernel drops the lock when the process ends, however it
ends (a clean exit, ``--on-stop leave``, ``kill -9``, a crash), so ``broker status`` can tell a
run that is being run from one that only its journal says is ``running``, and a second
``broker run`` on the same directory is refused instead of writing the same journal twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

LOCK_FILE = "daemon.lock"


class RunDirInUse(Exception):
    """Another process runs this run directory (its pid and host in ``holder``)."""

    def __init__(self, run_dir: Path, holder: dict[str, Any]) -> None:
        self.holder = holder
        who = f"pid {holder.get('pid', '?')}" + (f" on {holder['host']}" if holder.get("host") else "")
        super().__init__(f"{run_dir} is being run by another broker ({who}): watch it with `broker status "
                         f"{run_dir} --watch`; stop it with Ctrl-C in its terminal or `kill {holder.get('pid', '')}`")


@contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's daemon lock while the block runs; :class:`RunDirInUse` if taken."""
    path = Path(run_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUse(Path(run_dir), _read(path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": round(time.time(), 3)}).encode() + b"\n")
        yield
    finally:
        os.close(fd)  # releases the lock


def holder(run_dir: Path) -> dict[str, Any] | None:
    """Who runs ``run_dir`` now (``{"pid", "host", "since"}``), or None when no daemon is attached."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(path) or {"pid": None}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
