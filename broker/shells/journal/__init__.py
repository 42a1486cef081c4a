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
- ``PRAGMA synchronous=NORMAL`` for results and events, ``FULL`` for what guards money. In
  WAL mode ``NORMAL`` survives a killed *process*; after a power loss or kernel panic it may
  roll back the last commits (never tear one). The daemon commits each turn once
  (:meth:`Journal.group`: its results, events and starts) and acknowledges results and sends
  new attempts only after that commit (:meth:`Journal.after_commit`), so a lost turn's
  results are replayed by their agents and its attempts never left. An intent (launch,
  terminate, describe) is committed with ``FULL`` before its EC2 call, fsyncing the WAL with
  every commit before it: forgetting an intent whose call went through would leave an
  instance paid for and not known. bench/bench_journal.py measures both commits and a turn.
- Every public method is one short transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); readers
  take one snapshot per call, so the counts they return always add up.
- One writer thread is assumed; a lock makes calls from a second thread (a scheduler job)
  safe anyway.

Times are stored as epoch seconds (the run's start plus run time); a caller reads and
writes them in its own time base (:mod:`.base`: the daemon in run seconds); the journal
never interprets them beyond subtraction.

Committed spend (ALGORITHMS.md 1)
---------------------------------
For an instance launched at ``t0`` with billing unit ``beta``, minimum ``m`` and price ``c``
per hour, alive until ``t1`` (its termination, or ``now``)::

    spend = max(m, beta * ceil((t1 - t0) / beta)) / 3600 * c         (Billing.cost_usd)

and a private node costing ``c_v`` per hour that joined at ``t_v`` adds
``c_v * (t_end - t_v) / 3600`` with ``t_end`` the run's end, or ``now`` while it runs.
Committed spend is the sum over every instance ever launched plus every private node. It
is derived from the stored rows, never kept as a running total that could drift.

Layout: :mod:`.schema` (tables, records, errors), :mod:`.base` (opening, transactions, the
time base), :mod:`.reader` (:class:`JournalReader`: status, report, metrics, ``down`` and
resume read only this), :mod:`.writer` (:class:`Journal`: the daemon's writes).
"""

from .base import JournalBase
from .reader import JournalReader
from .schema import (
    GOAL_KINDS,
    INSTANCE_STATES,
    JOURNAL_FILE,
    RUN_STATES,
    SCHEMA_VERSION,
    TASK_STATES,
    ActionRecord,
    AttemptResult,
    InstanceRecord,
    Intent,
    JournalDiskFull,
    JournalError,
    JournalNotFound,
    Overview,
    PendingTask,
    PlanRecord,
    RunningAttempt,
    RunRecord,
    file_sha256,
)
from .writer import Journal

__all__ = [
    "GOAL_KINDS", "INSTANCE_STATES", "JOURNAL_FILE", "RUN_STATES", "SCHEMA_VERSION", "TASK_STATES", "ActionRecord",
    "AttemptResult", "InstanceRecord", "Intent", "Journal", "JournalBase", "JournalDiskFull", "JournalError",
    "JournalNotFound", "JournalReader", "Overview", "PendingTask", "PlanRecord", "RunRecord", "RunningAttempt",
    "file_sha256",
]
