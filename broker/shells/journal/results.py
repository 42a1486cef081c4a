"""A turn's successful results in a few statements: :meth:`FinishedBatch.tasks_finished`.

The daemon's loop records each result it accepts; one at a time (:meth:`Journal.task_finished`)
that is a savepoint, a look-up and two updates, about six statements a task, the largest part
of the loop's CPU per no-op task (bench/bench_daemon.py). A turn's successful results whose
attempts are running, as nearly all are, go in two ``executemany`` instead; anything else (a
replay, an attempt never journaled as started, a failure) takes the one-at-a-time path with
its rules. Same rows, same transaction (the turn's group): a crash loses or keeps them all.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .schema import AttemptResult

_FINISHED = ("UPDATE attempts SET ended_at = ?, outcome = ?, exit_code = ?, runtime_s = ?, timed_out = ?,"
             " stdout_tail = ?, stderr_tail = ?, error = ? WHERE task_id = ? AND attempt = ? AND outcome = 'running'")
_DONE = "UPDATE tasks SET state = 'done', done_attempt = ?, note = NULL WHERE id = ? AND state <> 'done'"


class _NotRunning(Exception):
    pass


class FinishedBatch:
    """Part of :class:`~broker.shells.journal.writer.Journal` (its ``_write``, ``_now`` and
    ``task_finished``)."""

    def tasks_finished(self, results: list[tuple[str, int, AttemptResult, str | None, float | None]]) -> None:
        """:meth:`task_finished` for each ``(task, attempt, result, node, at_s)``; all or nothing.
        In two statements when every result is a success of a running attempt, else each one
        by :meth:`task_finished` and its rules."""
        self_: Any = self
        if len(results) < 2 or not all(r.ok for _t, _a, r, _n, _at in results):
            self._one_by_one(results)
            return
        try:
            with self_._write() as db:
                cur = db.executemany(_FINISHED, [
                    (self_._now(at_s), r.outcome, r.exit_code, r.runtime_s, int(r.timed_out), r.stdout_tail,
                     r.stderr_tail, r.error, task_id, int(attempt)) for task_id, attempt, r, _node, at_s in results])
                if cur.rowcount != len(results):
                    raise _NotRunning  # rolled back (the call's savepoint)
                db.executemany(_DONE, [(int(attempt), task_id) for task_id, attempt, _r, _n, _at in results])
        except (_NotRunning, sqlite3.IntegrityError):
            self._one_by_one(results)

    def _one_by_one(self, results: list[tuple[str, int, AttemptResult, str | None, float | None]]) -> None:
        for task_id, attempt, result, node, at_s in results:
            self.task_finished(task_id, attempt, result, node=node, at_s=at_s)  # type: ignore[attr-defined]
