"""What the ledger keeps per node and per attempt, and the follow-ups it hands back.

A follow-up is something a shell must carry out because of an event: cancel the other
copies of a task (``Cancel``), release an instance now (``ScheduleRelease``), and the
bookkeeping the journal records (``Requeue``, ``Quarantine``, ``NodeQuarantined``). The
ledger has already changed its own state when it returns them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...frozen import fast_init
from ...model import MachineType
from ..actions import Cancel, ScheduleRelease
from ..causes import Ending
from ..failures import Verdict
from ..snapshot import NodeView, RunningTask

# A node whose readiness is overdue (its boot delay passed, no agent answered yet) is shown
# to the controller as ready this long from now, so that nothing is dispatched to it.
LATE_READY_S = 1.0


@fast_init
@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a task, running in one slot of one node (run seconds)."""

    task_id: str
    attempt: int
    node: str
    slot: int
    started_at_s: float
    resumed: bool = False  # started by a daemon that died: unknown to the agent means never sent

    def moved(self, slot: int, at_s: float) -> "Attempt":
        """This attempt started in ``slot`` at ``at_s`` (a queued one reaching a slot): a copy
        made directly, a third of ``dataclasses.replace``'s cost, once a result on a no-op bag."""
        return Attempt(self.task_id, self.attempt, self.node, slot, at_s, self.resumed)


@dataclass(slots=True, eq=False)
class NodeRecord:
    """A private node or an EC2 instance (``type`` None for private nodes)."""

    id: str
    slots: int
    speed: float
    type: MachineType | None = None
    cost_per_hour: float = 0.0  # private nodes: amortized cost while the run lasts
    launched_at_s: float | None = None
    expected_ready_s: float | None = None  # launch + boot delay; None for private nodes
    ready_at_s: float | None = None  # its agent answered (and its setup ran)
    release_at_s: float | None = None
    release_version: int = 0
    release_cause: str | None = None
    terminated_at_s: float | None = None
    lost: bool = False  # no more work there (lost, bad, setup failed)
    down: bool = False  # its agent is away and expected back; its attempts were lost
    reattaches: int = 0
    running: dict[int, Attempt] = field(default_factory=dict)  # slot -> attempt
    running_views: dict[int, RunningTask] = field(default_factory=dict)  # slot -> its attempt as the view shows it
    idle_since_s: float | None = None  # ready with nothing running since then (None: busy or not ready)
    paid_until_s: float = -math.inf  # billing, refreshed when the clock passes it
    charged_usd: float = 0.0
    view: NodeView | None = None
    notice_at_s: float | None = None  # spot: EC2's two-minute notice came (no more work there)
    terminate_at_s: float | None = None  # ... when the notice says EC2 takes it back
    interrupted: bool = False  # spot: EC2 took it back (charged only for what ran)

    @property
    def is_private(self) -> bool:
        return self.type is None

    @property
    def alive(self) -> bool:
        return self.terminated_at_s is None and not self.lost

    def cost_usd(self, now_s: float) -> float:
        """What the instance has been charged from its launch to its end (or ``now_s``)."""
        if self.type is None or self.launched_at_s is None:
            return 0.0
        end = self.terminated_at_s if self.terminated_at_s is not None else now_s
        if self.interrupted:
            return self.type.billing.interrupted_billed_s(end - self.launched_at_s) / 3600.0 * self.type.price_per_hour
        return self.type.billing.cost_usd(max(0.0, end - self.launched_at_s), self.type.price_per_hour)


@dataclass(frozen=True, slots=True)
class Requeue:
    """The task is pending again (``retry``: after a failure, behind the tasks waiting)."""

    task_id: str
    retry: bool
    cause: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    """The task is given up: no more attempts."""

    task_id: str
    reason: str
    failures: int
    node: str


@dataclass(frozen=True, slots=True)
class NodeQuarantined:
    """Several tasks in a row failed on this node while others ran: no more work there."""

    node: str
    cause: str = "bad_node"


Followup = Cancel | ScheduleRelease | Requeue | Quarantine | NodeQuarantined


@fast_init
@dataclass(frozen=True, slots=True)
class Ended:
    """What the end of an attempt meant.

    ``outcome``: ``done`` (the first result: the task is done), ``replica`` (a success after
    the task was done), ``failed`` (counted by the failure rules), ``lost`` (the attempt
    vanished with its agent or node: no failure of the task, counted against its
    ``lost_attempts`` only), ``cancelled`` (no
    failure: re-queued), ``stale`` (no such attempt runs: a replay or a written-off copy;
    nothing changed). ``verdict`` is the failure rules' answer (None when the task was
    already settled or for a cancel).
    """

    outcome: Ending
    attempt: Attempt | None
    verdict: Verdict | None = None
    followups: tuple[Followup, ...] = ()
    runtime_ref_s: float | None = None

    @property
    def changed(self) -> bool:
        return self.outcome != Ending.STALE


STALE = Ended(Ending.STALE, None)
