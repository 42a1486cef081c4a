"""Everything the broker writes is private to its user, whatever the user's umask.

A run directory holds the journal (commands, the bag's environment masked but task output
tails in it), events, task outputs and the agents' state: ``broker`` runs every command
under umask 077 (:func:`private_files`, entered by ``broker.cli.main``), so each file it or
a library it calls creates is 0600 and each directory 0700; SQLite gives the ``-wal`` and
``-shm`` files of the journal the journal's own mode. Files copied in from elsewhere keep no
mode of their source (:func:`make_private`).

The user's own umask is handed on in ``BROKER_TASK_UMASK`` (octal): the local agents the
broker starts inherit it and give it back to the tasks they run (``workers/agent.py``), so a
task creates its files as it would have without the broker. Agents on other nodes keep the
umask of their SSH login for their tasks and create their own files 0600/0700 explicitly.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TASK_UMASK_ENV = "BROKER_TASK_UMASK"
PRIVATE_UMASK = 0o077


@contextmanager
def private_files() -> Iterator[None]:
    """Umask 077 for the block, the previous umask in ``BROKER_TASK_UMASK`` (unless set by an
    outer broker already); both restored after."""
    previous = os.umask(PRIVATE_UMASK)
    handed_on = os.environ.get(TASK_UMASK_ENV)
    if handed_on is None:
        os.environ[TASK_UMASK_ENV] = f"{previous:04o}"
    try:
        yield
    finally:
        os.umask(previous)
        if handed_on is None:
            os.environ.pop(TASK_UMASK_ENV, None)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p`` with every directory it creates 0700, and ``path`` itself made 0700."""
    path = Path(path)
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
    path.chmod(0o700)
    return path


def make_private(path: str | os.PathLike[str]) -> None:
    """Directories 0700 and files 0600 at and under ``path`` (links are left alone)."""
    path = Path(path)
    if path.is_symlink():
        return
    if path.is_dir():
        path.chmod(0o700)
        for root, dirs, files in os.walk(path):
            for name in dirs:
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o700)
            for name in files:
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o600)
    elif path.exists():
        path.chmod(0o600)
