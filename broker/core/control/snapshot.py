"""What the controller sees: a snapshot of the world at ``now``, and its own memory.

Shells build the snapshot from their state (the simulator from its event queue, the live
daemon from its journal and agents). Memory is the controller's own explicit state,
passed in and returned by every decision (no hidden counters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Mapping, Sequence

from ..frozen import fast_init
from ..goal import Goal  # noqa: F401 - the one goal class (broker.core.goal); re-exported
from ..model import MachineType
from .pool import TaskPool


@fast_init
@dataclass(frozen=True, slots=True)
class RunningTask:
    task_id: str
    attempt: int
    slot: int
    started_at_s: float
    estimate_ref_s: float | None  # the bag's estimate, None when non-clairvoyant
    queued: bool = False  # held at its node's agent behind the running tasks (queue_ahead.py): not started


@fast_init
@dataclass(frozen=True, slots=True)
class NodeView:
    """A private node or an EC2 instance as the controller sees it.

    ``type_name`` is None for private nodes. ``release_at_s`` is the scheduled release (None
    for private nodes). ``paid_until_s`` is what the billing model says now.
    """

    id: str
    slots: int
    speed: float
    running: tuple[RunningTask, ...] = ()
    type_name: str | None = None
    launched_at_s: float | None = None
    ready_at_s: float | None = None
    paid_until_s: float | None = None
    release_at_s: float | None = None
    lost: bool = False

    @property
    def is_private(self) -> bool:
        return self.type_name is None

    def ready(self, now_s: float) -> bool:
        return not self.lost and (self.ready_at_s is None or self.ready_at_s <= now_s)

    def free_slots(self) -> list[int]:
        if not self.running:
            return list(range(self.slots))
        busy = {r.slot for r in self.running}
        return [i for i in range(self.slots) if i not in busy]


@fast_init
@dataclass(frozen=True, slots=True)
class Observations:
    """Runtimes learned so far, normalized to reference seconds (runtime x slot speed)."""

    count: int = 0
    sum_ref_s: float = 0.0
    sumsq_ref_s: float = 0.0
    # For bags with estimates: sum of the finished tasks' estimates, to correct the rest.
    sum_estimate_ref_s: float = 0.0
    count_with_estimate: int = 0
    max_ref_s: float = 0.0
    # Relative error of the estimates: sums of r = actual / estimate and of r^2.
    sum_ratio: float = 0.0
    sumsq_ratio: float = 0.0

    def add(self, runtime_ref_s: float, estimate_ref_s: float | None) -> "Observations":
        ratio = runtime_ref_s / estimate_ref_s if estimate_ref_s else None
        return Observations(  # positional, in field order (made at every result)
            self.count + 1,
            self.sum_ref_s + runtime_ref_s,
            self.sumsq_ref_s + runtime_ref_s * runtime_ref_s,
            self.sum_estimate_ref_s + (estimate_ref_s or 0.0),
            self.count_with_estimate + (ratio is not None),
            max(self.max_ref_s, runtime_ref_s),
            self.sum_ratio + (ratio or 0.0),
            self.sumsq_ratio + (ratio * ratio if ratio is not None else 0.0),
        )

    def ratio_sd(self, prior: float = 0.15) -> float:
        """Standard deviation of actual/estimate; ``prior`` until 10 tasks with estimates ended."""
        k = self.count_with_estimate
        if k < 10:
            return prior
        var = (self.sumsq_ratio - self.sum_ratio**2 / k) / (k - 1)
        return max(var, 0.0) ** 0.5

    @property
    def mean_ref_s(self) -> float | None:
        return self.sum_ref_s / self.count if self.count else None

    @property
    def sd_ref_s(self) -> float:
        if self.count < 2:
            return 0.0
        var = (self.sumsq_ref_s - self.sum_ref_s**2 / self.count) / (self.count - 1)
        return max(var, 0.0) ** 0.5


@fast_init
@dataclass(frozen=True, slots=True)
class Snapshot:
    now_s: float
    types: Mapping[str, MachineType]
    nodes: tuple[NodeView, ...]
    pending: TaskPool
    tasks_total: int
    tasks_done: int
    observations: Observations
    committed_usd: float  # cloud spend already charged (paid-until of every instance)
    started_at_s: float = 0.0
    prior_mean_ref_s: float | None = None  # from sampling, a user hint, or the bag's estimates
    prior_sd_ref_s: float | None = None
    budget_usd: float | None = None
    tasks_failed: int = 0
    stopping: bool = False  # the user asked to stop: drain, release everything
    # Optional indexes a shell may supply so a dispatch-only decision costs O(free slots),
    # not O(fleet); when absent they are derived from ``nodes``.
    free_nodes: tuple[NodeView, ...] | None = None
    running_count: int | None = None
    # The lowest speed of a node running a task (inf: none runs) and the latest start of a
    # running task: a tail decision with no free slot faster than the one and every start
    # before ``now_s`` copies nothing (dispatch.replicate), and skips its O(fleet) scan.
    slowest_running_speed: float | None = None
    latest_start_s: float | None = None
    # Every finished runtime in reference seconds (the shell's append-only log), for the
    # Kaplan-Meier law of the promise; None: the promise works from ``observations``' moments.
    finished_ref_s: Sequence[float] | None = None
    timeout_ref_s: float | None = None  # the bag's timeout at speed 1: no task runs longer
    # Tasks interrupted ``max_spot_attempts`` times: on-demand and private slots only (the
    # ledger's set, shared as the pool is; ledger/spot.py).
    spot_barred: AbstractSet[str] = frozenset()
    # The shell's index of ``free_nodes`` by speed and release (broker.core.control.free_index),
    # valid while its ``version`` equals ``free_index_version``: a dispatch then visits only the
    # free nodes that can take a pending task; without it, every free node (same decisions).
    free_index: object | None = None
    free_index_version: int = -1
    # Per spot type: (interruptions seen, instance-seconds of its ended instances): the
    # ledger's counters, shared (spotrates.py learns the rate from them and the live nodes).
    spot_seen: Mapping[str, Sequence[float]] = field(default_factory=dict)

    def nodes_with_free_slots(self) -> tuple[NodeView, ...]:
        if self.free_nodes is not None:
            return self.free_nodes
        return tuple(n for n in self.nodes if len(n.running) < n.slots)

    def count_running(self) -> int:
        if self.running_count is not None:
            return self.running_count
        return sum(len(n.running) for n in self.nodes)


@dataclass(frozen=True, slots=True)
class Memory:
    """The controller's state between decisions; replaced, never mutated."""

    deadline_at_s: float | None = None  # resolved absolute deadline (deadline/point/theta goals)
    last_plan: object | None = None
    last_plan_at_s: float | None = None
    planned_makespan_s: float | None = None
    planned_cost_usd: float | None = None
    # What the user was promised: the chosen front point (point/theta/none goals), on the
    # point estimate of the work, as ``broker plan`` printed it. Reported as the first plan.
    promised_makespan_s: float | None = None
    promised_cost_usd: float | None = None
    launch_streak: int = 0  # consecutive ticks proposing a launch
    shorten_streak: Mapping[str, float] = field(default_factory=dict)  # instance -> first proposed at
    budget_stopped: bool = False
    plan_failures: int = 0
    last_note: str | None = None
    private_stopped: bool = False  # the budget pays no more private time (budget.stop_private_work)
    peer_state: object | None = None  # a baseline's own state (peer_policies: idle clocks, PANDA's lists)
    # The promise (broker.core.plan.promise.Promise): the current one, the first one made
    # (what ``broker simulate --json`` reports next to what was delivered), and when.
    promise: object | None = None
    first_promise: object | None = None
    promise_at_s: float | None = None
    # Deadline goals: how much earlier than the user's deadline the plans aim, so that the
    # makespan's (1 - delta) quantile, not its mean, meets it (broker.core.plan.promise.hold_deadline).
    tail_allowance_s: float = 0.0
    # Deadline goals: a high quantile of a task without an estimate (reference seconds): a
    # slot takes such a task only if it would end by the deadline there (dispatch.tail_limit_ref).
    tail_size_ref_s: float | None = None
    # Deadline goals: the first plan's hold waits for a re-plan while the runtimes' law is
    # young (promises.defer_hold): whether it still waits, and how many re-plans it has waited.
    hold_pending: bool = False
    hold_waits: int = 0
