"""The journal's write side: intents before actions, outcomes after, results in batches.

The run ledger (``broker/core/control/ledger/``) decides; the journal records what it
decided, durably, so a resume rebuilds the same state (``JournalReader.rows``). Nothing
here decides a task's fate: an unsuccessful attempt counts a failure and leaves the task
pending; giving it up is :meth:`Journal.quarantine`, called by the ledger's owner.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from broker.core.billing import Billing
from broker.core.control.causes import TaskState
from broker.core.model import Task

from .reader import JournalReader
from .results import FinishedBatch
from .schema import (GOAL_KINDS, GOAL_SINCE_PLAN, INSTANCE_STATES, TASK_CONTEXT, AttemptResult, JournalError,
                     RunRecord, _billing, _json, _json_or_null, file_sha256)

# A start's effect on its task (task_started, tasks_started): running, or sampling if drawn.
_STARTED = ("UPDATE tasks SET attempts = max(attempts, ?),"
            " state = CASE WHEN state IN ('pending', 'running', 'sampling')"
            "   THEN (CASE WHEN sample_order IS NULL THEN 'running' ELSE 'sampling' END) ELSE state END"
            " WHERE id = ?")


class _NotFresh(Exception):
    """tasks_started met a start already recorded, or an unknown task: taken one by one."""


class Journal(FinishedBatch, JournalReader):
    """A run's journal, read and written. Create with :meth:`open`; every method is one short
    transaction (or a savepoint inside :meth:`batch`)."""

    @classmethod
    def open(cls, run_dir: str | Path, *, readonly: bool = False, clock: Callable[[], float] = time.time,
             anchor_s: float = 0.0):
        """Open (creating it) ``run_dir/journal.sqlite`` for writing; with ``readonly``, a
        :class:`JournalReader`. ``clock`` and ``anchor_s``: the caller's time base
        (:mod:`.base`)."""
        if readonly:
            return JournalReader.open(run_dir, clock=clock, anchor_s=anchor_s)
        return cls._connect(run_dir, False, clock, anchor_s)

    # -- the run ---------------------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        *,
        goal_kind: str,
        goal_value: float | None = None,
        budget_usd: float | None = None,
        deadline_s: float | None = None,
        retries: int = 2,
        inventory_path: str | Path | None = None,
        bag_path: str | Path | None = None,
        options: Mapping[str, Any] | None = None,
        at_s: float | None = None,
        tasks: Iterable[Task] = (),
        task_context: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """Record the run's identity and goal, and its ``tasks``, in one transaction: a kill
        at any moment leaves either no run or a run with all its tasks. The input files are
        hashed for resume checks."""
        if goal_kind not in GOAL_KINDS:
            raise JournalError(f"goal kind must be one of {', '.join(GOAL_KINDS)}, got {goal_kind!r}")
        inv_hash = file_sha256(inventory_path) if inventory_path is not None else None
        bag_hash = file_sha256(bag_path) if bag_path is not None else None
        with self._durable() as db:
            existing = db.execute("SELECT id FROM run").fetchone()
            if existing is not None:
                raise JournalError(f"{self.path} already holds run {existing[0]!r}: resume it instead")
            db.execute(
                "INSERT INTO run (id, created_at, inventory_path, inventory_sha256, bag_path, bag_sha256,"
                " goal_kind, goal_value, budget_usd, deadline_s, retries, options)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    self._now(at_s),
                    None if inventory_path is None else str(inventory_path),
                    inv_hash,
                    None if bag_path is None else str(bag_path),
                    bag_hash,
                    goal_kind,
                    goal_value,
                    budget_usd,
                    deadline_s,
                    int(retries),
                    _json(dict(options or {})),
                ),
            )
            self._insert_tasks(db, tasks)
            if task_context is not None:
                self._set_meta(db, TASK_CONTEXT, _json(dict(task_context)))
        record = self.run()
        assert record is not None
        return record

    def finish_run(self, state: str, *, at_s: float | None = None) -> None:
        """Mark the run ``finished`` (bag done) or ``stopped`` (budget cap, user stop)."""
        if state not in ("finished", "stopped"):
            raise JournalError(f"a run ends 'finished' or 'stopped', not {state!r}")
        with self._durable() as db:
            changed = db.execute(
                "UPDATE run SET state = ?, ended_at = ? WHERE state = 'running'", (state, self._now(at_s))
            ).rowcount
            if not changed and db.execute("SELECT 1 FROM run").fetchone() is None:
                raise JournalError("no run recorded in this journal")

    # -- tasks -----------------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[Task]) -> int:
        """Insert the bag's tasks in one transaction; returns how many were added.

        A task id already present is an error (the whole batch is rolled back).
        """
        with self._write() as db:
            return self._insert_tasks(db, tasks)

    @staticmethod
    def _insert_tasks(db: sqlite3.Connection, tasks: Iterable[Task]) -> int:
        rows = ((t.id, t.command, _json_or_null(t.params), _json_or_null(t.estimates_s)) for t in tasks)
        try:
            cur = db.executemany("INSERT INTO tasks (id, command, params, estimates) VALUES (?, ?, ?, ?)", rows)
            return cur.rowcount
        except sqlite3.IntegrityError as exc:
            raise JournalError(f"task ids must be unique within a run: {exc}") from exc

    def apply_bag_edit(self, *, drop: Iterable[str], add: Iterable[Task], task_context: Mapping[str, Any],
                       bag_path: str | Path, reason: str, at_s: float | None = None) -> None:
        """A resume's edited bag, in one step: the tasks no longer in it are ``dropped`` (their
        rows and attempts stay, with what they were in the note; an attempt still running is
        cancelled), the new ones added, and the bag's file and context recorded for the next
        resume."""
        now = self._now(at_s)
        with self._write() as db:
            for task_id in drop:
                row = db.execute("SELECT state, done_attempt FROM tasks WHERE id = ?", (task_id,)).fetchone()
                if row is None or row[0] == TaskState.DROPPED:
                    continue
                was = row[0] + (f", attempt {row[1]} counted" if row[1] is not None else "")
                db.execute("UPDATE attempts SET outcome = 'cancelled', ended_at = ?, error = ?"
                           " WHERE task_id = ? AND outcome = 'running'", (now, reason, task_id))
                db.execute("UPDATE tasks SET state = 'dropped', done_attempt = NULL, note = ? WHERE id = ?",
                           (f"{reason} (was {was})", task_id))
            self._insert_tasks(db, add)
            self._set_meta(db, TASK_CONTEXT, _json(dict(task_context)))
            db.execute("UPDATE run SET bag_path = ?, bag_sha256 = ?", (str(bag_path), file_sha256(bag_path)))

    def change_goal(self, *, goal_kind: str, goal_value: float | None, budget_usd: float | None,
                    deadline_s: float | None) -> None:
        """A resume with another goal: the run's goal becomes it, and the promise (the first
        plan, :meth:`first_plan`) is the first plan made from now on."""
        if goal_kind not in GOAL_KINDS:
            raise JournalError(f"goal kind must be one of {', '.join(GOAL_KINDS)}, got {goal_kind!r}")
        with self._write() as db:
            db.execute("UPDATE run SET goal_kind = ?, goal_value = ?, budget_usd = ?, deadline_s = ?",
                       (goal_kind, goal_value, budget_usd, deadline_s))
            last = db.execute("SELECT coalesce(max(seq), 0) FROM plans").fetchone()[0]
            self._set_meta(db, GOAL_SINCE_PLAN, str(last))

    @staticmethod
    def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def set_estimates(self, estimates_s: Iterable[tuple[str, float | None]]) -> None:
        """Store the daemon's current estimate (reference seconds) of each given task."""
        with self._write() as db:
            db.executemany("UPDATE tasks SET estimate_s = ? WHERE id = ?", ((e, t) for t, e in estimates_s))

    def record_sample_draws(self, task_ids: Iterable[str]) -> list[int]:
        """Mark tasks as drawn for sampling, numbering them in the order given (after any
        earlier draws). Returns their draw orders. Results are read in this order (2.1)."""
        with self._write() as db:
            order = db.execute("SELECT coalesce(max(sample_order), 0) FROM tasks WHERE sample_order IS NOT NULL"
                               ).fetchone()[0]  # (WHERE: the partial index answers; without, 1.1 ms a call at 20k tasks)
            orders = []
            for task_id in task_ids:
                order += 1
                cur = db.execute("UPDATE tasks SET sample_order = ? WHERE id = ? AND sample_order IS NULL",
                                 (order, task_id))
                if cur.rowcount != 1:
                    raise JournalError(f"task {task_id!r} is unknown or was already drawn as a sample")
                orders.append(order)
            return orders

    def task_started(
        self, task_id: str, attempt: int, node: str, *, at_s: float | None = None
    ) -> bool:
        """Record that ``attempt`` of ``task_id`` started on ``node``.

        Returns False, changing nothing, when that (task, attempt) was already recorded (a
        replayed message). A second attempt while one runs is a replica: it is recorded and
        the task stays running. A start for a task already closed (done, failed, quarantined,
        cancelled: a late message) is recorded without touching the task; should that
        attempt succeed, the task becomes done.
        """
        with self._write() as db:
            try:  # an unknown task fails the attempts' foreign key
                cur = db.execute(
                    "INSERT INTO attempts (task_id, attempt, node, started_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (task_id, attempt) DO NOTHING",
                    (task_id, int(attempt), node, self._now(at_s)),
                )
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" in str(exc):
                    raise JournalError(f"unknown task {task_id!r}") from exc
                raise JournalError(f"attempt {attempt!r} of task {task_id!r} refused: {exc}") from exc
            if cur.rowcount != 1:
                return False
            db.execute(_STARTED, (int(attempt), task_id))
            return True

    def tasks_started(self, starts: list[tuple[str, int, str]], *, at_s: float | None = None) -> None:
        """:meth:`task_started` for each ``(task, attempt, node)``, at one time, in one statement
        of each kind (a turn's starts); all or nothing. A start already recorded (a replay) or
        an unknown task: each is taken alone, by :meth:`task_started`."""
        if len(starts) < 2:
            for task_id, attempt, node in starts:
                self.task_started(task_id, attempt, node, at_s=at_s)
            return
        now = self._now(at_s)
        try:
            with self._write() as db:
                try:
                    cur = db.executemany(
                        "INSERT INTO attempts (task_id, attempt, node, started_at) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (task_id, attempt) DO NOTHING",
                        [(task_id, int(attempt), node, now) for task_id, attempt, node in starts])
                except sqlite3.IntegrityError as exc:
                    raise _NotFresh from exc
                if cur.rowcount != len(starts):
                    raise _NotFresh
                db.executemany(_STARTED, [(int(attempt), task_id) for task_id, attempt, _node in starts])
        except _NotFresh:  # rolled back: one by one, with task_started's rules
            for task_id, attempt, node in starts:
                self.task_started(task_id, attempt, node, at_s=at_s)

    def task_finished(
        self, task_id: str, attempt: int, result: AttemptResult, *, node: str | None = None,
        at_s: float | None = None,
    ) -> bool:
        """Record the result of one attempt, exactly once.

        Returns False, changing nothing, when that attempt already has a result (a replay).
        A successful result makes the task done unless another attempt already did (a
        replica: the attempt is recorded, the task is not counted twice). An unsuccessful
        one counts a failure and, when no other attempt of the task is running, sends the
        task back to pending (whether it is retried or given up is the caller's decision:
        :meth:`quarantine`). A result for an attempt whose
        start was never recorded (the daemon crashed in between) is accepted; ``node`` then
        names where it ran.
        """
        now = self._now(at_s)
        with self._write() as db:
            known, outcome = db.execute(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?),"
                " (SELECT outcome FROM attempts WHERE task_id = ? AND attempt = ?)", (task_id, task_id, int(attempt))
            ).fetchone()
            if not known:
                raise JournalError(f"unknown task {task_id!r}")
            if outcome is not None and outcome != "running":
                return False
            fields = (
                now, result.outcome, result.exit_code, result.runtime_s, int(result.timed_out),
                result.stdout_tail, result.stderr_tail, result.error,
            )
            if outcome is None:  # no such attempt (outcome is NOT NULL in a row)
                db.execute(
                    "INSERT INTO attempts (task_id, attempt, node, ended_at, outcome, exit_code, runtime_s,"
                    " timed_out, stdout_tail, stderr_tail, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (task_id, int(attempt), node or "unknown") + fields,
                )
                db.execute(
                    "UPDATE tasks SET attempts = max(attempts, ?) WHERE id = ?", (int(attempt), task_id)
                )
            else:
                db.execute(
                    "UPDATE attempts SET ended_at = ?, outcome = ?, exit_code = ?, runtime_s = ?,"
                    " timed_out = ?, stdout_tail = ?, stderr_tail = ?, error = ?"
                    " WHERE task_id = ? AND attempt = ?",
                    fields + (task_id, int(attempt)),
                )
            if result.ok:
                db.execute(
                    "UPDATE tasks SET state = 'done', done_attempt = ?, note = NULL"
                    " WHERE id = ? AND state <> 'done'",
                    (int(attempt), task_id),
                )
            else:
                self._count_failure(db, task_id, result.error or result.outcome)
            return True

    def task_failed(
        self, task_id: str, attempt: int, error: str, *, node: str | None = None, at_s: float | None = None
    ) -> bool:
        """An attempt ended without a result (could not start, agent error). Same rules as
        an unsuccessful :meth:`task_finished`."""
        return self.task_finished(
            task_id, attempt, AttemptResult(exit_code=None, runtime_s=None, error=error), node=node, at_s=at_s
        )

    def attempt_lost(self, task_id: str, attempt: int, reason: str, *, at_s: float | None = None,
                     interrupted: bool = False) -> bool:
        """A running attempt vanished with its agent or node (``lost``; ``interrupted``: with
        its spot instance, or stopped at the notice): no failure of the task (``failures`` is
        unchanged), which goes back to pending unless another attempt runs.
        False when it was not running."""
        with self._write() as db:
            cur = db.execute(
                "UPDATE attempts SET outcome = ?, ended_at = ?, error = ?"
                " WHERE task_id = ? AND attempt = ? AND outcome = 'running'",
                ("interrupted" if interrupted else "lost", self._now(at_s), reason, task_id, int(attempt)),
            )
            if cur.rowcount != 1:
                return False
            self._count_failure(db, task_id, reason, failures=0)
            return True

    def attempt_cancelled(self, task_id: str, attempt: int, *, at_s: float | None = None) -> bool:
        """A running attempt was cancelled on purpose (the losing replica, a budget stop).

        It counts as no failure; a task left with no running attempt and not done goes back
        to pending. Returns False when the attempt was not running.
        """
        with self._write() as db:
            cur = db.execute(
                "UPDATE attempts SET outcome = 'cancelled', ended_at = ?"
                " WHERE task_id = ? AND attempt = ? AND outcome = 'running'",
                (self._now(at_s), task_id, int(attempt)),
            )
            if cur.rowcount != 1:
                return False
            self._settle(db, task_id)
            return True

    def requeue_running(self, node: str, *, at_s: float | None = None) -> list[str]:
        """A node was lost: end its running attempts as ``lost`` (no failure) and send
        their tasks back to pending unless another attempt still runs or the task is settled.
        Returns the ids of the tasks now pending; their next start carries attempt
        ``attempts + 1`` (see :meth:`pending_tasks`)."""
        now = self._now(at_s)
        with self._write() as db:
            task_ids = [
                r[0]
                for r in db.execute(
                    "SELECT task_id FROM attempts WHERE node = ? AND outcome = 'running' ORDER BY task_id",
                    (node,),
                )
            ]
            db.execute(
                "UPDATE attempts SET outcome = 'lost', ended_at = ?, error = 'node lost'"
                " WHERE node = ? AND outcome = 'running'",
                (now, node),
            )
            requeued = []
            for task_id in dict.fromkeys(task_ids):  # a lost attempt is no failure of its task
                if self._count_failure(db, task_id, f"node {node} lost", 0) == TaskState.PENDING:
                    requeued.append(task_id)
            return requeued

    def quarantine(self, task_id: str, reason: str) -> bool:
        """Stop retrying a task that is poison (kills its nodes, fails everywhere). Counted
        as failed. Returns False when the task is already done or quarantined."""
        with self._write() as db:
            self._require_task(db, task_id)
            cur = db.execute(
                "UPDATE tasks SET state = 'quarantined', note = ?"
                " WHERE id = ? AND state NOT IN ('done', 'quarantined')",
                (reason, task_id),
            )
            return cur.rowcount == 1

    def cancel_pending(self, task_ids: Iterable[str], reason: str) -> int:
        """Give up on tasks that have not started (a budget stop); returns how many."""
        with self._write() as db:
            cur = db.executemany(
                "UPDATE tasks SET state = 'cancelled', note = ? WHERE id = ? AND state = 'pending'",
                ((reason, t) for t in task_ids),
            )
            return cur.rowcount

    @staticmethod
    def _require_task(db: sqlite3.Connection, task_id: str) -> None:
        if db.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone() is None:
            raise JournalError(f"unknown task {task_id!r}")

    def _count_failure(self, db: sqlite3.Connection, task_id: str, note: str, failures: int = 1) -> str:
        db.execute(
            "UPDATE tasks SET failures = failures + ?, note = ? WHERE id = ? AND state <> 'done'",
            (failures, note, task_id),
        )
        return self._settle(db, task_id)

    @staticmethod
    def _settle(db: sqlite3.Connection, task_id: str) -> str:
        """After an attempt ended without success: the task's state. A task still running
        with no attempt left running is pending again; whether it is retried or given up is
        not the journal's to decide (the run ledger does, and calls :meth:`quarantine`)."""
        db.execute(
            "UPDATE tasks SET state = 'pending'"
            " WHERE id = ? AND state IN ('running', 'sampling')"
            " AND NOT EXISTS (SELECT 1 FROM attempts WHERE task_id = ? AND outcome = 'running')",
            (task_id, task_id),
        )
        return db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]

    # -- the intent/outcome log -------------------------------------------------------------
    def intend(self, kind: str, payload: Any, cause: str, *, at_s: float | None = None) -> int:
        """Write an intent before carrying out an action; returns its id (``seq``).

        Durable when this returns (fsynced, with everything written before it), inside a
        :meth:`group` too: the action it guards may be carried out at once. Inside a
        :meth:`batch` it is part of the batch (see there)."""
        with self._durable() as db:
            cur = db.execute(
                "INSERT INTO actions (kind, payload, cause, created_at) VALUES (?, ?, ?, ?)",
                (kind, _json(payload), cause, self._now(at_s)),
            )
            return int(cur.lastrowid)  # type: ignore[arg-type]

    def complete(self, action_id: int, outcome: Any = None, *, at_s: float | None = None) -> bool:
        """Record that an intended action was carried out. False if it was already closed."""
        return self._close_action(action_id, "done", outcome, at_s)

    def fail(self, action_id: int, error: str, *, at_s: float | None = None) -> bool:
        """Record that an intended action failed. False if it was already closed."""
        return self._close_action(action_id, "failed", {"error": error}, at_s)

    def _close_action(self, action_id: int, state: str, outcome: Any, at_s: float | None) -> bool:
        with self._write() as db:
            cur = db.execute(
                "UPDATE actions SET state = ?, outcome = ?, completed_at = ?"
                " WHERE seq = ? AND state = 'intended'",
                (state, _json(outcome), self._now(at_s), int(action_id)),
            )
            if cur.rowcount == 1:
                return True
            if db.execute("SELECT 1 FROM actions WHERE seq = ?", (int(action_id),)).fetchone() is None:
                raise JournalError(f"no action {action_id} in the journal")
            return False

    # -- instances and nodes -----------------------------------------------------------------
    def record_launch(
        self,
        instance_id: str,
        type_name: str,
        *,
        launched_at_s: float,
        price_per_hour: float,
        billing: Billing,
        client_token: str | None = None,
        state: str = "pending",
        release_at_s: float | None = None,
        action_seq: int | None = None,
    ) -> bool:
        """Record an instance EC2 launched (or a stray adopted at reconciliation).

        ``launched_at_s`` should be EC2's LaunchTime so that billing matches the invoice.
        ``client_token`` is unique per instance: give each instance of a Launch its own
        token. Returns False when the instance was already recorded.
        """
        self._check_instance_state(state)
        launched = self._now(launched_at_s)
        paid_until = billing.paid_until(launched, launched)
        release = None if release_at_s is None else self._now(release_at_s)
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO instances (id, type, state, launched_at, paid_until, release_at, client_token,"
                " price_per_hour, billing_unit_s, billing_minimum_s, action_seq)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    instance_id, type_name, state, launched, paid_until, release,
                    client_token, float(price_per_hour), billing.unit_s, billing.minimum_s, action_seq,
                ),
            )
            return cur.rowcount == 1

    def record_instance_state(
        self, instance_id: str, state: str, *, at_s: float | None = None, ready_at_s: float | None = None
    ) -> bool:
        """Record an instance's new state. ``terminated`` is final: later states are ignored
        (a stale describe). ``running`` sets ``ready_at`` (``ready_at_s`` or the time) if unset.
        Returns True when something changed."""
        self._check_instance_state(state)
        now = self._now(at_s)
        with self._write() as db:
            row = db.execute(
                "SELECT state, launched_at, billing_unit_s, billing_minimum_s FROM instances WHERE id = ?",
                (instance_id,),
            ).fetchone()
            if row is None:
                raise JournalError(f"unknown instance {instance_id!r}: record its launch first")
            old_state, launched_at, unit_s, minimum_s = row
            if old_state == "terminated":
                return False
            paid_until = _billing(unit_s, minimum_s).paid_until(launched_at, now)
            ready_at = self._now(ready_at_s) if ready_at_s is not None else (now if state == "running" else None)
            db.execute(
                "UPDATE instances SET state = ?, paid_until = ?, ready_at = coalesce(ready_at, ?),"
                " terminated_at = CASE WHEN ? = 'terminated' THEN ? ELSE NULL END WHERE id = ?",
                (state, paid_until, ready_at, state, now, instance_id),
            )
            return state != old_state

    def mark_interrupted(self, instance_id: str) -> bool:
        """EC2 took the spot instance back: it is charged only for what ran (its committed
        cost, and a resumed ledger's, count it so). False if unknown or marked already."""
        with self._write() as db:
            cur = db.execute("UPDATE instances SET interrupted = 1 WHERE id = ? AND interrupted = 0", (instance_id,))
            return cur.rowcount == 1

    def set_release(self, instance_id: str, release_at_s: float | None) -> bool:
        """Schedule (or, with None, cancel) an instance's release. False if it is terminated."""
        stored = None if release_at_s is None else self._now(release_at_s)
        with self._write() as db:
            cur = db.execute(
                "UPDATE instances SET release_at = ? WHERE id = ? AND state <> 'terminated'",
                (stored, instance_id),
            )
            known = db.execute("SELECT 1 FROM instances WHERE id = ?", (instance_id,)).fetchone()
            if known is None:
                raise JournalError(f"unknown instance {instance_id!r}")
            return cur.rowcount == 1

    @staticmethod
    def _check_instance_state(state: str) -> None:
        if state not in INSTANCE_STATES:
            raise JournalError(f"instance state must be one of {', '.join(INSTANCE_STATES)}, got {state!r}")

    def record_private_node(
        self,
        name: str,
        *,
        slots: int,
        speed: float = 1.0,
        cost_per_hour: float = 0.0,
        at_s: float | None = None,
    ) -> bool:
        """A private node joined the run; its cost accrues from now to the run's end."""
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO private_nodes (name, slots, speed, cost_per_hour, joined_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                (name, int(slots), float(speed), float(cost_per_hour), self._now(at_s)),
            )
            return cur.rowcount == 1

    def record_heard(self, heard_at_s: Mapping[str, float]) -> None:
        """When the broker last heard from each of these nodes' agents (run seconds)."""
        if not heard_at_s:
            return
        with self._write() as db:
            db.executemany("INSERT INTO node_heard (node, at) VALUES (?, ?)"
                           " ON CONFLICT (node) DO UPDATE SET at = max(at, excluded.at)",
                           [(node, self._now(at)) for node, at in heard_at_s.items()])

    def record_plan(
        self,
        *,
        makespan_s: float | None,
        cost_usd: float | None,
        fleet: Any,
        chosen: Any,
        reason: str,
        confidence: float | None = None,
        at_s: float | None = None,
    ) -> int:
        """Store a plan the daemon adopted. ``makespan_s`` is the predicted makespan measured
        from the run's start (ALGORITHMS.md 1), so its ETA is ``run start + makespan_s``."""
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO plans (created_at, makespan_s, cost_usd, confidence, fleet, chosen, reason)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self._now(at_s), makespan_s, cost_usd, confidence, _json(fleet), _json(chosen), reason),
            )
            return int(cur.lastrowid)  # type: ignore[arg-type]

    def record_event(self, name: str, fields: Mapping[str, Any] | str, *, at_s: float | None = None) -> None:
        """Store an event; ``fields`` is a mapping, or already its JSON (the log's one encoding of
        it: :func:`broker.shells.logging.write_event`). Inside a transaction, with its others in
        one statement before it commits (:meth:`_flush_events`)."""
        row = (self._now(at_s), name, fields if isinstance(fields, str) else _json(dict(fields)))
        with self._lock:
            if self._in_batch:
                return self._events.append(row)
            with self._write(one_statement=True) as db:
                db.execute("INSERT INTO events (at, name, fields) VALUES (?, ?, ?)", row)
