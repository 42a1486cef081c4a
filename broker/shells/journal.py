"""The run's durable state: one SQLite journal per run directory (``run_dir/journal.sqlite``).

Why it exists: a crash at any moment must be recoverable. The live shell writes an *intent*
before every external action (launch, terminate, start a task) and its *outcome* after it, so
``broker run`` on the same directory resumes with no task lost, none counted twice, no
instance orphaned and the spend carried over (ARCHITECTURE.md "State, logs, metrics"). This
is HTCondor's durable job queue and Nextflow's ``-resume`` for a bag of tasks.

Durability and concurrency
--------------------------
- ``PRAGMA journal_mode=WAL``: the daemon writes while ``broker status`` reads from another
  process (read-only, ``mode=ro`` URI); readers see the last committed transaction and never
  block the writer.
- ``PRAGMA synchronous=FULL``: every commit is fsynced before the call returns. In WAL mode
  ``NORMAL`` already survives a killed *process*, but after a power loss or kernel panic it
  may roll back the last commits; for an intent log that would forget an intent whose EC2
  call went through (an instance paid for and not known). A commit costs ~0.25 ms on a quiet
  disk here and a few ms on a busy one (bench/bench_journal.py); actions are few, and a burst
  of task results shares one commit through :meth:`Journal.batch`.
- Every public method is one short transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); readers
  take one snapshot per call, so the counts they return always add up.
- One writer thread is assumed; a lock makes calls from a second thread (a scheduler job)
  safe anyway.

Times are seconds on the daemon's wall clock (``time.time()``) unless a caller passes its own
``at_s``; the journal never interprets them beyond subtraction.

Committed spend (ALGORITHMS.md 1)
---------------------------------
For an instance launched at ``t0`` with billing unit ``beta``, minimum ``m`` and price ``c``
per hour, alive until ``t1`` (its termination, or ``now``)::

    spend = max(m, beta * ceil((t1 - t0) / beta)) / 3600 * c         (Billing.cost_usd)

and a private node costing ``c_v`` per hour that joined at ``t_v`` adds
``c_v * (t_end - t_v) / 3600`` with ``t_end`` the run's end, or ``now`` while it runs.
Committed spend is the sum over every instance ever launched plus every private node. It
is derived from the stored rows, never kept as a running total that could drift.

Task life cycle
---------------
``pending -> running | sampling -> done | pending (retry) | failed``; ``quarantined`` and
``cancelled`` are set explicitly. A task is ``sampling`` while an attempt runs and it was
drawn as a sample. ``done_attempt`` names the one attempt whose result counts; the schema
enforces ``state = 'done'`` exactly when it is set, so a task is done at most once whatever
replays or replicas arrive. An attempt that ends without success (failed, timed out, its node
lost) adds one to ``failures``; a task with no attempt left running goes back to ``pending``
while ``failures <= retries`` and to ``failed`` after that.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from broker.shells.diskfull import DiskFull, is_disk_full
from typing import Any, Callable, Iterable, Iterator, Mapping

from broker.core.billing import Billing
from broker.core.model import Task

JOURNAL_FILE = "journal.sqlite"
SCHEMA_VERSION = 1

TASK_STATES = ("pending", "sampling", "running", "done", "failed", "quarantined", "cancelled")
INSTANCE_STATES = ("pending", "running", "terminating", "terminated", "unknown")
RUN_STATES = ("running", "finished", "stopped")
GOAL_KINDS = ("deadline", "budget", "point", "theta")

_SCHEMA = f"""
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- One run per journal (the singleton column makes a second row impossible).
CREATE TABLE run (
    id               TEXT PRIMARY KEY,
    singleton        INTEGER NOT NULL DEFAULT 1 UNIQUE CHECK (singleton = 1),
    created_at       REAL NOT NULL,
    ended_at         REAL,
    inventory_path   TEXT,
    inventory_sha256 TEXT,
    bag_path         TEXT,
    bag_sha256       TEXT,
    goal_kind        TEXT NOT NULL CHECK (goal_kind IN {GOAL_KINDS}),
    goal_value       REAL,
    budget_usd       REAL CHECK (budget_usd IS NULL OR budget_usd >= 0),
    deadline_s       REAL CHECK (deadline_s IS NULL OR deadline_s > 0),
    retries          INTEGER NOT NULL CHECK (retries >= 0),
    options          TEXT NOT NULL,                 -- JSON object
    state            TEXT NOT NULL DEFAULT 'running' CHECK (state IN {RUN_STATES}),
    CHECK ((state = 'running') = (ended_at IS NULL))
);

CREATE TABLE tasks (
    id           TEXT PRIMARY KEY,
    command      TEXT NOT NULL,
    params       TEXT,                              -- JSON object, NULL when empty
    estimates    TEXT,                              -- JSON {{tool: reference s}}, NULL when none
    estimate_s   REAL,                              -- the daemon's current estimate (reference s)
    state        TEXT NOT NULL DEFAULT 'pending' CHECK (state IN {TASK_STATES}),
    attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),  -- highest attempt started
    failures     INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),  -- attempts ended unsuccessfully
    done_attempt INTEGER,                           -- the attempt whose result counts
    sample_order INTEGER,                           -- draw order when drawn as a sample
    note         TEXT,                              -- why failed / quarantined / cancelled
    CHECK ((state = 'done') = (done_attempt IS NOT NULL))
);
CREATE INDEX tasks_by_state ON tasks (state);
-- Partial: only drawn samples carry an entry, so a 100,000-task insert does not pay for NULLs.
CREATE UNIQUE INDEX tasks_by_sample_order ON tasks (sample_order) WHERE sample_order IS NOT NULL;

CREATE TABLE attempts (
    id          INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (id),
    attempt     INTEGER NOT NULL CHECK (attempt >= 1),
    node        TEXT NOT NULL,                      -- instance id or private node name
    started_at  REAL,                               -- NULL: result arrived without a start
    ended_at    REAL,
    outcome     TEXT NOT NULL DEFAULT 'running'
                CHECK (outcome IN ('running', 'ok', 'failed', 'timed_out', 'lost', 'cancelled')),
    exit_code   INTEGER,
    runtime_s   REAL,
    timed_out   INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    stdout_tail TEXT,
    stderr_tail TEXT,
    error       TEXT,
    UNIQUE (task_id, attempt),
    CHECK ((outcome = 'running') = (ended_at IS NULL))
);
CREATE INDEX attempts_running_by_node ON attempts (node) WHERE outcome = 'running';

-- The intent/outcome log: written before an external action (intended) and after it.
CREATE TABLE actions (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused
    kind         TEXT NOT NULL CHECK (kind <> ''),
    payload      TEXT NOT NULL,                      -- JSON
    cause        TEXT NOT NULL,
    state        TEXT NOT NULL DEFAULT 'intended' CHECK (state IN ('intended', 'done', 'failed')),
    created_at   REAL NOT NULL,
    completed_at REAL,
    outcome      TEXT,                               -- JSON
    CHECK ((state = 'intended') = (completed_at IS NULL))
);
CREATE INDEX actions_intended ON actions (seq) WHERE state = 'intended';

CREATE TABLE instances (
    id                TEXT PRIMARY KEY,
    type              TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN {INSTANCE_STATES}),
    launched_at       REAL NOT NULL,
    ready_at          REAL,
    paid_until        REAL NOT NULL,                 -- as of the last state change
    release_at        REAL,                          -- scheduled release, NULL when none
    terminated_at     REAL,
    client_token      TEXT UNIQUE,                   -- NULL for adopted strays
    price_per_hour    REAL NOT NULL CHECK (price_per_hour >= 0),
    billing_unit_s    REAL NOT NULL CHECK (billing_unit_s > 0),
    billing_minimum_s REAL NOT NULL CHECK (billing_minimum_s >= 0),
    action_seq        INTEGER REFERENCES actions (seq),
    CHECK ((state = 'terminated') = (terminated_at IS NOT NULL))
);
CREATE INDEX instances_by_state ON instances (state);

CREATE TABLE private_nodes (
    name          TEXT PRIMARY KEY,
    slots         INTEGER NOT NULL CHECK (slots >= 1),
    speed         REAL NOT NULL CHECK (speed > 0),
    cost_per_hour REAL NOT NULL CHECK (cost_per_hour >= 0),
    joined_at     REAL NOT NULL
);

CREATE TABLE plans (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    makespan_s REAL,                                 -- predicted, from the run's start
    cost_usd   REAL,                                 -- predicted committed spend at the end
    confidence REAL CHECK (confidence IS NULL OR (confidence >= 0 AND confidence <= 1)),
    fleet      TEXT NOT NULL,                        -- JSON
    chosen     TEXT NOT NULL,                        -- JSON
    reason     TEXT NOT NULL
);

-- Structured events, also kept here for `broker report`.
CREATE TABLE events (
    seq    INTEGER PRIMARY KEY,
    at     REAL NOT NULL,
    name   TEXT NOT NULL,
    fields TEXT NOT NULL                             -- JSON
);
CREATE INDEX events_by_name ON events (name, seq);
"""


class JournalError(Exception):
    """The journal cannot be used as asked; the message says why and what to do."""


class JournalNotFound(JournalError):
    """No journal in the run directory."""


class JournalDiskFull(JournalError, DiskFull):
    """A write failed for lack of space; it was rolled back and every earlier commit is kept."""


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What an attempt produced. Success is exit code 0, no timeout and no error."""

    exit_code: int | None
    runtime_s: float | None
    timed_out: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @property
    def outcome(self) -> str:
        if self.ok:
            return "ok"
        return "timed_out" if self.timed_out else "failed"


@dataclass(frozen=True, slots=True)
class Intent:
    """An action written before it was carried out and never completed."""

    seq: int
    kind: str
    payload: Any
    cause: str
    created_at_s: float


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    created_at_s: float
    ended_at_s: float | None
    state: str
    goal_kind: str
    goal_value: float | None
    budget_usd: float | None
    deadline_s: float | None
    retries: int
    options: Mapping[str, Any]
    inventory_path: str | None
    inventory_sha256: str | None
    bag_path: str | None
    bag_sha256: str | None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance as the journal knows it; ``paid_until_s`` is as of the query's ``now``."""

    id: str
    type_name: str
    state: str
    launched_at_s: float
    ready_at_s: float | None
    paid_until_s: float
    release_at_s: float | None
    terminated_at_s: float | None
    price_per_hour: float
    billing: Billing
    client_token: str | None

    def committed_usd(self, now_s: float) -> float:
        end_s = self.terminated_at_s if self.terminated_at_s is not None else now_s
        return self.billing.cost_usd(end_s - self.launched_at_s, self.price_per_hour)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    seq: int
    created_at_s: float
    makespan_s: float | None
    cost_usd: float | None
    confidence: float | None
    fleet: Any
    chosen: Any
    reason: str


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    task_id: str
    attempt: int
    node: str
    started_at_s: float | None


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    state: str
    attempts: int
    failures: int
    done_attempt: int | None
    sample_order: int | None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    task_id: str
    attempt: int
    node: str
    started_at_s: float | None
    ended_at_s: float | None
    outcome: str
    runtime_s: float | None


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One action of the intent/outcome log, whatever its state."""

    seq: int
    kind: str
    payload: Any
    cause: str
    state: str
    created_at_s: float


@dataclass(frozen=True, slots=True)
class PendingTask:
    """A task waiting for a slot; ``next_attempt`` is the number its next start must carry."""

    id: str
    command: str
    estimate_s: float | None
    next_attempt: int
    sample_order: int | None


@dataclass(frozen=True, slots=True)
class Overview:
    """Everything ``broker status`` shows, read in one snapshot."""

    now_s: float
    status: dict[str, Any]
    run: RunRecord | None
    task_states: Mapping[str, int]
    fleet: tuple[InstanceRecord, ...]
    last_plan: PlanRecord | None

    @property
    def eta_at_s(self) -> float | None:
        """Predicted end of the run: its start plus the last plan's makespan."""
        if self.run is None or self.last_plan is None or self.last_plan.makespan_s is None:
            return None
        return self.run.created_at_s + self.last_plan.makespan_s


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (how a resume tells an edited inventory or bag)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _billing(unit_s: float, minimum_s: float) -> Billing:
    """The stored billing model, by its name when it is one of the standard ones."""
    for named in (Billing.hourly(), Billing.per_second()):
        if (named.unit_s, named.minimum_s) == (unit_s, minimum_s):
            return named
    return Billing.custom(unit_s, minimum_s)


# One encoder for every JSON column: built once, it spares json.dumps's per-call set-up
# (a third of the cost of inserting 100,000 tasks).
_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode


def _json_or_null(mapping: Mapping[str, Any]) -> str | None:
    return _json(dict(mapping)) if mapping else None


class Journal:
    """A run's journal. Create with :meth:`open`; every method is one short transaction."""

    def __init__(self, db: sqlite3.Connection, path: Path, readonly: bool, clock: Callable[[], float]):
        self._db = db
        self.path = path
        self.readonly = readonly
        self._clock = clock
        self._lock = threading.RLock()
        self._in_batch = False

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(
        cls, run_dir: str | Path, *, readonly: bool = False, clock: Callable[[], float] = time.time
    ) -> "Journal":
        """Open (creating it unless ``readonly``) ``run_dir/journal.sqlite``.

        A read-only journal is opened with SQLite's ``mode=ro`` URI: it can be read while the
        daemon writes, and any write raises. Raises :class:`JournalNotFound` when a read-only
        open finds no journal, :class:`JournalError` when the file is not a journal or was
        written by a newer broker.
        """
        path = Path(run_dir) / JOURNAL_FILE
        if readonly:
            if not path.is_file():
                raise JournalNotFound(f"no journal at {path} (is {run_dir} a run directory?)")
            target, uri = f"file:{path.resolve().as_posix()}?mode=ro", True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(path), False
        try:
            db = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc
        journal = cls(db, path, readonly, clock)
        try:
            journal._prepare()
        except sqlite3.DatabaseError as exc:
            db.close()
            if is_disk_full(exc):
                raise JournalDiskFull(path.parent, f"cannot set up the journal {path} ({exc})") from exc
            raise JournalError(f"{path} is not a readable broker journal: {exc}") from exc
        except JournalError:
            db.close()
            raise
        return journal

    def _prepare(self) -> None:
        db = self._db
        db.execute("PRAGMA busy_timeout = 10000")
        db.execute("PRAGMA foreign_keys = ON")
        if not self.readonly:
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise JournalError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            db.execute("PRAGMA synchronous = FULL")
        with self._read() if self.readonly else self._write():
            has_meta = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
            if has_meta is None:
                if self.readonly:
                    raise JournalError(f"{self.path} holds no journal yet (no schema)")
                if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise JournalError(f"{self.path} is an SQLite file but not a broker journal")
                # Statement by statement inside this transaction (executescript would commit
                # first); the schema text holds no ';' except as terminators.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                return
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"{self.path} was written by a newer broker (journal schema v{version}; this "
                    f"broker reads up to v{SCHEMA_VERSION}): upgrade the broker to resume or inspect it"
                )
            if version < SCHEMA_VERSION:
                raise JournalError(
                    f"{self.path} has journal schema v{version}, older than v{SCHEMA_VERSION} and "
                    "not upgradable: start a new run directory"
                )

    def close(self) -> None:
        with self._lock:
            if not self.readonly:
                # SQLite checkpoints the WAL into the main file when its last connection closes;
                # with a reader attached (metrics, `status --watch`) the writer is not the last,
                # and a copy of journal.sqlite alone had no tables. Checkpoint it here.
                try:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error:
                    pass  # a reader mid-read: the WAL stays, complete, beside the file
            self._db.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One call's writes, all or nothing: a transaction, or a savepoint inside a batch."""
        if self.readonly:
            raise JournalError(f"{self.path} was opened read-only")
        with self._lock:
            begin, commit, rollback = (
                ("SAVEPOINT call", "RELEASE call", "ROLLBACK TO call; RELEASE call")
                if self._in_batch
                else ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
            )
            try:
                self._db.execute(begin)
                try:
                    yield self._db
                except BaseException:
                    self._roll_back(rollback)
                    raise
                self._db.execute(commit)
            except sqlite3.Error as exc:
                if not is_disk_full(exc):
                    raise
                self._roll_back(rollback)
                raise self._disk_full(exc) from exc

    def _roll_back(self, rollback: str) -> None:
        """Undo the open transaction or savepoint, if SQLite has not already (it may on a full disk)."""
        if not self._db.in_transaction:
            return
        try:
            for statement in rollback.split("; "):
                self._db.execute(statement)
        except sqlite3.Error:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def _disk_full(self, exc: BaseException) -> JournalDiskFull:
        return JournalDiskFull(
            self.path.parent,
            f"could not write the journal {self.path} ({exc}); the change was rolled back and "
            "everything committed before it is kept: free some space, then `broker down` or retry",
        )

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for several SELECTs (inside a batch: the batch's own view)."""
        with self._lock:
            if self._in_batch:
                yield self._db
                return
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator["Journal"]:
        """Group many calls into one transaction, hence one fsync: for bursts of results.

        Each call inside stays all or nothing (a savepoint), and a call that raises leaves
        the others intact if the caller catches the error. The block as a whole is all or
        nothing: an exception out of it rolls everything back, and nothing is durable until
        it ends, so never carry out an action whose intent was written inside a batch
        before the batch has ended. Other threads wait for the batch; batches do not nest.
        """
        if self.readonly:
            raise JournalError(f"{self.path} was opened read-only")
        with self._lock:
            if self._in_batch:
                raise JournalError("journal batches do not nest")
            self._db.execute("BEGIN IMMEDIATE")
            self._in_batch = True
            try:
                yield self
            except BaseException:
                self._roll_back("ROLLBACK")
                raise
            else:
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error as exc:
                    if not is_disk_full(exc):
                        raise
                    self._roll_back("ROLLBACK")
                    raise self._disk_full(exc) from exc
            finally:
                self._in_batch = False

    def _now(self, at_s: float | None) -> float:
        return self._clock() if at_s is None else float(at_s)

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
    ) -> RunRecord:
        """Record the run's identity and goal; the input files are hashed for resume checks."""
        if goal_kind not in GOAL_KINDS:
            raise JournalError(f"goal kind must be one of {', '.join(GOAL_KINDS)}, got {goal_kind!r}")
        inv_hash = file_sha256(inventory_path) if inventory_path is not None else None
        bag_hash = file_sha256(bag_path) if bag_path is not None else None
        with self._write() as db:
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
        record = self.run()
        assert record is not None
        return record

    def run(self) -> RunRecord | None:
        with self._read() as db:
            return self._run_row(db)

    @staticmethod
    def _run_row(db: sqlite3.Connection) -> RunRecord | None:
        row = db.execute(
            "SELECT id, created_at, ended_at, state, goal_kind, goal_value, budget_usd, deadline_s,"
            " retries, options, inventory_path, inventory_sha256, bag_path, bag_sha256 FROM run"
        ).fetchone()
        if row is None:
            return None
        return RunRecord(*row[:9], json.loads(row[9]), *row[10:])  # type: ignore[misc]

    def finish_run(self, state: str, *, at_s: float | None = None) -> None:
        """Mark the run ``finished`` (bag done) or ``stopped`` (budget cap, user stop)."""
        if state not in ("finished", "stopped"):
            raise JournalError(f"a run ends 'finished' or 'stopped', not {state!r}")
        with self._write() as db:
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
        rows = (
            (t.id, t.command, _json_or_null(t.params), _json_or_null(t.estimates_s)) for t in tasks
        )
        with self._write() as db:
            try:
                cur = db.executemany(
                    "INSERT INTO tasks (id, command, params, estimates) VALUES (?, ?, ?, ?)", rows
                )
            except sqlite3.IntegrityError as exc:
                raise JournalError(f"task ids must be unique within a run: {exc}") from exc
            return cur.rowcount

    def set_estimates(self, estimates_s: Iterable[tuple[str, float | None]]) -> None:
        """Store the daemon's current estimate (reference seconds) of each given task."""
        with self._write() as db:
            db.executemany("UPDATE tasks SET estimate_s = ? WHERE id = ?", ((e, t) for t, e in estimates_s))

    def record_sample_draws(self, task_ids: Iterable[str]) -> list[int]:
        """Mark tasks as drawn for sampling, numbering them in the order given (after any
        earlier draws). Returns their draw orders. Results are read in this order (2.1)."""
        with self._write() as db:
            order = db.execute("SELECT coalesce(max(sample_order), 0) FROM tasks").fetchone()[0]
            orders = []
            for task_id in task_ids:
                order += 1
                cur = db.execute(
                    "UPDATE tasks SET sample_order = ? WHERE id = ? AND sample_order IS NULL",
                    (order, task_id),
                )
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
            self._require_task(db, task_id)
            cur = db.execute(
                "INSERT INTO attempts (task_id, attempt, node, started_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (task_id, attempt) DO NOTHING",
                (task_id, int(attempt), node, self._now(at_s)),
            )
            if cur.rowcount != 1:
                return False
            db.execute(
                "UPDATE tasks SET attempts = max(attempts, ?),"
                " state = CASE WHEN state IN ('pending', 'running', 'sampling')"
                "   THEN (CASE WHEN sample_order IS NULL THEN 'running' ELSE 'sampling' END)"
                "   ELSE state END"
                " WHERE id = ?",
                (int(attempt), task_id),
            )
            return True

    def task_finished(
        self, task_id: str, attempt: int, result: AttemptResult, *, node: str | None = None,
        at_s: float | None = None,
    ) -> bool:
        """Record the result of one attempt, exactly once.

        Returns False, changing nothing, when that attempt already has a result (a replay).
        A successful result makes the task done unless another attempt already did (a
        replica: the attempt is recorded, the task is not counted twice). An unsuccessful
        one counts a failure and, when no other attempt of the task is running, sends the
        task back to pending or, past its retries, to failed. A result for an attempt whose
        start was never recorded (the daemon crashed in between) is accepted; ``node`` then
        names where it ran.
        """
        now = self._now(at_s)
        with self._write() as db:
            self._require_task(db, task_id)
            row = db.execute(
                "SELECT outcome FROM attempts WHERE task_id = ? AND attempt = ?", (task_id, int(attempt))
            ).fetchone()
            if row is not None and row[0] != "running":
                return False
            fields = (
                now, result.outcome, result.exit_code, result.runtime_s, int(result.timed_out),
                result.stdout_tail, result.stderr_tail, result.error,
            )
            if row is None:
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
        """A node was lost: end its running attempts as ``lost`` (each a failure) and send
        their tasks back to pending (or to failed, past their retries) unless another
        attempt still runs or the task is done. Returns the ids of the tasks now pending;
        their next start carries attempt ``attempts + 1`` (see :meth:`pending_tasks`)."""
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
            for task_id in dict.fromkeys(task_ids):  # each lost attempt is one failure
                lost = task_ids.count(task_id)
                if self._count_failure(db, task_id, f"node {node} lost", lost) == "pending":
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
        """After an attempt ended without success: the task's state. A task still open
        (pending, running, sampling) with no attempt left running goes to pending while
        failures <= retries, else to failed."""
        db.execute(
            "UPDATE tasks SET state ="
            " CASE WHEN failures > (SELECT retries FROM run) THEN 'failed' ELSE 'pending' END"
            " WHERE id = ? AND state IN ('pending', 'running', 'sampling')"
            " AND NOT EXISTS (SELECT 1 FROM attempts WHERE task_id = ? AND outcome = 'running')",
            (task_id, task_id),
        )
        return db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]

    def pending_tasks(self) -> list[PendingTask]:
        """Tasks waiting for a slot, in bag order (for resume)."""
        with self._read() as db:
            return [
                PendingTask(*row)
                for row in db.execute(
                    "SELECT id, command, estimate_s, attempts + 1, sample_order FROM tasks"
                    " WHERE state = 'pending' ORDER BY rowid"
                )
            ]

    def running_attempts(self) -> list[RunningAttempt]:
        """Attempts started and not ended (to re-attach to their agents on resume)."""
        with self._read() as db:
            return [
                RunningAttempt(*row)
                for row in db.execute(
                    "SELECT task_id, attempt, node, started_at FROM attempts"
                    " WHERE outcome = 'running' ORDER BY id"
                )
            ]

    def task_rows(self) -> list["TaskRow"]:
        """Every task's state and counters, in bag order (to rebuild a resumed run)."""
        with self._read() as db:
            return [
                TaskRow(*row)
                for row in db.execute(
                    "SELECT id, state, attempts, failures, done_attempt, sample_order FROM tasks ORDER BY rowid"
                )
            ]

    def attempt_rows(self) -> list["AttemptRow"]:
        """Every attempt, oldest first (to rebuild a resumed run's observations)."""
        with self._read() as db:
            return [
                AttemptRow(*row)
                for row in db.execute(
                    "SELECT task_id, attempt, node, started_at, ended_at, outcome, runtime_s FROM attempts ORDER BY id"
                )
            ]

    # -- the intent/outcome log -------------------------------------------------------------
    def intend(self, kind: str, payload: Any, cause: str, *, at_s: float | None = None) -> int:
        """Write an intent before carrying out an action; returns its id (``seq``)."""
        with self._write() as db:
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

    def pending_intents(self) -> list[Intent]:
        """Actions intended but never completed nor failed, oldest first (for resume)."""
        with self._read() as db:
            return [
                Intent(seq, kind, json.loads(payload), cause, created_at)
                for seq, kind, payload, cause, created_at in db.execute(
                    "SELECT seq, kind, payload, cause, created_at FROM actions"
                    " WHERE state = 'intended' ORDER BY seq"
                )
            ]

    def actions(self, kind: str | None = None) -> list["ActionRecord"]:
        """Every action of the intent/outcome log (optionally one kind), oldest first."""
        query = "SELECT seq, kind, payload, cause, state, created_at FROM actions"
        args: tuple[Any, ...] = ()
        if kind is not None:
            query, args = query + " WHERE kind = ?", (kind,)
        with self._read() as db:
            return [
                ActionRecord(seq, k, json.loads(payload), cause, state, created_at)
                for seq, k, payload, cause, state, created_at in db.execute(query + " ORDER BY seq", args)
            ]

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
        paid_until = billing.paid_until(launched_at_s, launched_at_s)
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO instances (id, type, state, launched_at, paid_until, release_at, client_token,"
                " price_per_hour, billing_unit_s, billing_minimum_s, action_seq)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    instance_id, type_name, state, float(launched_at_s), paid_until, release_at_s,
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
            ready_at = ready_at_s if ready_at_s is not None else (now if state == "running" else None)
            db.execute(
                "UPDATE instances SET state = ?, paid_until = ?, ready_at = coalesce(ready_at, ?),"
                " terminated_at = CASE WHEN ? = 'terminated' THEN ? ELSE NULL END WHERE id = ?",
                (state, paid_until, ready_at, state, now, instance_id),
            )
            return state != old_state

    def set_release(self, instance_id: str, release_at_s: float | None) -> bool:
        """Schedule (or, with None, cancel) an instance's release. False if it is terminated."""
        with self._write() as db:
            cur = db.execute(
                "UPDATE instances SET release_at = ? WHERE id = ? AND state <> 'terminated'",
                (release_at_s, instance_id),
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

    def instances(self, now_s: float | None = None) -> list[InstanceRecord]:
        now = self._now(now_s)
        with self._read() as db:
            return self._instance_rows(db, now)

    @staticmethod
    def _instance_rows(db: sqlite3.Connection, now_s: float) -> list[InstanceRecord]:
        records = []
        for row in db.execute(
            "SELECT id, type, state, launched_at, ready_at, paid_until, release_at, terminated_at,"
            " price_per_hour, billing_unit_s, billing_minimum_s, client_token FROM instances"
            " ORDER BY launched_at, id"
        ):
            (iid, type_name, state, launched, ready, paid_until, release, terminated,
             price, unit_s, minimum_s, token) = row
            billing = _billing(unit_s, minimum_s)
            if terminated is None:
                paid_until = billing.paid_until(launched, max(now_s, launched))
            records.append(
                InstanceRecord(iid, type_name, state, launched, ready, paid_until, release, terminated,
                               price, billing, token)
            )
        return records

    # -- spend -------------------------------------------------------------------------------
    def committed_usd(self, now_s: float | None = None) -> float:
        """Committed spend at ``now_s`` (module docstring): instances' charged units plus
        private nodes' cost so far."""
        now = self._now(now_s)
        with self._read() as db:
            return self._committed(db, now)

    def _committed(self, db: sqlite3.Connection, now_s: float) -> float:
        instances_usd = sum(r.committed_usd(now_s) for r in self._instance_rows(db, now_s))
        ended = db.execute("SELECT ended_at FROM run").fetchone()
        until = now_s if ended is None or ended[0] is None else min(now_s, ended[0])
        private_usd = db.execute(
            "SELECT coalesce(sum(cost_per_hour * max(0.0, ? - joined_at)), 0.0) FROM private_nodes", (until,)
        ).fetchone()[0] / 3600.0
        return instances_usd + private_usd

    # -- plans and events ------------------------------------------------------------------
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

    def latest_time_s(self) -> float | None:
        """The latest time anything was written at (events, actions, attempts), or None."""
        with self._read() as db:
            row = db.execute(
                "SELECT max(coalesce((SELECT max(at) FROM events), -1e300),"
                " coalesce((SELECT max(max(created_at, coalesce(completed_at, created_at))) FROM actions), -1e300),"
                " coalesce((SELECT max(coalesce(ended_at, started_at)) FROM attempts), -1e300))"
            ).fetchone()
        return None if row is None or row[0] is None or row[0] < -1e299 else float(row[0])

    def first_plan(self) -> PlanRecord | None:
        """The run's first adopted plan (what a resumed run reports its delivery against)."""
        with self._read() as db:
            row = db.execute(
                "SELECT seq, created_at, makespan_s, cost_usd, confidence, fleet, chosen, reason"
                " FROM plans ORDER BY seq LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        seq, created, makespan, cost, confidence, fleet, chosen, reason = row
        return PlanRecord(seq, created, makespan, cost, confidence, json.loads(fleet), json.loads(chosen), reason)

    def last_plan(self) -> PlanRecord | None:
        with self._read() as db:
            return self._last_plan(db)

    @staticmethod
    def _last_plan(db: sqlite3.Connection) -> PlanRecord | None:
        row = db.execute(
            "SELECT seq, created_at, makespan_s, cost_usd, confidence, fleet, chosen, reason"
            " FROM plans ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        seq, created, makespan, cost, confidence, fleet, chosen, reason = row
        return PlanRecord(
            seq, created, makespan, cost, confidence, json.loads(fleet), json.loads(chosen), reason
        )

    def record_event(self, name: str, fields: Mapping[str, Any], *, at_s: float | None = None) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO events (at, name, fields) VALUES (?, ?, ?)",
                (self._now(at_s), name, _json(dict(fields))),
            )

    def events(self, name: str | None = None) -> list[tuple[float, str, dict[str, Any]]]:
        """Stored events, oldest first, optionally only those named ``name``."""
        query = "SELECT at, name, fields FROM events"
        args: tuple[Any, ...] = ()
        if name is not None:
            query, args = query + " WHERE name = ?", (name,)
        with self._read() as db:
            return [(at, n, json.loads(f)) for at, n, f in db.execute(query + " ORDER BY seq", args)]

    def done_since(self, since_s: float) -> int:
        """Tasks whose counted attempt ended at or after ``since_s`` (journal time): the recent
        pace ``broker status`` derives an ETA from."""
        with self._read() as db:
            return db.execute(
                "SELECT count(*) FROM tasks t JOIN attempts a ON a.task_id = t.id AND a.attempt = t.done_attempt"
                " WHERE t.state = 'done' AND a.ended_at >= ?", (since_s,)
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

    def _status(self, db: sqlite3.Connection, now_s: float, states: Mapping[str, int]) -> dict[str, Any]:
        total = sum(states.values())
        done = states["done"]
        failed = states["failed"] + states["quarantined"]
        alive, terminated = db.execute(
            "SELECT coalesce(sum(state <> 'terminated'), 0), coalesce(sum(state = 'terminated'), 0)"
            " FROM instances"
        ).fetchone()
        budget = db.execute("SELECT budget_usd FROM run").fetchone()
        return {
            "tasks": {
                "total": total,
                "done": done,
                "running": states["running"] + states["sampling"],
                "failed": failed,
                "left": total - done - failed,
            },
            "instances": {"running": alive, "terminated": terminated},
            "committed_usd": round(self._committed(db, now_s), 6),
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
            return Overview(
                now_s=now,
                status=self._status(db, now, states),
                run=self._run_row(db),
                task_states=states,
                fleet=tuple(self._instance_rows(db, now)),
                last_plan=self._last_plan(db),
            )

    def integrity_problems(self) -> list[str]:
        """SQLite's ``integrity_check`` and ``foreign_key_check`` findings; empty when sound."""
        with self._lock:
            problems = [r[0] for r in self._db.execute("PRAGMA integrity_check") if r[0] != "ok"]
            problems += [f"foreign key: {tuple(r)}" for r in self._db.execute("PRAGMA foreign_key_check")]
            return problems
