"""Running out of disk in the run directory: one error type, one message, nothing torn.

A full disk (``ENOSPC``, a quota's ``EDQUOT``, a file-size limit's ``EFBIG``, SQLite's
``SQLITE_FULL``) is reported as ``disk full in <dir>: ...`` by whatever noticed it: the
journal (whose failed transaction is rolled back, so every commit before it stays), the
``events.jsonl`` sink (whose torn last line is cut off), and the CLI, which exits with
status 1 and that message.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DiskFull(RuntimeError):
    """A write in ``directory`` failed because the disk (or a quota or size limit) is full."""

    def __init__(self, directory: str | Path, detail: str) -> None:
        self.directory = str(directory)
        super().__init__(f"disk full in {directory}: {detail}")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an OS or SQLite error meaning "no space left"."""
    if isinstance(exc, DiskFull):
        return True
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return False
