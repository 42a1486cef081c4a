"""The journal's schema, records and errors (see the package docstring for what it is for).

Task life cycle
---------------
``pending -> running | sampling -> done | pending``; ``quarantined`` and ``cancelled`` are
set explicitly by the caller (the run ledger decides when a task is given up; the journal
only records it). ``failed`` is what journals written before the ledger set past a task's
retries; it reads as given up. A task is ``sampling`` while an attempt runs and it was
drawn as a sample. ``done_attempt`` names the one attempt whose result counts; the schema
enforces ``state = 'done'`` exactly when it is set, so a task is done at most once whatever
replays or replicas arrive. An attempt that ends without success by the task's own doing
(failed, timed out) adds one to ``failures`` (one lost with its node or agent does not); a task left with no attempt running and
not done or given up goes back to ``pending``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from broker.core.billing import Billing
from broker.core.control.causes import AttemptOutcome, TaskState
from broker.core.goal import GOAL_KINDS  # goal_kind's values: a run with no goal is journaled as theta 1 (cli/run.py)
from broker.shells.diskfull import DiskFull

JOURNAL_FILE = "journal.sqlite"
SCHEMA_VERSION = 1

TASK_STATES = tuple(s.value for s in TaskState)  # ("pending", "sampling", ..., "cancelled")
ATTEMPT_OUTCOMES = tuple(o.value for o in AttemptOutcome)
INSTANCE_STATES = ("pending", "running", "terminating", "terminated", "unknown")
RUN_STATES = ("running", "finished", "stopped")
# meta keys: the tasks' context besides their command (JSON: env, workdir, setup), for a resume
# that matches an edited bag's tasks (broker/shells/run/bagedit.py); the last plan made before
# a resume changed the goal (the promise is the first plan after it).
TASK_CONTEXT = "task_context"
GOAL_SINCE_PLAN = "goal_since_plan_seq"
DROP_STATE_INDEX = "DROP INDEX IF EXISTS tasks_by_state"  # journals written before it went (see the schema)

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
-- No index on state: each start and result moved two of its entries, a random page each (tasks
-- are dispatched in random order), 2.2 of the 7.5 KiB of WAL a no-op task cost, for queries that
-- read most of the table anyway (status counts, resume). Journals that have it lose it on open.
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
                CHECK (outcome IN {ATTEMPT_OUTCOMES}),
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
    interrupted       INTEGER NOT NULL DEFAULT 0,    -- spot: EC2 took it back (charged for what ran)
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

-- When the broker last heard from each node's agent (refreshed every monitoring tick).
CREATE TABLE IF NOT EXISTS node_heard (
    node TEXT PRIMARY KEY,
    at   REAL NOT NULL
);
"""

# Added to schema v1 after its first release: a journal written before it gets the table when
# it is next opened for writing (a resume); readers of such a journal see no row.
# Added after schema v1 was released: a journal written before gets the column on its first
# writable open (read-only opens of such a journal read it as 0).
INTERRUPTED_COLUMN = "ALTER TABLE instances ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0"
NODE_HEARD_TABLE = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS node_heard"):].strip().rstrip(";")


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
            return AttemptOutcome.OK
        return AttemptOutcome.TIMED_OUT if self.timed_out else AttemptOutcome.FAILED


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
    interrupted: bool = False  # spot: EC2 took it back; charged only for what ran

    def committed_usd(self, now_s: float) -> float:
        end_s = self.terminated_at_s if self.terminated_at_s is not None else now_s
        if self.interrupted:
            return self.billing.interrupted_billed_s(end_s - self.launched_at_s) / 3600.0 * self.price_per_hour
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

