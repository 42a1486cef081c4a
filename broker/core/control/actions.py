"""Actions the controller asks a shell to carry out. Decisions are data, each with a cause.

Causes are short stable strings (``deadline_at_risk``, ``surplus_at_billing_boundary``,
``budget_cap``, ...) that end up in the event log, so an operator can tell why the broker
spent or saved money; :mod:`.causes` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..frozen import fast_init
from .causes import LaunchCause, ReleaseCause, WorkCause


@fast_init
@dataclass(frozen=True, slots=True)
class SlotRef:
    """One task slot: ``node`` is an instance id or a private node's name."""

    node: str
    index: int


@dataclass(frozen=True, slots=True)
class Launch:
    type_name: str
    count: int
    cause: LaunchCause
    release_after_s: float  # release this long after launch (the margin is already taken off)


@dataclass(frozen=True, slots=True)
class ScheduleRelease:
    instance_id: str
    at_s: float
    cause: ReleaseCause


@fast_init
@dataclass(frozen=True, slots=True)
class Assign:
    task_id: str
    slot: SlotRef
    attempt: int
    cause: WorkCause


@dataclass(frozen=True, slots=True)
class Replicate:
    """Run another copy of a running task; the first result wins, the others are cancelled."""

    task_id: str
    slot: SlotRef
    attempt: int
    cause: WorkCause


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop one running attempt (emitted by the run ledger: the copies that lost the race,
    the copies of a quarantined task, the attempts of a released node). ``node`` runs it."""

    task_id: str
    attempt: int
    cause: str
    node: str = ""


@dataclass(frozen=True, slots=True)
class StopForBudget:
    """No further billing unit fits the budget: what is left cannot finish in the cloud."""

    tasks_left: int
    cause: str = ReleaseCause.BUDGET_CAP


Action = Launch | ScheduleRelease | Assign | Replicate | Cancel | StopForBudget
