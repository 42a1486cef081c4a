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

The run's state (pending tasks, attempts and copies, nodes, billing, failures) is the
:class:`~broker.core.control.ledger.Ledger`, the one the daemon keeps: this module is an
adapter that turns the world into ledger events and carries out what the ledger and the
controller ask. What a failure means is the ledger's FailureBook: retried up to
``retries`` times, quarantined after that or when the same error ends it on
``distinct_nodes`` nodes; a node where several tasks in a row fail while others finish is
not given work again (an instance is released).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.control.actions import Assign, Cancel, Launch, Replicate, ScheduleRelease, StopForBudget
from ..core.control.causes import Ending
from ..core.control.controller import Controller, ControllerConfig
from ..core.control.failures import FailurePolicy
from ..core.control.ledger import Ledger, NodeQuarantined, Quarantine
from ..core.control.snapshot import Memory, Snapshot
from ..core.goal import Goal
from ..core.model import Inventory, MachineType
from .spot import INTERRUPT, NOTICE, SPOT_FAULT_KINDS, TYPE_LOSS, SpotFaults, SpotWorld

TICK, READY, END, RELEASE, FAIL, LOSS, KILL, REVIVE = 0, 1, 2, 3, 4, 5, 6, 7
FAULT_KINDS = ("attempt_failure", "poison_attempt", "bad_node_attempt", "instance_loss", "agent_kill",
               "capacity", "limit", "partial") + SPOT_FAULT_KINDS


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
    spot: SpotFaults = SpotFaults()  # spot interruptions at each spot type's rate, correlated losses (spot.py)


@dataclass(slots=True)
class _Machine:
    """A node's ground truth, which the controller never sees."""

    actual_speed: float
    bad: bool = False  # fails everything it runs (injected)
    down_until: float | None = None  # agent killed, back at this time


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
    spot: dict | None = None  # spot interruptions, lost work, fallback, spend by market (None: no spot type)

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
            **({} if self.spot is None else {"spot": self.spot}),
        }


class Simulation:
    """One run of a bag on a virtual clock. The run's state is a
    :class:`~broker.core.control.ledger.Ledger`, the same the daemon keeps; this class holds
    only the world (event queue, true runtimes and speeds, injected faults) and turns it
    into ledger events."""

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
        n = len(workload.runtimes_ref_s)
        self.truth = np.asarray(workload.runtimes_ref_s, dtype=float)
        self.est = None if workload.estimates_ref_s is None else np.asarray(workload.estimates_ref_s, dtype=float)
        self.ids = [f"t{i}" for i in range(n)]
        self.index = {tid: i for i, tid in enumerate(self.ids)}
        self.memory = Memory()
        budget = float(goal.value) if goal.kind == "budget" else None
        self.ledger = Ledger(self.types, options.failures, tick_s=config.tick_s, replan_every_s=config.replan_every_s,
                             prior_mean_ref_s=workload.prior_mean_ref_s, prior_sd_ref_s=workload.prior_sd_ref_s,
                             budget_usd=budget, timeout_ref_s=workload.timeout_ref_s)
        est = [None] * n if self.est is None else self.est.tolist()
        self.ledger.add_tasks(list(zip(self.ids, est)), self.rng.permutation(n))
        self.fault_rng = np.random.default_rng(options.seed + 2_000_003)  # faults never shift the rest
        self.poison = (self.fault_rng.random(n) < options.poison_rate) if options.poison_rate > 0 else None
        self.result = SimResult(
            policy=config.policy, makespan_s=0.0, cost_usd=0.0, cloud_cost_usd=0.0, private_cost_usd=0.0,
            planned_makespan_s=None, planned_cost_usd=None, budget_usd=budget,
            deadline_s=float(goal.value) if goal.kind == "deadline" else None,
            tasks_total=n, tasks_done=0, samples=0, instances_launched=0, max_concurrent=0,
            sim_wall_s=0.0, max_committed_usd=0.0,
        )
        self.result.faults = {k: 0 for k in FAULT_KINDS}
        self.result.actual_work_ref_s = float(self.truth.sum())
        self._instance_seq = 0
        self._world: dict[str, _Machine] = {}
        self._exec: dict[tuple[str, int], float] = {}  # (task, attempt) -> start, while it runs
        self.spot = SpotWorld(self, options.spot, options.seed)
        for p in inventory.private:
            self.ledger.add_private(p)
            self.ledger.on_node_ready(p.name, 0.0)
            self._world[p.name] = machine = _Machine(p.speed)
            self._inject_node_faults(p.name, machine, None, None)

    @property
    def pool(self):
        return self.ledger.pool

    # -- event queue -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, data))

    def committed_usd(self) -> float:
        return self.ledger.committed_usd(self.now)

    def snapshot(self) -> Snapshot:
        return self.ledger.snapshot(self.now)

    # -- actions -----------------------------------------------------------------------------
    def _apply(self, actions) -> None:
        for a in actions:
            if isinstance(a, (Assign, Replicate)):
                self._start(a)
            elif isinstance(a, ScheduleRelease):
                self._timer(self.ledger.schedule_release(a.instance_id, a.at_s, a.cause, self.now))
            elif isinstance(a, Launch):
                self._launch(a)
            elif isinstance(a, StopForBudget):
                self.result.budget_stopped = True
                self.ledger.on_budget_stop()
            elif isinstance(a, Cancel):
                self._carry_out(self.ledger.cancel_attempt(a.task_id, a.attempt, a.cause, self.now))

    def _timer(self, release: ScheduleRelease | None) -> None:
        if release is not None:
            version = self.ledger.nodes[release.instance_id].release_version
            self._push(release.at_s, RELEASE, (release.instance_id, version))

    def _launch(self, a: Launch) -> None:
        """EC2 as the simulator plays it: refused past a type's limit, and the faults asked for."""
        t = self.types[a.type_name]
        count = min(a.count, max(0, t.limit - self.ledger.live_count(t.name)))
        self.result.launches_refused += a.count - count
        opt, frng = self.opt, self.fault_rng
        if count and self.spot.refuses(t.name, self.now):  # a correlated spot loss took its capacity
            self.result.faults["spot_capacity"] += 1
            self.result.launches_refused += count
            self.ledger.on_launch_failed(t.name, self.now, "capacity")
            return
        if count and (opt.capacity_rate > 0 or opt.limit_rate > 0 or opt.partial_rate > 0
                      or t.name in opt.unavailable_types):
            u = -1.0 if t.name in opt.unavailable_types else frng.random()
            if u < opt.capacity_rate + opt.limit_rate:
                # EC2 refuses the whole call: nothing launched, nothing billed, type avoided.
                kind = "capacity" if u < opt.capacity_rate else "limit"
                self.result.faults[kind] += 1
                self.result.launches_refused += count
                self.ledger.on_launch_failed(t.name, self.now, kind)
                return
            if count >= 2 and frng.random() < opt.partial_rate:
                self.result.faults["partial"] += 1
                self.result.launches_refused += count - count // 2
                count //= 2
                self.ledger.on_launch_failed(t.name, self.now, "partial")
        for _ in range(count):
            self._instance_seq += 1
            noise = self.opt.speed_noise
            actual = t.speed * (self.rng.uniform(1 - noise, 1 + noise) if noise > 0 else 1.0)
            node_id = f"i-{self._instance_seq:05d}"
            release = self.ledger.on_launched(node_id, t.name, self.now, self.now, a.release_after_s)
            self._world[node_id] = machine = _Machine(actual)
            self._push(self.now + t.boot_s, READY, node_id)
            self._inject_node_faults(node_id, machine, t, self.now + t.boot_s)
            self.spot.launched(node_id, t)
            self._timer(release)
        if count:
            self.result.fleet_changes.append((self.now, a.type_name, count))
            self.result.max_concurrent = max(self.result.max_concurrent, self.ledger.live_instances)

    def _start(self, a) -> None:
        attempt = self.ledger.start(a.task_id, a.slot.node, a.slot.index, self.now,
                                    replica=isinstance(a, Replicate), cause=a.cause)
        if attempt is None:
            raise AssertionError(f"controller assigned to a busy or gone slot, or a task not pending: {a}")
        machine = self._world[a.slot.node]
        i = self.index[a.task_id]
        duration = self.truth[i] / machine.actual_speed
        end = self.now + duration
        fault = None
        if machine.bad:
            fault, fail_at = "bad_node_attempt", self.now + min(duration, 5.0) * self.fault_rng.random()
        elif self.poison is not None and self.poison[i]:
            fault, fail_at = "poison_attempt", self.now + duration * self.fault_rng.random()
        elif self.opt.failure_rate > 0 and self.rng.random() < self.opt.failure_rate:
            fault, fail_at = "attempt_failure", self.now + duration * self.rng.random()
        self._exec[(a.task_id, attempt.attempt)] = self.now
        if fault is not None:
            self.result.faults[fault] += 1
            self._push(fail_at, FAIL, (a.slot.node, a.slot.index, a.task_id, attempt.attempt, fault))
        else:
            self._push(end, END, (a.slot.node, a.slot.index, a.task_id, attempt.attempt))

    # -- world events -> ledger events -------------------------------------------------------
    def _ended(self, task: str, attempt: int, node_id: str) -> None:
        """An attempt stopped running in the world: its work so far is wasted."""
        start = self._exec.pop((task, attempt))
        self.result.wasted_ref_s += (self.now - start) * self._world[node_id].actual_speed

    def _carry_out(self, followups) -> None:
        for f in followups:
            if isinstance(f, Cancel):
                self._ended(f.task_id, f.attempt, f.node)
            elif isinstance(f, ScheduleRelease):
                self._timer(f)
            elif isinstance(f, Quarantine):
                self.result.quarantined[f.task_id] = f.reason
            elif isinstance(f, NodeQuarantined):
                self.result.bad_nodes_found.append(f.node)

    def _on_end(self, data) -> bool:
        node_id, _slot, task, attempt = data
        e = self.ledger.on_result(node_id, task, attempt, self.now)
        if not e.changed:
            return False  # a cancelled replica or a killed attempt
        start = self._exec.pop((task, attempt))
        if e.outcome == Ending.DONE:
            self.result.tasks_done += 1
            self.result.completions[task] = self.result.completions.get(task, 0) + 1
            if self.result.tasks_done > 1:
                self.result.second_last_end_s = self.result.makespan_s
            self.result.makespan_s = float(self.now)
            self.result.last_runtime_s = float(self.now - start)
            self._carry_out(e.followups)
        return True

    def _on_fail(self, data) -> bool:
        node_id, _slot, task, attempt, fault = data
        if (task, attempt) not in self._exec:
            return False
        if fault == "attempt_failure":
            # transient errors differ from one another: never "the same error" twice
            signature = f"transient error {self.fault_rng.integers(1 << 30)}"
        else:
            signature = "exit code 1"  # poison tasks and bad nodes fail the same way every time
        e = self.ledger.on_attempt_failed(node_id, task, attempt, self.now, signature)
        self._ended(task, attempt, node_id)
        self._carry_out(e.followups)
        return True

    def _inject_node_faults(self, node_id: str, machine: _Machine, t: MachineType | None,
                            ready_at: float | None) -> None:
        opt, frng = self.opt, self.fault_rng
        if node_id in opt.bad_nodes or (opt.bad_node_rate > 0 and frng.random() < opt.bad_node_rate):
            machine.bad = True
        if t is not None and opt.instance_loss_rate > 0 and frng.random() < opt.instance_loss_rate:
            self._push(self.now + frng.random() * t.billing.unit_s, LOSS, node_id)
        if opt.agent_kill_rate > 0 and frng.random() < opt.agent_kill_rate:
            start = ready_at if ready_at is not None else self.now
            self._push(start + frng.random() * 3600.0, KILL, node_id)

    def _lose(self, node_id: str, **how) -> None:
        ended, followups = self.ledger.on_node_lost(node_id, self.now, **how)
        for e in ended:
            self._ended(e.attempt.task_id, e.attempt.attempt, node_id)
            self._carry_out(e.followups)

    def _on_loss(self, node_id: str) -> bool:
        """The instance vanished (terminated from outside): billed until now, attempts lost."""
        if self.ledger.nodes[node_id].terminated_at_s is not None:
            return False
        self.result.faults["instance_loss"] += 1
        self._lose(node_id, gone=True)
        return self._release(node_id)

    def _on_kill(self, node_id: str) -> bool:
        machine = self._world[node_id]
        if self.ledger.nodes[node_id].terminated_at_s is not None or machine.down_until is not None:
            return False
        self.result.faults["agent_kill"] += 1
        machine.down_until = self.now + self.opt.agent_restart_s
        self._lose(node_id, comes_back=True)
        self._push(machine.down_until, REVIVE, node_id)
        return True

    def _on_revive(self, node_id: str) -> bool:
        machine = self._world[node_id]
        if machine.down_until is None:
            return False
        machine.down_until = None
        return self.ledger.on_node_back(node_id, self.now)

    def _on_release(self, data) -> bool:
        node_id, version = data
        if not self.ledger.release_due(node_id, version):
            return False
        return self._release(node_id)

    def _release(self, node_id: str) -> bool:
        node = self.ledger.nodes[node_id]
        self.result.releases.append({
            "instance": node.id, "type": node.type.name, "at_s": self.now,
            "paid_until_s": node.type.billing.paid_until(node.launched_at_s, self.now),
            "cause": node.release_cause, "launched_at_s": node.launched_at_s,
        })
        self._carry_out(self.ledger.on_released(node_id, self.now))  # planned: no failure
        return True

    # -- main loop ---------------------------------------------------------------------------
    _HANDLERS = {END: _on_end, FAIL: _on_fail, RELEASE: _on_release, LOSS: _on_loss, KILL: _on_kill,
                 REVIVE: _on_revive, NOTICE: lambda self, d: self.spot.on_notice(d),
                 INTERRUPT: lambda self, d: self.spot.on_interrupt(d), TYPE_LOSS: lambda self, d: self.spot.on_type_loss(d)}

    def run(self, on_progress: Callable[[SimProgress], None] | None = None) -> SimResult:
        """Run the bag to its end (or until nothing can progress); ``on_progress`` is called at
        every monitoring tick."""
        wall0 = time.perf_counter()
        self._push(0.0, TICK, None)
        self.spot.start()
        n = len(self.ids)
        ledger = self.ledger
        first_plan_seen = False
        same_time, last_t = 0, -1.0
        while self.heap and ledger.settled < n:
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
                    ledger.on_node_ready(d, t)
                    changed = True
                else:
                    changed |= self._HANDLERS[k](self, d)
            if ledger.settled >= n:
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
                    self.result.promise_samples = self.ledger.obs.count
                p = self.memory.promise
                if p is not None and (not self.result.promise_log or self.result.promise_log[-1][3] is not p):
                    self.result.promise_log.append((self.now, self.result.tasks_done, self.ledger.obs.count, p))
                if not first_plan_seen and self.memory.planned_makespan_s is not None:
                    first_plan_seen = True
                    self.result.planned_makespan_s = self.memory.planned_makespan_s
                    self.result.planned_cost_usd = self.memory.planned_cost_usd
                    if decision.remaining is not None:
                        self.result.planned_work_ref_s = decision.remaining.upper_ref_s + self.ledger.obs.sum_ref_s
                self._apply(decision.actions)
            if tick:
                if on_progress is not None:
                    on_progress(SimProgress(self.now, self.result.tasks_done, n, committed))
                if ledger.on_tick(self.now, self.memory.budget_stopped, self.memory.private_stopped):
                    break  # nothing can make progress (budget exhausted, no private nodes)
                self._push(self.now + self.config.tick_s, TICK, None)
        self._finish()
        self.result.sim_wall_s = time.perf_counter() - wall0
        return self.result

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
        for node in list(self.ledger.nodes.values()):
            if node.type is not None and node.terminated_at_s is None:
                self.now = max(self.now, node.release_at_s or self.now)
                self._release(node.id)
        r = self.result
        r.samples = len(self.ledger.sample_keys)
        r.instances_launched = self.ledger.instances_launched
        r.cloud_cost_usd = self.ledger.committed_usd(self.now)
        r.max_committed_usd = max(r.max_committed_usd, r.cloud_cost_usd)
        r.private_cost_usd = self.ledger.private_cost_usd()
        r.promise_last = self.memory.promise
        r.cost_usd = r.cloud_cost_usd + r.private_cost_usd
        if self.spot.active:
            r.spot = self.spot.report()
        if r.tasks_done < r.tasks_total and r.makespan_s == 0.0:
            r.makespan_s = end
