"""Attaches in the background with bounded concurrency, each abandoned by a stop meanwhile."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class AttachPool:
    """Runs ``attach()`` for a node on at most ``concurrency`` threads at once (a dry run's
    many instances booting together must not hold up the loop one after another), then calls
    ``done(client, None)`` or ``done(None, error)``. :meth:`abandon` (a stop meanwhile) makes
    it give up: an agent it started anyway is stopped with ``stop(node, client)``."""

    def __init__(self, concurrency: int, stop: Callable[[str, Any], None], name: str = "attach") -> None:
        self._concurrency, self._stop, self._name = concurrency, stop, name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._abandoned: set[str] = set()

    def abandon(self, node: str) -> None:
        with self._lock:
            self._abandoned.add(node)

    def _is_abandoned(self, node: str) -> bool:
        with self._lock:
            return node in self._abandoned

    def submit(self, node: str, attach: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        with self._lock:
            self._abandoned.discard(node)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix=self._name)

        def work() -> None:
            if self._is_abandoned(node):
                done(None, ConnectionAbortedError(f"{node} was released before its agent was started"))
                return
            try:
                client = attach()
            except Exception as exc:  # noqa: BLE001 - handed to the caller, which reports it
                done(None, exc)
                return
            if self._is_abandoned(node):  # released meanwhile: nobody may be left to take it
                self._stop(node, client)
                done(None, ConnectionAbortedError(f"{node} was released while its agent was being started"))
                return
            done(client, None)

        self._pool.submit(work)
