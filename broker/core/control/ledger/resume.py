"""Resume: a ledger rebuilt from a journal's rows, as data (no I/O).

The journal reader (``broker/shells/journal/``) turns its tables into the rows below, in
run seconds; :func:`restore` replays them into a :class:`~.ledger.Ledger`: done and given-up
tasks, attempt counters, sample draws, observed runtimes, and the
:class:`~broker.core.control.failures.FailureBook` (every attempt that ended without a
result, in the order they ended, and every success), so a resumed run gives up on the same
tasks and nodes as the run that died. What needs the outside world (EC2's view of the
instances, the agents still running attempts) is left to the shell: :class:`Restored` says
which attempts the journal left running, per node, and which nodes the failure rules
found bad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..actions import ScheduleRelease
from ..causes import FAILURES, SETTLED_FAILED, AttemptOutcome, ReleaseCause, TaskState
from ..failures import signature
from .ledger import Ledger
from .records import Followup



@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    state: str  # pending | sampling | running | done | failed | quarantined | cancelled
    attempts: int  # highest attempt started
    failures: int
    done_attempt: int | None
    sample_order: int | None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt (times in run seconds)."""

    task_id: str
    attempt: int
    node: str
    started_at_s: float | None
    ended_at_s: float | None
    outcome: str  # an AttemptOutcome: running | ok | failed | timed_out | lost | cancelled
    runtime_s: float | None
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceRow:
    id: str
    type_name: str
    state: str
    launched_at_s: float
    ready_at_s: float | None
    release_at_s: float | None
    terminated_at_s: float | None
    interrupted: bool = False  # spot: EC2 took it back


@dataclass(frozen=True, slots=True)
class JournalRows:
    tasks: Sequence[TaskRow]
    attempts: Sequence[AttemptRow]
    instances: Sequence[InstanceRow] = ()
    time_scale: float = 1.0  # run seconds per second of runtime measured on a node


@dataclass
class Restored:
    running: dict[str, list[AttemptRow]] = field(default_factory=dict)  # node -> attempts left running
    bad_nodes: set[str] = field(default_factory=set)


def restore(ledger: Ledger, rows: JournalRows, speeds: Mapping[str, float]) -> Restored:
    """Replay ``rows`` into ``ledger`` (which has its tasks, see ``Ledger.add_tasks``, added
    after this call). ``speeds``: each node's declared speed (runtimes to reference s)."""
    done_attempt: dict[str, int] = {}
    for row in rows.tasks:
        if row.attempts:
            ledger.attempts[row.id] = row.attempts
        if row.state == TaskState.DONE and row.done_attempt is not None:
            ledger.done.add(row.id)
            done_attempt[row.id] = row.done_attempt
        elif row.state in SETTLED_FAILED:
            ledger.quarantined[row.id] = row.note or row.state
    first: dict[str, int] = {}
    for a in rows.attempts:
        first[a.task_id] = min(first.get(a.task_id, a.attempt), a.attempt)
    for row in rows.tasks:
        if row.sample_order is not None:
            ledger.sampled.add(row.id)
            if row.id in first:
                ledger.sample_keys.add((row.id, first[row.id]))
    out = Restored()
    nodes = {a.node for a in rows.attempts} | set(speeds)
    others = max(0, len(nodes) - 1)  # who else could have taken work is not journaled
    ended = sorted((a for a in rows.attempts if a.outcome != AttemptOutcome.RUNNING),
                   key=lambda a: -math.inf if a.ended_at_s is None else a.ended_at_s)
    for a in ended:
        if a.outcome == AttemptOutcome.OK:
            if done_attempt.get(a.task_id) != a.attempt:
                continue  # a replica that lost the race: not counted
            ledger.book.succeeded(a.node)
            if a.runtime_s is not None:
                ref = a.runtime_s * rows.time_scale * speeds.get(a.node, 1.0)
                ledger.observe(ref, ledger.estimates.get(a.task_id))
            if a.ended_at_s is not None:
                ledger.last_done_s = max(ledger.last_done_s, a.ended_at_s)
        elif a.outcome == AttemptOutcome.INTERRUPTED:  # no failure; counts towards max_spot_attempts
            ledger.count_interruption(a.task_id)
        elif a.outcome in FAILURES:
            sig = None if a.outcome == AttemptOutcome.LOST else signature(a.exit_code, a.timed_out, a.error)
            if sig is None:  # lost with its node or agent, as Ledger._failed counts it
                ledger.book.lost(a.task_id, a.node)
                continue
            verdict = ledger.book.failed(a.task_id, a.node, sig, others)
            if verdict.bad_node:
                out.bad_nodes.add(a.node)
    for a in rows.attempts:
        if a.outcome == AttemptOutcome.RUNNING:
            out.running.setdefault(a.node, []).append(a)
    return out


def resume_release(ledger: Ledger, instance_id: str, journaled_at_s: float | None, now: float,
                   margin_s: float, interrupted: bool = False) -> Followup | None:
    """A resumed instance's release: at once when the dead daemon was terminating it
    (``interrupted``: its intent was left open; ``interrupted_release``), else as journaled,
    else at its paid-until minus the margin; at once (``resumed_past_release``) when that
    moment has passed while no daemon ran."""
    node = ledger.nodes.get(instance_id)
    if node is None or node.type is None or node.terminated_at_s is not None:
        return None
    if interrupted:
        return ledger.schedule_release(instance_id, now, ReleaseCause.INTERRUPTED_RELEASE, now)
    at = journaled_at_s
    if at is None:
        at = node.type.billing.paid_until(node.launched_at_s, max(now, node.launched_at_s)) - margin_s
    cause = ReleaseCause.RESUMED_PAST_RELEASE if at <= now else ReleaseCause.RESUMED
    return ledger.schedule_release(instance_id, at, cause, now)


def restore_instance(ledger: Ledger, row: InstanceRow, now: float) -> ScheduleRelease | None:
    """Put a journaled instance back in the ledger (a terminated one for its cost only; an
    interrupted one charged for what ran, and counted in its type's learned rate and the
    run's interruptions, as :meth:`Ledger.on_interrupted` counted it)."""
    ledger.on_launched(row.id, row.type_name, row.launched_at_s, now)
    node = ledger.nodes.get(row.id)
    if row.interrupted and node is not None and node.type is not None:
        ledger.count_instance_interrupted(node)
    if row.state == "terminated":
        ledger.on_released(row.id, row.terminated_at_s if row.terminated_at_s is not None else now)
    return None
