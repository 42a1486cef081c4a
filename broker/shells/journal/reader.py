"""The journal's read side: what ``broker status``, ``report``, the metrics endpoint, ``down``
and a resuming daemon read. Every call is one consistent snapshot (one read transaction),
so the counts it returns always add up; nothing here writes."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from broker.core.control.causes import TaskState
from broker.core.control.ledger import AttemptRow, InstanceRow, JournalRows, TaskRow

from .base import JournalBase
from .schema import (
    GOAL_SINCE_PLAN,
    TASK_CONTEXT,
    TASK_STATES,
    ActionRecord,
    InstanceRecord,
    Intent,
    Overview,
    PendingTask,
    PlanRecord,
    RunningAttempt,
    RunRecord,
    _billing,
)

_PLAN_COLUMNS = "seq, created_at, makespan_s, cost_usd, confidence, fleet, chosen, reason"


class JournalReader(JournalBase):
    """A run's journal, read only. Open with :meth:`open`."""

    @classmethod
    def open(cls, run_dir: str | Path, *, readonly: bool = True, clock: Callable[[], float] = time.time,
             anchor_s: float = 0.0):
        """Open ``run_dir/journal.sqlite`` read-only (SQLite's ``mode=ro``: it can be read while
        the daemon writes). Raises :class:`JournalNotFound` when there is no journal,
        :class:`JournalError` when the file is not a journal or was written by a newer broker."""
        return cls._connect(run_dir, readonly, clock, anchor_s)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> RunRecord | None:
        with self._read() as db:
            return self._run_row(db)

    def _run_row(self, db: sqlite3.Connection) -> RunRecord | None:
        row = db.execute(
            "SELECT id, created_at, ended_at, state, goal_kind, goal_value, budget_usd, deadline_s,"
            " retries, options, inventory_path, inventory_sha256, bag_path, bag_sha256 FROM run"
        ).fetchone()
        if row is None:
            return None
        return RunRecord(row[0], self._out(row[1]), self._out(row[2]), *row[3:9], json.loads(row[9]),  # type: ignore[misc]
                         *row[10:])

    # -- the bag a resume matches an edited bag against -------------------------------------
    def meta(self, key: str) -> str | None:
        with self._read() as db:
            return self._meta(db, key)

    @staticmethod
    def _meta(db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def task_context(self) -> dict[str, Any] | None:
        """What the bag's tasks ran with besides their command (``env``, ``workdir``, ``setup``),
        as recorded when the run started or its bag was last edited; None in a journal written
        before it was recorded."""
        text = self.meta(TASK_CONTEXT)
        return None if text is None else json.loads(text)

    def live_tasks(self) -> list[tuple[str, str, str]]:
        """``(id, command, state)`` of every task of the bag (not dropped), in bag order."""
        with self._read() as db:
            return db.execute("SELECT id, command, state FROM tasks WHERE state <> 'dropped' ORDER BY rowid").fetchall()

    def task_ids(self) -> set[str]:
        """Every task id the journal holds, dropped ones included (ids are never reused)."""
        with self._read() as db:
            return {r[0] for r in db.execute("SELECT id FROM tasks")}

    def private_node_costs(self) -> dict[str, float]:
        """Each private node the run has had, with the cost per hour it is billed at."""
        with self._read() as db:
            return dict(db.execute("SELECT name, cost_per_hour FROM private_nodes"))

    # -- tasks and attempts ----------------------------------------------------------------
    def pending_tasks(self) -> list[PendingTask]:
        """Tasks waiting for a slot, in bag order; ``next_attempt`` is the number their next
        start carries."""
        with self._read() as db:
            return [PendingTask(*row) for row in db.execute(
                "SELECT id, command, estimate_s, attempts + 1, sample_order FROM tasks"
                " WHERE state = 'pending' ORDER BY rowid")]

    def running_attempts(self) -> list[RunningAttempt]:
        """Attempts started and not ended."""
        with self._read() as db:
            return [RunningAttempt(t, a, n, self._out(s)) for t, a, n, s in db.execute(
                "SELECT task_id, attempt, node, started_at FROM attempts WHERE outcome = 'running' ORDER BY id")]

    def rows(self) -> JournalRows:
        """Every task, attempt and instance as the run ledger rebuilds a run from them
        (:func:`broker.core.control.ledger.restore`), in one snapshot, times in the caller's
        seconds."""
        with self._read() as db:
            run = self._run_row(db)
            tasks = [TaskRow(*row) for row in db.execute(
                "SELECT id, state, attempts, failures, done_attempt, sample_order, note FROM tasks"
                " WHERE state <> 'dropped' ORDER BY rowid")]  # dropped: no longer the bag's
            attempts = [
                AttemptRow(t, a, node, self._out(start), self._out(end), outcome, runtime, code, bool(timed), error)
                for t, a, node, start, end, outcome, runtime, code, timed, error in db.execute(
                    "SELECT task_id, attempt, node, started_at, ended_at, outcome, runtime_s, exit_code, timed_out,"
                    " error FROM attempts ORDER BY id")]
            instances = [InstanceRow(r.id, r.type_name, r.state, r.launched_at_s, r.ready_at_s, r.release_at_s,
                                     r.terminated_at_s, r.interrupted) for r in self._instance_rows(db, self._now(None))]
        scale = float(run.options.get("time_scale", 1.0)) if run is not None else 1.0
        return JournalRows(tuple(tasks), tuple(attempts), tuple(instances), scale)

    # -- the intent/outcome log -------------------------------------------------------------
    def pending_intents(self) -> list[Intent]:
        """Actions intended but never completed nor failed, oldest first (for resume)."""
        with self._read() as db:
            return [Intent(seq, kind, json.loads(payload), cause, self._out(created))
                    for seq, kind, payload, cause, created in db.execute(
                        "SELECT seq, kind, payload, cause, created_at FROM actions"
                        " WHERE state = 'intended' ORDER BY seq")]

    def actions(self, kind: str | None = None) -> list[ActionRecord]:
        """Every action of the intent/outcome log (optionally one kind), oldest first."""
        query = "SELECT seq, kind, payload, cause, state, created_at FROM actions"
        args: tuple[Any, ...] = ()
        if kind is not None:
            query, args = query + " WHERE kind = ?", (kind,)
        with self._read() as db:
            return [ActionRecord(seq, k, json.loads(payload), cause, state, self._out(created))
                    for seq, k, payload, cause, state, created in db.execute(query + " ORDER BY seq", args)]

    # -- instances and spend -----------------------------------------------------------------
    def instances(self, now_s: float | None = None) -> list[InstanceRecord]:
        """Every instance; ``paid_until_s`` as of ``now_s``."""
        now = self._now(now_s)
        with self._read() as db:
            return self._instance_rows(db, now)

    def _instance_rows(self, db: sqlite3.Connection, now_stored: float) -> list[InstanceRecord]:
        records = []
        out = self._out
        for row in db.execute(
            "SELECT id, type, state, launched_at, ready_at, paid_until, release_at, terminated_at,"
            " price_per_hour, billing_unit_s, billing_minimum_s, client_token,"
            f" {'interrupted' if self._has_interrupted else '0'} FROM instances ORDER BY launched_at, id"
        ):
            (iid, type_name, state, launched, ready, paid_until, release, terminated,
             price, unit_s, minimum_s, token, interrupted) = row
            billing = _billing(unit_s, minimum_s)
            if terminated is None:
                paid_until = billing.paid_until(launched, max(now_stored, launched))
            records.append(InstanceRecord(iid, type_name, state, out(launched), out(ready), out(paid_until),
                                          out(release), out(terminated), price, billing, token, bool(interrupted)))
        return records

    def committed_usd(self, now_s: float | None = None) -> float:
        """Committed spend at ``now_s``: instances' charged units plus private nodes' cost so
        far (package docstring)."""
        now = self._now(now_s)
        with self._read() as db:
            return self._committed(db, now)

    def _committed(self, db: sqlite3.Connection, now_stored: float) -> float:
        now_s = self._out(now_stored)
        instances_usd = sum(r.committed_usd(now_s) for r in self._instance_rows(db, now_stored))
        ended = db.execute("SELECT ended_at FROM run").fetchone()
        until = now_stored if ended is None or ended[0] is None else min(now_stored, ended[0])
        private_usd = db.execute(
            "SELECT coalesce(sum(cost_per_hour * max(0.0, ? - joined_at)), 0.0) FROM private_nodes", (until,)
        ).fetchone()[0] / 3600.0
        return instances_usd + private_usd

    # -- plans and events ------------------------------------------------------------------
    def latest_time_s(self) -> float | None:
        """The latest time anything was written at (events, actions, attempts), or None."""
        with self._read() as db:
            row = db.execute(
                "SELECT max(coalesce((SELECT max(at) FROM events), -1e300),"
                " coalesce((SELECT max(max(created_at, coalesce(completed_at, created_at))) FROM actions), -1e300),"
                " coalesce((SELECT max(coalesce(ended_at, started_at)) FROM attempts), -1e300))"
            ).fetchone()
        return None if row is None or row[0] is None or row[0] < -1e299 else self._out(float(row[0]))

    def _plan(self, row) -> PlanRecord | None:
        if row is None:
            return None
        seq, created, makespan, cost, confidence, fleet, chosen, reason = row
        return PlanRecord(seq, self._out(created), makespan, cost, confidence, json.loads(fleet), json.loads(chosen),
                          reason)

    def first_plan(self) -> PlanRecord | None:
        """The run's first adopted plan (what a resumed run reports its delivery against); after
        a resume that changed the goal, the first plan made for the new goal."""
        with self._read() as db:
            since = self._meta(db, GOAL_SINCE_PLAN)
            return self._plan(db.execute(f"SELECT {_PLAN_COLUMNS} FROM plans WHERE seq > ? ORDER BY seq LIMIT 1",
                                         (int(since or 0),)).fetchone())

    def last_plan(self) -> PlanRecord | None:
        with self._read() as db:
            return self._last_plan(db)

    def _last_plan(self, db: sqlite3.Connection) -> PlanRecord | None:
        return self._plan(db.execute(f"SELECT {_PLAN_COLUMNS} FROM plans ORDER BY seq DESC LIMIT 1").fetchone())

    def events(self, name: str | None = None) -> list[tuple[float, str, dict[str, Any]]]:
        """Stored events, oldest first, optionally only those named ``name``."""
        query = "SELECT at, name, fields FROM events"
        args: tuple[Any, ...] = ()
        if name is not None:
            query, args = query + " WHERE name = ?", (name,)
        with self._read() as db:
            return [(self._out(at), n, json.loads(f)) for at, n, f in db.execute(query + " ORDER BY seq", args)]

    def goal_plans(self) -> list[tuple[float, str, dict[str, Any]]]:
        """The ``plan.solved`` events made for the run's goal: those since the last resume
        that changed it (``run.goal_changed``), all of them otherwise. The first is the promise."""
        changes = self.events("run.goal_changed")
        since = changes[-1][0] if changes else -float("inf")
        return [e for e in self.events("plan.solved") if e[0] >= since]

    def private_nodes(self) -> list[tuple[str, int]]:
        """The private nodes the run was given, with their slots, in the inventory's order."""
        with self._read() as db:
            return [(n, int(k)) for n, k in db.execute("SELECT name, slots FROM private_nodes ORDER BY rowid")]

    def done_by_node(self) -> dict[str, int]:
        """How many tasks each node ran to their counted success."""
        with self._read() as db:
            return dict(db.execute("SELECT a.node, count(*) FROM tasks t JOIN attempts a"
                                   " ON a.task_id = t.id AND a.attempt = t.done_attempt GROUP BY a.node"))

    def heard(self) -> dict[str, float]:
        """When the broker last heard from each node's agent (none for a journal from before
        this was recorded)."""
        with self._read() as db:
            try:
                return {node: self._out(at) for node, at in db.execute("SELECT node, at FROM node_heard")}
            except sqlite3.OperationalError:  # no such table: an older journal
                return {}

    def done_since(self, since_s: float) -> int:
        """Tasks whose counted attempt ended at or after ``since_s``: the recent pace ``broker
        status`` derives an ETA from."""
        with self._read() as db:
            return db.execute(
                "SELECT count(*) FROM tasks t JOIN attempts a ON a.task_id = t.id AND a.attempt = t.done_attempt"
                " WHERE t.state = 'done' AND a.ended_at >= ?", (self._now(since_s),)
            ).fetchone()[0]

    # -- summaries -------------------------------------------------------------------------
    def status(self, now_s: float | None = None) -> dict[str, Any]:
        """The machine-readable summary (``broker status --json``), from one snapshot::

            {"tasks": {"total", "done", "running", "failed", "left"},
             "instances": {"running", "terminated"}, "committed_usd", "budget_usd"}

        ``running`` tasks include samples being run; ``failed`` includes quarantined;
        ``left = total - done - failed``. ``running`` instances are those not terminated
        (booting ones included: they are being paid for).
        """
        now = self._now(now_s)
        with self._read() as db:
            return self._status(db, now, self._task_states(db))

    def _status(self, db: sqlite3.Connection, now_stored: float, states: Mapping[str, int]) -> dict[str, Any]:
        total = sum(states.values()) - states[TaskState.DROPPED]  # dropped: edited out of the bag
        done = states[TaskState.DONE]
        failed = states[TaskState.FAILED] + states[TaskState.QUARANTINED]
        alive, terminated = db.execute(
            "SELECT coalesce(sum(state <> 'terminated'), 0), coalesce(sum(state = 'terminated'), 0)"
            " FROM instances"
        ).fetchone()
        budget = db.execute("SELECT budget_usd FROM run").fetchone()
        return {
            "tasks": {"total": total, "done": done, "running": states[TaskState.RUNNING] + states[TaskState.SAMPLING],
                      "failed": failed, "left": total - done - failed},
            "instances": {"running": alive, "terminated": terminated},
            "committed_usd": round(self._committed(db, now_stored), 6),
            "budget_usd": None if budget is None else budget[0],
        }

    @staticmethod
    def _task_states(db: sqlite3.Connection) -> dict[str, int]:
        counts = dict.fromkeys(TASK_STATES, 0)
        counts.update(db.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        return counts

    def overview(self, now_s: float | None = None) -> Overview:
        """Status plus the run, per-state counts, the fleet and the last plan, one snapshot."""
        now = self._now(now_s)
        with self._read() as db:
            states = self._task_states(db)
            return Overview(now_s=self._out(now), status=self._status(db, now, states), run=self._run_row(db),
                            task_states=states, fleet=tuple(self._instance_rows(db, now)),
                            last_plan=self._last_plan(db))

    def integrity_problems(self) -> list[str]:
        """SQLite's ``integrity_check`` and ``foreign_key_check`` findings; empty when sound."""
        with self._lock:
            problems = [r[0] for r in self._db.execute("PRAGMA integrity_check") if r[0] != "ok"]
            problems += [f"foreign key: {tuple(r)}" for r in self._db.execute("PRAGMA foreign_key_check")]
            return problems
