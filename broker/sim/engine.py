"""The simulator: a discrete-event loop on a virtual clock that feeds the controller.

Events: monitoring ticks, instances becoming ready after their boot delay, task ends,
release timers, injected faults (see "Faults" below). After every batch of simultaneous events the controller
is asked for a decision (a tick re-plans; other events only dispatch), and its actions are
carried out exactly as a live shell would: launches (refused past a type's limit, as EC2
would), per-instance release timers, assignments and replicas (first result wins).

Ground truth lives here only: each task's true reference work, each instance's actual
speed (which may differ from the declared one), failures. The controller sees what a live
broker would see: declared speeds, elapsed times, finished runtimes.

Costs: an instance is charged by its billing model from launch to termination; committed
spend at any moment is what every instance has been charged so far (its paid-until). The
amortized cost of private nodes (``cost_per_hour`` over the makespan) is reported apart and
added to the total cost; the budget caps cloud spend, the money actually charged.

Faults (``SimOptions``), drawn from the run's seeded generator so a run replays:

- ``failure_rate``: an attempt fails part-way with a transient error;
- ``poison_rate``: a task fails every attempt, everywhere, with the same error;
- ``bad_node_rate``: a node (instance or private) fails every attempt it runs, quickly
  (``bad_nodes``: private nodes named to be bad);
- ``instance_loss_rate``: an instance disappears at a uniform time within its first
  billing unit (billed to that moment, its attempts lost);
- ``agent_kill_rate``: an agent is killed at a uniform time within its node's first hour,
  its attempts lost; it is back ``agent_restart_s`` later (the daemon re-attaches);
- ``capacity_rate`` / ``limit_rate`` / ``partial_rate``: a launch is refused for capacity
  or a limit (the type is then avoided for a while), or EC2 starts half of it;
  ``unavailable_types`` are refused for capacity every time.

What a failure means is decided by :class:`~broker.core.control.failures.FailureBook`, the
same rules the daemon applies: retried up to ``retries`` times, quarantined after that or
when the same error ends it on ``distinct_nodes`` nodes; a node where several tasks in a
row fail while others finish is not given work again.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.control.actions import Assign, Launch, Replicate, ScheduleRelease, StopForBudget
from ..core.control.controller import Controller, ControllerConfig
from ..core.control.failures import FailureBook, FailurePolicy, TypeCooldown, may_give_up
from ..core.control.pool import TaskPool
from ..core.control.snapshot import Goal, Memory, NodeView, Observations, RunningTask, Snapshot
from ..core.model import Inventory, MachineType

TICK, READY, END, RELEASE, FAIL, LOSS, KILL, REVIVE = 0, 1, 2, 3, 4, 5, 6, 7
FAULT_KINDS = ("attempt_failure", "poison_attempt", "bad_node_attempt", "instance_loss", "agent_kill",
               "capacity", "limit", "partial")


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """Ground truth: reference seconds per task, and optional per-task estimates."""

    runtimes_ref_s: np.ndarray
    estimates_ref_s: np.ndarray | None = None
    prior_mean_ref_s: float | None = None  # what sampling/a hint says before anything ran
    prior_sd_ref_s: float | None = None
    name: str = "workload"
    timeout_ref_s: float | None = None  # no task runs longer (a bag's timeout, at speed 1)


@dataclass(frozen=True, slots=True)
class SimOptions:
    seed: int = 0
    speed_noise: float = 0.0  # actual speed = declared x U(1 - noise, 1 + noise)
    failure_rate: float = 0.0  # probability that an attempt fails part-way (transient)
    max_virtual_s: float = 60 * 86400.0  # a run still going after this is reported unfinished
    poison_rate: float = 0.0  # probability that a task fails on every attempt
    bad_node_rate: float = 0.0  # probability that a node fails everything it runs
    instance_loss_rate: float = 0.0  # probability that an instance vanishes in its first unit
    agent_kill_rate: float = 0.0  # probability that a node's agent is killed in its first hour
    agent_restart_s: float = 60.0
    capacity_rate: float = 0.0  # probability that a launch fails: InsufficientInstanceCapacity
    limit_rate: float = 0.0  # ... InstanceLimitExceeded
    partial_rate: float = 0.0  # probability that a launch of n >= 2 starts n // 2
    unavailable_types: tuple[str, ...] = ()  # every launch of these fails for capacity
    bad_nodes: tuple[str, ...] = ()  # private nodes that fail everything they run
    failures: FailurePolicy = FailurePolicy()


@dataclass
class _Node:
    id: str
    slots: int
    speed: float  # declared
    actual_speed: float
    type: MachineType | None = None
    launched_at: float | None = None
    ready_at: float | None = None
    release_at: float | None = None
    release_version: int = 0
    terminated_at: float | None = None
    running: dict[int, tuple[str, int, float, float]] = field(default_factory=dict)  # slot -> (task, attempt, start, end)
    view: NodeView | None = None
    release_cause: str | None = None
    lost: bool = False
    bad: bool = False  # fails everything it runs (injected)
    down_until: float | None = None  # agent killed, back at this time
    paid_until: float = -math.inf  # cached: billing only changes when time passes it
    charged_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class SimProgress:
    """Where a simulation is, reported at every monitoring tick (``Simulation.run``)."""

    virtual_s: float
    done: int
    total: int
    committed_usd: float


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    cost_usd: float
    cloud_cost_usd: float
    private_cost_usd: float
    planned_makespan_s: float | None
    planned_cost_usd: float | None
    budget_usd: float | None
    deadline_s: float | None
    tasks_total: int
    tasks_done: int
    samples: int
    instances_launched: int
    max_concurrent: int
    sim_wall_s: float
    max_committed_usd: float
    releases: list[dict] = field(default_factory=list)
    completions: dict[str, int] = field(default_factory=dict)  # task id -> times recorded done
    launches_refused: int = 0
    fleet_changes: list[tuple[float, str, int]] = field(default_factory=list)
    budget_stopped: bool = False
    wasted_ref_s: float = 0.0
    quarantined: dict[str, str] = field(default_factory=dict)  # task id -> reason
    faults: dict[str, int] = field(default_factory=dict)  # fault kind -> times injected
    bad_nodes_found: list[str] = field(default_factory=list)
    # Why a goal was missed (broker.cli.verdict): the bag's true work, what the first plan
    # covered, when all but the last task were done, and how long the last one ran.
    actual_work_ref_s: float = 0.0
    planned_work_ref_s: float | None = None
    second_last_end_s: float | None = None
    last_runtime_s: float | None = None
    promise: object | None = None  # the first promise made (broker.core.plan.promise.Promise)
    promise_samples: int | None = None  # runtimes seen when it was made
    promise_last: object | None = None  # the last one
    promise_log: list = field(default_factory=list)  # (virtual s, tasks done, runtimes seen, Promise) per change

    @property
    def tasks_quarantined(self) -> int:
        return len(self.quarantined)

    @property
    def tasks_left(self) -> int:
        return self.tasks_total - self.tasks_done

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "makespan_s": round(float(self.makespan_s), 3),
            "cost_usd": round(float(self.cost_usd), 4),
            "planned": {
                "makespan_s": None if self.planned_makespan_s is None else round(float(self.planned_makespan_s), 3),
                "cost_usd": None if self.planned_cost_usd is None else round(float(self.planned_cost_usd), 4),
            },
            "budget_usd": self.budget_usd,
            "deadline_s": self.deadline_s,
            "tasks": {"total": self.tasks_total, "done": self.tasks_done, "left": self.tasks_left,
                      "quarantined": self.tasks_quarantined},
            "samples": self.samples,
            "instances": {"launched": self.instances_launched, "max_concurrent": self.max_concurrent},
            "sim_wall_s": round(self.sim_wall_s, 3),
            "promise": None if self.promise is None else self.promise.to_json(),
        }


class Simulation:
    def __init__(
        self,
        inventory: Inventory,
        workload: SimWorkload,
        goal: Goal = Goal(),
        config: ControllerConfig = ControllerConfig(),
        options: SimOptions = SimOptions(),
        controller: Controller | None = None,
    ):
        self.inv = inventory
        self.types = {t.name: t for t in inventory.types}
        self.work = workload
        self.goal = goal
        self.config = config
        self.opt = options
        self.controller = controller or Controller(goal, config, private=inventory.private)
        self.rng = np.random.default_rng(options.seed)
        self.ctl_rng = np.random.default_rng(options.seed + 1_000_003)
        self.now = 0.0
        self.heap: list = []
        self._seq = 0
        self.nodes: dict[str, _Node] = {}
        self.pool = TaskPool()
        n = len(workload.runtimes_ref_s)
        self.truth = np.asarray(workload.runtimes_ref_s, dtype=float)
        self.est = None if workload.estimates_ref_s is None else np.asarray(workload.estimates_ref_s, dtype=float)
        self.ids = [f"t{i}" for i in range(n)]
        self.index = {tid: i for i, tid in enumerate(self.ids)}
        order = self.rng.permutation(n)
        self.pool.extend((self.ids[i], None if self.est is None else float(self.est[i])) for i in order)
        self.attempts = [0] * n
        self.done = np.zeros(n, dtype=bool)
        self.obs = Observations()
        self._finished = np.empty(max(n, 1))  # every finished runtime (ref-s), for the promise's law
        self.memory = Memory()
        self.committed_closed = 0.0  # cost of terminated instances
        self.book = FailureBook(options.failures)
        self.cooldown = TypeCooldown(options.failures.type_cooldown_s)
        self.fault_rng = np.random.default_rng(options.seed + 2_000_003)  # faults never shift the rest
        self.poison = (self.fault_rng.random(n) < options.poison_rate) if options.poison_rate > 0 else None
        self.result = SimResult(
            policy=config.policy, makespan_s=0.0, cost_usd=0.0, cloud_cost_usd=0.0, private_cost_usd=0.0,
            planned_makespan_s=None, planned_cost_usd=None,
            budget_usd=float(goal.value) if goal.kind == "budget" else None,
            deadline_s=float(goal.value) if goal.kind == "deadline" else None,
            tasks_total=n, tasks_done=0, samples=0, instances_launched=0, max_concurrent=0,
            sim_wall_s=0.0, max_committed_usd=0.0,
        )
        self.result.faults = {k: 0 for k in FAULT_KINDS}
        self.result.actual_work_ref_s = float(self.truth.sum())
        self._instance_seq = 0
        self._live_instances = 0
        self._dirty_nodes: set[str] = set()
        self._live: dict[str, _Node] = {}
        self._cloud_live: dict[str, _Node] = {}
        self._views: dict[str, NodeView] = {}
        self._free: dict[str, NodeView] = {}
        self._dirty: set[str] = set()
        self._billing_heap: list[tuple[float, str]] = []
        self._running = 0
        self._copies: dict[str, set[tuple[str, int]]] = {}  # task -> running (node, slot)
        for p in inventory.private:
            node = _Node(p.name, p.slots, p.speed, p.speed)
            self.nodes[p.name] = node
            self._live[p.name] = node
            self._inject_node_faults(node)
            self._touch(node)

    # -- event queue -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, data))

    # -- world -> snapshot -------------------------------------------------------------------
    def _touch(self, node: _Node) -> None:
        """The node changed: rebuild its view and its free-slot membership on next snapshot."""
        node.view = None
        self._dirty.add(node.id)

    def _view(self, node: _Node) -> NodeView:
        if node.view is None:
            running = tuple(
                RunningTask(task, att, slot, start,
                            None if self.est is None else float(self.est[self.index[task]]))
                for slot, (task, att, start, _end) in sorted(node.running.items())
            )
            paid = None if node.type is None else node.paid_until
            node.view = NodeView(
                id=node.id, slots=node.slots, speed=node.speed, running=running,
                type_name=None if node.type is None else node.type.name,
                launched_at_s=node.launched_at, ready_at_s=node.ready_at, paid_until_s=paid,
                release_at_s=node.release_at, lost=node.lost or node.down_until is not None,
            )
        return node.view

    def _refresh_billing(self, node: _Node) -> None:
        if node.type is not None and node.terminated_at is None and self.now > node.paid_until + 1e-6:
            b = node.type.billing
            node.paid_until = b.paid_until(node.launched_at, self.now)
            node.charged_usd = b.cost_usd(self.now - node.launched_at, node.type.price_per_hour)
            self._touch(node)
            heapq.heappush(self._billing_heap, (node.paid_until, node.id))

    def _advance_billing(self) -> None:
        """Charge the next unit of every instance whose paid time the clock has passed."""
        h = self._billing_heap
        while h and h[0][0] + 1e-6 < self.now:
            _, node_id = heapq.heappop(h)
            node = self.nodes[node_id]
            if node.terminated_at is None:
                self._refresh_billing(node)

    def committed_usd(self) -> float:
        self._advance_billing()
        return self.committed_closed + sum(n.charged_usd for n in self._cloud_live.values())

    def snapshot(self) -> Snapshot:
        self._advance_billing()
        for node_id in self._dirty:
            node = self.nodes[node_id]
            if node.terminated_at is not None:
                self._views.pop(node_id, None)
                self._free.pop(node_id, None)
                continue
            view = self._view(node)
            self._views[node_id] = view
            if len(node.running) < node.slots:
                self._free[node_id] = view
            else:
                self._free.pop(node_id, None)
        self._dirty.clear()
        types = self.types
        if self.cooldown.until_s:
            types = self.cooldown.restrict(self.types, [n.type.name for n in self._cloud_live.values()], self.now)
        return Snapshot(
            now_s=self.now, types=types, nodes=tuple(self._views.values()), pending=self.pool,
            free_nodes=tuple(self._free.values()), running_count=self._running,
            tasks_total=len(self.ids), tasks_done=self.result.tasks_done, observations=self.obs,
            committed_usd=self.committed_usd(), started_at_s=0.0,
            prior_mean_ref_s=self.work.prior_mean_ref_s,
            prior_sd_ref_s=self.work.prior_sd_ref_s,
            budget_usd=self.result.budget_usd, tasks_failed=len(self.result.quarantined),
            finished_ref_s=self._finished[: self.obs.count], timeout_ref_s=self.work.timeout_ref_s,
        )

    # -- actions -----------------------------------------------------------------------------
    def _apply(self, actions) -> None:
        for a in actions:
            if isinstance(a, Assign) or isinstance(a, Replicate):
                self._start(a)
            elif isinstance(a, ScheduleRelease):
                node = self.nodes.get(a.instance_id)
                if node is None or node.terminated_at is not None:
                    continue
                node.release_at = max(a.at_s, self.now)
                node.release_cause = a.cause
                node.release_version += 1
                self._touch(node)
                self._push(node.release_at, RELEASE, (node.id, node.release_version))
            elif isinstance(a, Launch):
                self._launch(a)
            elif isinstance(a, StopForBudget):
                self.result.budget_stopped = True

    def _launch(self, a: Launch) -> None:
        t = self.types[a.type_name]
        live_of_type = sum(1 for n in self._cloud_live.values() if n.type is t and n.terminated_at is None)
        count = min(a.count, max(0, t.limit - live_of_type))
        self.result.launches_refused += a.count - count
        opt, frng = self.opt, self.fault_rng
        if count and (opt.capacity_rate > 0 or opt.limit_rate > 0 or opt.partial_rate > 0
                      or t.name in opt.unavailable_types):
            u = -1.0 if t.name in opt.unavailable_types else frng.random()
            if u < opt.capacity_rate + opt.limit_rate:
                # EC2 refuses the whole call: nothing launched, nothing billed, type avoided.
                self.result.faults["capacity" if u < opt.capacity_rate else "limit"] += 1
                self.result.launches_refused += count
                self.cooldown.refused(t.name, self.now)
                return
            if count >= 2 and frng.random() < opt.partial_rate:
                self.result.faults["partial"] += 1
                self.result.launches_refused += count - count // 2
                count //= 2
        for _ in range(count):
            self._instance_seq += 1
            noise = self.opt.speed_noise
            actual = t.speed * (self.rng.uniform(1 - noise, 1 + noise) if noise > 0 else 1.0)
            node = _Node(f"i-{self._instance_seq:05d}", t.slots, t.speed, actual, type=t,
                         launched_at=self.now, ready_at=self.now + t.boot_s)
            self.nodes[node.id] = node
            self._live[node.id] = node
            self._cloud_live[node.id] = node
            self._refresh_billing(node)
            self._push(node.ready_at, READY, node.id)
            self._inject_node_faults(node)
            if math.isfinite(a.release_after_s):
                node.release_at = self.now + max(a.release_after_s, t.boot_s)
                node.release_cause = "planned_life"
                node.release_version += 1
                self._push(node.release_at, RELEASE, (node.id, node.release_version))
            self.result.instances_launched += 1
            self._live_instances += 1
        if count:
            self.result.fleet_changes.append((self.now, a.type_name, count))
            self.result.max_concurrent = max(self.result.max_concurrent, self._live_instances)

    def _start(self, a) -> None:
        node = self.nodes[a.slot.node]
        if node.terminated_at is not None or a.slot.index in node.running:
            raise AssertionError(f"controller assigned to a busy or gone slot: {a}")
        i = self.index[a.task_id]
        if isinstance(a, Assign):
            self.pool.remove(a.task_id)
        self.attempts[i] += 1
        attempt = self.attempts[i]
        duration = self.truth[i] / node.actual_speed
        end = self.now + duration
        fault = None
        if node.bad:
            fault, fail_at = "bad_node_attempt", self.now + min(duration, 5.0) * self.fault_rng.random()
        elif self.poison is not None and self.poison[i]:
            fault, fail_at = "poison_attempt", self.now + duration * self.fault_rng.random()
        elif self.opt.failure_rate > 0 and self.rng.random() < self.opt.failure_rate:
            fault, fail_at = "attempt_failure", self.now + duration * self.rng.random()
        if fault is not None:
            self.result.faults[fault] += 1
            node.running[a.slot.index] = (a.task_id, attempt, self.now, fail_at)
            self._push(fail_at, FAIL, (node.id, a.slot.index, a.task_id, attempt, fault))
        else:
            node.running[a.slot.index] = (a.task_id, attempt, self.now, end)
            self._push(end, END, (node.id, a.slot.index, a.task_id, attempt))
        self._running += 1
        self._copies.setdefault(a.task_id, set()).add((node.id, a.slot.index))
        self._touch(node)
        if a.cause == "sampling":
            self.result.samples += 1

    # -- events ------------------------------------------------------------------------------
    def _stop_attempt(self, node: _Node, slot: int) -> tuple[str, int, float, float]:
        r = node.running.pop(slot)
        self._running -= 1
        copies = self._copies.get(r[0])
        if copies is not None:
            copies.discard((node.id, slot))
            if not copies:
                del self._copies[r[0]]
        self._touch(node)
        return r

    def _on_end(self, data) -> bool:
        node_id, slot, task, attempt = data
        node = self.nodes[node_id]
        cur = node.running.get(slot)
        if cur is None or cur[0] != task or cur[1] != attempt:
            return False  # a cancelled replica or a killed attempt
        self._stop_attempt(node, slot)
        i = self.index[task]
        if self.done[i]:
            return True
        self.book.succeeded(node.id)
        self.done[i] = True
        self.result.tasks_done += 1
        self.result.completions[task] = self.result.completions.get(task, 0) + 1
        runtime_ref = (self.now - cur[2]) * node.speed
        self._finished[self.obs.count] = runtime_ref
        self.obs = self.obs.add(runtime_ref, None if self.est is None else float(self.est[i]))
        if self.result.tasks_done > 1:
            self.result.second_last_end_s = self.result.makespan_s
        self.result.makespan_s = float(self.now)
        self.result.last_runtime_s = float(self.now - cur[2])
        # First result wins: cancel the other copies.
        for other_id, other_slot in list(self._copies.get(task, ())):
            other = self.nodes[other_id]
            r = self._stop_attempt(other, other_slot)
            self.result.wasted_ref_s += (self.now - r[2]) * other.actual_speed
        return True

    def _requeue(self, task: str, retry: bool = False) -> None:
        i = self.index[task]
        if self.done[i] or task in self.pool or self._copies.get(task) or task in self.result.quarantined:
            return  # done, already pending, another copy still runs, or given up
        self.pool.add(task, None if self.est is None else float(self.est[i]), last=retry)

    def _on_fail(self, data) -> bool:
        node_id, slot, task, attempt, fault = data
        node = self.nodes[node_id]
        cur = node.running.get(slot)
        if cur is None or cur[0] != task or cur[1] != attempt:
            return False
        self._stop_attempt(node, slot)
        self.result.wasted_ref_s += (self.now - cur[2]) * node.actual_speed
        if fault == "attempt_failure":
            # transient errors differ from one another: never "the same error" twice
            signature = f"transient error {self.fault_rng.integers(1 << 30)}"
        else:
            signature = "exit code 1"  # poison tasks and bad nodes fail the same way every time
        self._failed(task, node, signature)
        return True

    def _failed(self, task: str, node: _Node, signature: str | None) -> None:
        """An attempt ended without a result: retry, or quarantine, as the book says."""
        if self.done[self.index[task]] or task in self.result.quarantined:
            return
        others = sum(1 for n in self._live.values() if n is not node and not n.lost)
        verdict = self.book.failed(task, node.id, signature, others)
        if verdict.bad_node:
            self.result.bad_nodes_found.append(node.id)
            node.lost = True  # no more work there (the daemon releases such an instance)
            self._touch(node)
            if node.type is not None and node.terminated_at is None:
                node.release_cause = "bad_node"
                node.release_version += 1
                self._push(self.now, RELEASE, (node.id, node.release_version))
        if verdict.quarantined:
            self.result.quarantined[task] = verdict.reason
            if task in self.pool:
                self.pool.remove(task)
            for other_id, other_slot in list(self._copies.get(task, ())):
                other = self.nodes[other_id]
                r = self._stop_attempt(other, other_slot)
                self.result.wasted_ref_s += (self.now - r[2]) * other.actual_speed
            return
        self._requeue(task, retry=True)

    # -- injected node faults ----------------------------------------------------------------
    def _inject_node_faults(self, node: _Node) -> None:
        opt, frng = self.opt, self.fault_rng
        if node.id in opt.bad_nodes or (opt.bad_node_rate > 0 and frng.random() < opt.bad_node_rate):
            node.bad = True
        if node.type is not None and opt.instance_loss_rate > 0 and frng.random() < opt.instance_loss_rate:
            self._push(self.now + frng.random() * node.type.billing.unit_s, LOSS, node.id)
        if opt.agent_kill_rate > 0 and frng.random() < opt.agent_kill_rate:
            start = node.ready_at if node.ready_at is not None else self.now
            self._push(start + frng.random() * 3600.0, KILL, node.id)

    def _lose_attempts(self, node: _Node) -> None:
        for slot in list(node.running):
            task, _att, start, _end = self._stop_attempt(node, slot)
            self.result.wasted_ref_s += (self.now - start) * node.actual_speed
            self._failed(task, node, None)

    def _on_loss(self, node_id: str) -> bool:
        """The instance vanished (terminated from outside): billed until now, attempts lost."""
        node = self.nodes[node_id]
        if node.terminated_at is not None:
            return False
        self.result.faults["instance_loss"] += 1
        node.lost = True
        self._lose_attempts(node)
        node.release_cause = "instance_lost"
        node.release_version += 1
        return self._on_release((node.id, node.release_version))

    def _on_kill(self, node_id: str) -> bool:
        node = self.nodes[node_id]
        if node.terminated_at is not None or node.down_until is not None:
            return False
        self.result.faults["agent_kill"] += 1
        node.down_until = self.now + self.opt.agent_restart_s
        self._lose_attempts(node)
        self._touch(node)
        self._push(node.down_until, REVIVE, node.id)
        return True

    def _on_revive(self, node_id: str) -> bool:
        node = self.nodes[node_id]
        if node.down_until is None:
            return False
        node.down_until = None
        self._touch(node)
        return node.terminated_at is None

    def _on_release(self, data) -> bool:
        node_id, version = data
        node = self.nodes[node_id]
        if node.terminated_at is not None or version != node.release_version:
            return False
        self._advance_billing()
        paid = node.type.billing.paid_until(node.launched_at, self.now)
        self.result.releases.append({
            "instance": node.id, "type": node.type.name, "at_s": self.now, "paid_until_s": paid,
            "cause": node.release_cause, "launched_at_s": node.launched_at,
        })
        killed = [self._stop_attempt(node, slot) for slot in list(node.running)]  # planned: no failure
        node.terminated_at = self.now
        self._touch(node)
        self._live.pop(node.id, None)
        self._cloud_live.pop(node.id, None)
        self._live_instances -= 1
        self.committed_closed += node.type.billing.cost_usd(self.now - node.launched_at, node.type.price_per_hour)
        for task, _att, start, _end in killed:
            self.result.wasted_ref_s += (self.now - start) * node.actual_speed
            self._requeue(task)
        return True

    # -- main loop ---------------------------------------------------------------------------
    def run(self, on_progress: Callable[[SimProgress], None] | None = None) -> SimResult:
        """Run the bag to its end (or until nothing can progress); ``on_progress`` is called at
        every monitoring tick."""
        wall0 = time.perf_counter()
        self._push(0.0, TICK, None)
        n = len(self.ids)
        idle_ticks = 0
        first_plan_seen = False
        same_time, last_t = 0, -1.0
        while self.heap and self._settled() < n:
            t, kind, _, data = heapq.heappop(self.heap)
            if t > self.opt.max_virtual_s:
                break
            self.now = t
            tick = False
            changed = False
            batch = [(kind, data)]
            while self.heap and self.heap[0][0] == t:
                _, k2, _, d2 = heapq.heappop(self.heap)
                batch.append((k2, d2))
            for k, d in batch:
                if k == TICK:
                    tick = True
                elif k == READY:
                    changed = True
                    self._touch(self.nodes[d])
                elif k == END:
                    changed |= self._on_end(d)
                elif k == FAIL:
                    changed |= self._on_fail(d)
                elif k == RELEASE:
                    changed |= self._on_release(d)
                elif k == LOSS:
                    changed |= self._on_loss(d)
                elif k == KILL:
                    changed |= self._on_kill(d)
                elif k == REVIVE:
                    changed |= self._on_revive(d)
            if self._settled() >= n:
                break
            committed = self.committed_usd()
            self.result.max_committed_usd = max(self.result.max_committed_usd, committed)
            if tick or changed:
                same_time = same_time + 1 if t == last_t else 0
                last_t = t
                if same_time > 100_000:
                    raise RuntimeError(f"no progress: {same_time} decisions at virtual time {t:.3f}s")
                decision = self.controller.decide(self.snapshot(), self.memory, self.now, self.ctl_rng, tick=tick)
                self.memory = decision.memory
                if self.result.promise is None and self.memory.first_promise is not None:
                    self.result.promise = self.memory.first_promise
                    self.result.promise_samples = self.obs.count
                p = self.memory.promise
                if p is not None and (not self.result.promise_log or self.result.promise_log[-1][3] is not p):
                    self.result.promise_log.append((self.now, self.result.tasks_done, self.obs.count, p))
                if not first_plan_seen and self.memory.planned_makespan_s is not None:
                    first_plan_seen = True
                    self.result.planned_makespan_s = self.memory.planned_makespan_s
                    self.result.planned_cost_usd = self.memory.planned_cost_usd
                    if decision.remaining is not None:
                        self.result.planned_work_ref_s = decision.remaining.upper_ref_s + self.obs.sum_ref_s
                self._apply(decision.actions)
            if tick:
                if on_progress is not None:
                    on_progress(SimProgress(self.now, self.result.tasks_done, n, committed))
                busy = self._running > 0
                alive = any(not node.lost and (node.type is None or node.release_at is None
                                               or node.release_at > self.now)
                            for node in self._live.values())
                idle_ticks = 0 if (busy or alive) else idle_ticks + 1
                if may_give_up(idle_ticks, budget_stopped=self.memory.budget_stopped,
                                types_avoided=self.cooldown.avoided(self.now), tick_s=self.config.tick_s,
                                replan_every_s=self.config.replan_every_s):
                    break  # nothing can make progress (budget exhausted, no private nodes)
                self._push(self.now + self.config.tick_s, TICK, None)
        self._finish()
        self.result.sim_wall_s = time.perf_counter() - wall0
        return self.result

    def _settled(self) -> int:
        return self.result.tasks_done + len(self.result.quarantined)

    def _finish(self) -> None:
        """Bag done (or stuck): the run ends at the last completion; release what is left."""
        end = self.now
        # The last decision releases instances (bag_done); carry those releases out.
        decision = self.controller.decide(self.snapshot(), self.memory, self.now, self.ctl_rng, tick=True)
        self._apply(decision.actions)
        while self.heap:
            t, kind, _, data = heapq.heappop(self.heap)
            if kind == RELEASE:
                self.now = max(self.now, t)
                self._on_release(data)
        for node in self.nodes.values():
            if node.type is not None and node.terminated_at is None:
                self.now = max(self.now, node.release_at or self.now)
                self._on_release((node.id, node.release_version))
        r = self.result
        r.promise_last = self.memory.promise
        r.max_committed_usd = max(r.max_committed_usd, self.committed_closed)
        r.cloud_cost_usd = self.committed_closed
        r.private_cost_usd = sum(p.cost_per_hour for p in self.inv.private) * r.makespan_s / 3600.0
        r.cost_usd = r.cloud_cost_usd + r.private_cost_usd
        if r.tasks_done < r.tasks_total and r.makespan_s == 0.0:
            r.makespan_s = end
