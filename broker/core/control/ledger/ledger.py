"""The run ledger: the one owner of a run's state after ``decide()``.

Every lifecycle rule of tasks, attempts and nodes is written here once, and both the
simulator (``broker/sim/engine.py``) and the live daemon (``broker/shells/run/``) feed it
the same events, so they cannot drift apart (ARCHITECTURE.md "Run ledger"):

- tasks: the pending pool, attempts and their copies, done and quarantined tasks, the
  runtimes observed; *requeue* (a task goes back to the pool unless it is done, pending,
  given up or still has a copy running; a retry goes behind the tasks waiting), *first
  result wins* (the other copies are cancelled), *after a failure* (the
  :class:`~broker.core.control.failures.FailureBook` counts it against the task and the
  node: retry, quarantine and cancel the copies, or stop using a bad node and release it);
- nodes: one :class:`NodeRecord` per node (slots, speed, type, launch, readiness,
  paid-until, scheduled release with its version and cause, lost, running slots), the
  *release after launch* rule (``launch + max(release_after_s, boot)``), type cooldowns,
  the *stall watch* (give up when nothing runs and nothing can);
- the frozen :class:`~broker.core.control.snapshot.Snapshot` ``decide()`` reads, built
  incrementally: only the nodes an event touched get a new view, billing is refreshed from a
  heap of paid-until times, so an event costs O(its node), not O(fleet).

Pure: every method takes the time as an argument. Events return what the shell must carry
out (:mod:`.records`: ``Cancel``, ``ScheduleRelease``) and what the journal records
(``Requeue``, ``Quarantine``, ``NodeQuarantined``); the ledger has already changed itself.
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from ...model import MachineType, PrivateNode
from ..actions import Cancel, Launch, ScheduleRelease
from ..causes import Ending, ReleaseCause, WorkCause
from ..failures import FailureBook, FailurePolicy, TypeCooldown, may_give_up
from ..pool import TaskPool
from ..snapshot import Observations
from .inflight import InflightMixin
from .queue import QueueMixin
from .records import STALE, Attempt, Ended, Followup, NodeQuarantined, NodeRecord, Quarantine, Requeue
from .snapshots import SnapshotMixin
from .spot import SpotMixin


# Instances of a type that never came up (their agent could not start, or the bag's setup
# failed) before the type is given up for the run, while none of its instances ever did: an
# AMI without python3 or a login that never works would otherwise relaunch an instance, and
# pay a billing unit, at every tick (a test with a broken agent launched 294 in 14 minutes).
BROKEN_AFTER = 3

# Launch failures that make a type avoided for ``FailurePolicy.type_cooldown_s``: asking
# again at once would only fail again (EC2's capacity comes back by itself). A launch still
# timing out after its retries counts too: asking again at every tick would stall the loop.
AVOID_KINDS = ("capacity", "limit", "partial", "timeout")


def planned_life_s(t: MachineType, release_after_s: float) -> float:
    """How long an instance launched with ``release_after_s`` lives: never released before it
    has booted; a launch without a planned release (inf) is priced for one billing unit."""
    if not math.isfinite(release_after_s):
        return t.billing.unit_s
    return max(release_after_s, t.boot_s)


def launch_cost_usd(t: MachineType, launch: Launch) -> float:
    """What a launch will be charged over its planned life (the user's confirmation)."""
    return launch.count * t.billing.cost_usd(planned_life_s(t, launch.release_after_s), t.price_per_hour)


def private_cost_usd(nodes: Iterable[NodeRecord | PrivateNode], makespan_s: float) -> float:
    """Private nodes' amortized cost: their ``cost_per_hour`` over the run's makespan."""
    return sum(n.cost_per_hour for n in nodes if getattr(n, "type", None) is None) * makespan_s / 3600.0


class Ledger(SnapshotMixin, InflightMixin, SpotMixin, QueueMixin):
    """A run's tasks, attempts and nodes (see the module docstring)."""

    def __init__(self, types: Mapping[str, MachineType], policy: FailurePolicy = FailurePolicy(), *,
                 tick_s: float = 60.0, replan_every_s: float = 900.0, prior_mean_ref_s: float | None = None,
                 prior_sd_ref_s: float | None = None, budget_usd: float | None = None,
                 timeout_ref_s: float | None = None) -> None:
        self.types = dict(types)
        self.timeout_ref_s = timeout_ref_s  # the bag's timeout at the fastest speed: no task runs longer
        self.policy = policy
        self.tick_s, self.replan_every_s = tick_s, replan_every_s
        self.prior_mean_ref_s, self.prior_sd_ref_s, self.budget_usd = prior_mean_ref_s, prior_sd_ref_s, budget_usd
        self.book = FailureBook(policy)
        self.cooldown = TypeCooldown(policy.type_cooldown_s)
        self.never_up: dict[str, int] = {}  # type -> instances lost before they were ready
        self.broken_types: set[str] = set()  # given up for the run (BROKEN_AFTER)
        self.pool = TaskPool()
        self.estimates: dict[str, float | None] = {}
        self.attempts: dict[str, int] = {}  # task -> highest attempt started
        self.done: set[str] = set()
        self.quarantined: dict[str, str] = {}  # task -> reason
        self.sampled: set[str] = set()
        self.sample_keys: set[tuple[str, int]] = set()  # (task, attempt) drawn as samples
        self.obs = Observations()
        self._finished = np.empty(64)  # every finished runtime (ref-s) in order, for the promise's law
        self.last_done_s = 0.0
        self.budget_stopped = False
        self.nodes: dict[str, NodeRecord] = {}
        self.bad_nodes: list[str] = []
        self.instances_launched = 0
        self.inflight: dict[str, int] = {}  # launches sent, not answered: client token -> count (inflight.py)
        self.idle_ticks = 0
        self._copies: dict[str, dict[tuple[str, int], Attempt]] = {}  # task -> (node, slot) -> attempt
        self._live: dict[str, NodeRecord] = {}  # not terminated
        self._cloud_live: dict[str, NodeRecord] = {}
        self._live_by_type: dict[str, int] = {}
        self._alive = 0  # not terminated and not lost
        self._running = 0
        self._closed_usd = 0.0  # charges of terminated instances
        self._live_usd = 0.0  # charges so far of the live ones (a running sum: O(1) a query)
        self._billing: list[tuple[float, str]] = []
        self._booting: list[tuple[float, str]] = []
        self._init_views()  # the snapshot's views and indexes (snapshots.py)
        self._init_spot()  # spot interruptions (spot.py)

    @classmethod
    def from_journal(cls, rows, types: Mapping[str, MachineType], tasks: Sequence[tuple[str, float | None]],
                     speeds: Mapping[str, float], order: Iterable[int] | None = None, **options):
        """A ledger rebuilt from a journal's rows (:mod:`.resume`); returns it with what the
        shell must still reconcile with the world (:class:`~.resume.Restored`)."""
        from .resume import restore

        ledger = cls(types, **options)
        ledger.estimates.update(tasks)
        restored = restore(ledger, rows, speeds)
        ledger.add_tasks(tasks, order)
        return ledger, restored

    # -- tasks -------------------------------------------------------------------------------
    def add_tasks(self, tasks: Sequence[tuple[str, float | None]], order: Iterable[int] | None = None) -> None:
        """The bag: ``(task id, estimate in reference s)``; pooled in ``order`` (indexes into
        ``tasks``; a shuffle for fairness), except those already done or given up."""
        self.estimates.update(tasks)
        indexes = range(len(tasks)) if order is None else order
        settled = self.done or self.quarantined
        self.pool.extend(tasks[i] for i in indexes
                         if not settled or (tasks[i][0] not in self.done and tasks[i][0] not in self.quarantined))

    @property
    def tasks_total(self) -> int:
        return len(self.estimates)

    @property
    def settled(self) -> int:
        return len(self.done) + len(self.quarantined)

    @property
    def running_count(self) -> int:
        return self._running

    @property
    def finished(self) -> bool:
        """Every task done or given up, and nothing left running."""
        return self.settled >= self.tasks_total and self._running == 0

    def copies(self, task_id: str) -> list[Attempt]:
        return list(self._copies.get(task_id, {}).values())

    def adopt_done(self, task_id: str, attempt: int, runtime_ref_s: float, estimate_ref_s: float | None = None) -> None:
        """A task another command already ran to success (``broker plan --sample``); its
        estimate (when the bag has one) corrects the others' as a finished task's does."""
        self.done.add(task_id)
        self.attempts[task_id] = max(self.attempts.get(task_id, 0), attempt)
        self.sampled.add(task_id)
        self.sample_keys.add((task_id, attempt))
        self.observe(runtime_ref_s, estimate_ref_s if estimate_ref_s is not None else self.estimates.get(task_id))

    def observe(self, runtime_ref_s: float, estimate_ref_s: float | None) -> None:
        n = self.obs.count
        if n == len(self._finished):
            self._finished = np.concatenate([self._finished, np.empty(n)])
        self._finished[n] = runtime_ref_s
        self.obs = self.obs.add(runtime_ref_s, estimate_ref_s)

    @property
    def finished_ref_s(self) -> np.ndarray:
        """Every finished runtime so far (reference seconds), in the order they finished."""
        return self._finished[: self.obs.count]

    def _requeue(self, task: str, retry: bool, cause: str) -> Requeue | None:
        if (task in self.done or task in self.pool or self._copies.get(task)
                or task in self.quarantined or task not in self.estimates):
            return None  # done, already pending, another copy still runs, or given up
        self.pool.add(task, self.estimates[task], last=retry)
        return Requeue(task, retry, cause)

    # -- attempts ----------------------------------------------------------------------------
    def start(self, task_id: str, node_id: str, slot: int, now: float, *, replica: bool = False,
              cause: str = "") -> Attempt | None:
        """Start the next attempt of a task in a slot (an ``Assign``, or a ``Replicate`` with
        ``replica``). None, changing nothing, when the slot cannot take it (busy, its node
        gone, lost or not ready) or the task is not pending (not running, for a replica)."""
        node = self.nodes.get(node_id)
        if (node is None or not node.alive or node.down or node.ready_at_s is None
                or slot in node.running or not self._position_ok(node, slot)):
            return None
        if replica:
            if not self._copies.get(task_id):
                return None
        elif task_id not in self.pool:
            return None
        else:
            self.pool.remove(task_id)
        n = self.attempts.get(task_id, 0) + 1
        self.attempts[task_id] = n
        a = Attempt(task_id, n, node_id, slot, now)
        self._run(node, a)
        if self.spot_barred:
            self._spot_started(task_id, node)
        if cause == "sampling" and task_id not in self.sampled:
            self.sampled.add(task_id)
            self.sample_keys.add((task_id, n))
        return a

    def resume_attempt(self, task_id: str, attempt: int, node_id: str, started_at_s: float) -> Attempt | None:
        """An attempt a previous daemon started, kept on its node's first free slot."""
        node = self.nodes.get(node_id)
        if node is None or task_id not in self.estimates or task_id in self.done or task_id in self.quarantined:
            return None
        free = self._free_positions(node)
        if not free:
            return None
        if task_id in self.pool:
            self.pool.remove(task_id)
        self.attempts[task_id] = max(self.attempts.get(task_id, 0), attempt)
        a = Attempt(task_id, attempt, node_id, free[0], started_at_s, resumed=True)
        self._run(node, a)
        return a

    def _run(self, node: NodeRecord, a: Attempt) -> None:
        node.running[a.slot] = a
        node.idle_since_s = None
        self._copies.setdefault(a.task_id, {})[(a.node, a.slot)] = a
        self._running += 1
        self._count_running(node, a, 1)
        self._touch(node)

    def _stop(self, a: Attempt, now: float) -> None:
        node = self.nodes[a.node]
        del node.running[a.slot]
        if not node.running:
            node.idle_since_s = now
        self._running -= 1
        self._count_running(node, a, -1)
        copies = self._copies[a.task_id]
        del copies[(a.node, a.slot)]
        if not copies:
            del self._copies[a.task_id]
        self._touch(node)
        self._start_queued(node, a.slot, now)

    def _find(self, node_id: str, task_id: str, attempt: int) -> Attempt | None:
        for a in self._copies.get(task_id, {}).values():
            if a.attempt == attempt and a.node == node_id:
                return a
        return None

    def _cancel_copies(self, task: str, cause: str, now: float) -> list[Followup]:
        out: list[Followup] = []
        for a in list(self._copies.get(task, {}).values()):
            self._stop(a, now)
            out.append(Cancel(task, a.attempt, cause, a.node))
        return out

    def on_result(self, node_id: str, task_id: str, attempt: int, now: float,
                  runtime_s: float | None = None) -> Ended:
        """An attempt succeeded (``runtime_s``: run seconds, default since its start). The first
        result counts; the task's other copies are cancelled."""
        a = self._find(node_id, task_id, attempt)
        if a is None:
            return STALE  # a cancelled copy, a replay, or an attempt already written off
        self._stop(a, now)
        if task_id in self.done:
            return Ended(Ending.REPLICA, a)
        node = self.nodes[node_id]
        self.quarantined.pop(task_id, None)  # it did succeed after all
        self.book.succeeded(node_id)
        self.done.add(task_id)
        ref = (now - a.started_at_s if runtime_s is None else runtime_s) * node.speed
        self.observe(ref, self.estimates.get(task_id))
        self.last_done_s = now
        return Ended(Ending.DONE, a, None, tuple(self._cancel_copies(task_id, "first_result_wins", now)), ref)

    def on_attempt_failed(self, node_id: str, task_id: str, attempt: int, now: float, signature: str | None) -> Ended:
        """An attempt ended without a result; ``signature`` names the error as compared across
        nodes (an exit code, "timed out", the agent's error), None when it says nothing about
        the task."""
        a = self._find(node_id, task_id, attempt)
        if a is None:
            return STALE
        self._stop(a, now)
        return self._failed(a, signature, Ending.FAILED, now)

    def on_attempt_lost(self, node_id: str, task_id: str, attempt: int, now: float) -> Ended:
        """The node's agent no longer has the attempt (it restarted, or cancelled it without
        being asked). An attempt a dead daemon had started never reached the agent: it goes
        back to the pool at once; any other is lost (re-queued, no failure of its task)."""
        a = self._find(node_id, task_id, attempt)
        if a is None:
            return STALE
        self._stop(a, now)
        if a.resumed:
            r = self._requeue(task_id, False, "never_reached_agent")
            return Ended(Ending.CANCELLED, a, None, (r,) if r else ())
        return self._failed(a, None, Ending.LOST, now)

    def _failed(self, a: Attempt, signature: str | None, outcome: Ending, now: float) -> Ended:
        task = a.task_id
        if task in self.done or task in self.quarantined:
            return Ended(outcome, a)
        node = self.nodes[a.node]
        others = self._alive - (1 if node.alive else 0)
        if signature is None:  # lost with its node or agent: not the task's fault
            verdict = self.book.lost(task, node.id)
        else:
            verdict = self.book.failed(task, node.id, signature, others)
        followups: list[Followup] = []
        if verdict.bad_node:
            followups += self._quarantine_node(node, now)
        if verdict.quarantined:
            self.quarantined[task] = verdict.reason
            if task in self.pool:
                self.pool.remove(task)
            followups.append(Quarantine(task, verdict.reason, verdict.failures, node.id))
            followups += self._cancel_copies(task, "quarantined", now)
        else:
            r = self._requeue(task, True, "retry")
            if r is not None:
                followups.append(r)
        return Ended(outcome, a, verdict, tuple(followups))

    def quarantine_node(self, node_id: str, now: float) -> list[Followup]:
        """Give a node no more work (a bad node found again on resume); an instance is released."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return []
        return self._quarantine_node(node, now)

    def _quarantine_node(self, node: NodeRecord, now: float) -> list[Followup]:
        self.bad_nodes.append(node.id)
        self._set_lost(node)
        out: list[Followup] = [NodeQuarantined(node.id)]
        if node.type is not None and node.terminated_at_s is None:
            out.append(self._release_now(node, now, ReleaseCause.BAD_NODE))
        return out

    def _set_lost(self, node: NodeRecord) -> None:
        if node.alive:
            self._alive -= 1
        node.lost = True
        self._touch(node)

    def cancel_running(self, node_id: str, cause: str, now: float) -> list[Followup]:
        """Cancel (not fail) every attempt on the node; their tasks go back to the pool."""
        node = self.nodes.get(node_id)
        if node is None:
            return []
        stopped = self._stop_order(node)
        for a in stopped:
            self._stop(a, now)
        out: list[Followup] = [Cancel(a.task_id, a.attempt, cause, a.node) for a in stopped]
        return out + [r for r in (self._requeue(a.task_id, False, cause) for a in stopped) if r is not None]

    def cancel_attempt(self, task_id: str, attempt: int, cause: str, now: float) -> list[Followup]:
        """The controller's Cancel: stop one running attempt (not a failure); its task goes back
        to the pool unless another copy still runs. Nothing when the attempt already ended."""
        a = next((c for c in self._copies.get(task_id, {}).values() if c.attempt == attempt), None)
        if a is None:
            return []
        self._stop(a, now)
        requeued = self._requeue(task_id, False, cause)
        return [Cancel(task_id, attempt, cause, a.node)] + ([requeued] if requeued is not None else [])

    # -- nodes -------------------------------------------------------------------------------
    def add_private(self, node: PrivateNode) -> NodeRecord:
        """A private node joins (not ready until :meth:`on_node_ready`)."""
        record = NodeRecord(node.name, node.slots, node.speed, cost_per_hour=node.cost_per_hour)
        self._add(record)
        self._late[record.id] = None
        return record

    def _add(self, node: NodeRecord) -> None:
        self.nodes[node.id] = node
        self._live[node.id] = node
        self._alive += 1
        if node.type is not None:
            self._cloud_live[node.id] = node
            self._live_by_type[node.type.name] = self._live_by_type.get(node.type.name, 0) + 1
        self._touch(node)

    def on_launched(self, instance_id: str, type_name: str, launched_at_s: float, now: float,
                    release_after_s: float = math.inf) -> ScheduleRelease | None:
        """EC2 started an instance. Its planned release, when the launch had one, is
        ``launch + max(release_after_s, boot)`` (:func:`planned_life_s`)."""
        t = self.types[type_name]
        node = NodeRecord(instance_id, t.slots, t.speed, type=t, launched_at_s=launched_at_s,
                          expected_ready_s=launched_at_s + t.boot_s)
        self._add(node)
        self.instances_launched += 1
        self._refresh_billing(node, now)
        heapq.heappush(self._booting, (node.expected_ready_s, instance_id))
        if not math.isfinite(release_after_s):
            return None
        return self.schedule_release(instance_id, launched_at_s + planned_life_s(t, release_after_s),
                                     ReleaseCause.PLANNED_LIFE, now)

    def on_launch_failed(self, type_name: str, now: float, kind: str) -> float | None:
        """A launch was refused or cut short (``kind``: capacity, limit, partial, throttled,
        ...). For lack of capacity, a limit or a timeout (:data:`AVOID_KINDS`) the type is shown without
        room for new instances until the returned time, so the next plan goes around it."""
        if kind not in AVOID_KINDS:
            return None
        self.cooldown.refused(type_name, now)
        return self.cooldown.until_s[type_name]

    def on_node_ready(self, node_id: str, now: float) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.terminated_at_s is not None or node.ready_at_s is not None:
            return False
        node.ready_at_s = now
        if node.type is not None:
            self.never_up[node.type.name] = -1  # one came up: the type works
        if not node.running:
            node.idle_since_s = now
        self._late.pop(node_id, None)
        self._touch(node)
        return True

    def on_setup_failed(self, node_id: str, now: float) -> list[Followup]:
        """The bag's setup command failed on the node: no work there; an instance is released."""
        node = self.nodes.get(node_id)
        if node is None or node.terminated_at_s is not None:
            return []
        self._never_came_up(node, now)
        self._set_lost(node)
        return [self._release_now(node, now, ReleaseCause.SETUP_FAILED)] if node.type is not None else []

    def _never_came_up(self, node: NodeRecord, now: float) -> None:
        """An instance lost before it was ready: after ``BROKEN_AFTER`` of a type none of whose
        instances came up, the type is avoided for the rest of the run."""
        if node.type is None or node.ready_at_s is not None:
            return
        name = node.type.name
        if self.never_up.get(name, 0) < 0:
            return
        self.never_up[name] = self.never_up.get(name, 0) + 1
        if self.never_up[name] >= BROKEN_AFTER:
            self.broken_types.add(name)
            self.cooldown.until_s[name] = math.inf

    def on_budget_stop(self) -> None:
        """The controller stopped buying (``StopForBudget``): the stall watch ends the run sooner."""
        self.budget_stopped = True

    def reattach_allowed(self, node_id: str) -> bool:
        """Whether the node's agent may be re-attached once more (``policy.reattaches`` a run)."""
        node = self.nodes.get(node_id)
        if node is None or node.reattaches >= self.policy.reattaches:
            return False
        node.reattaches += 1
        return True

    def on_node_lost(self, node_id: str, now: float, *, comes_back: bool = False,
                     gone: bool = False) -> tuple[list[Ended], list[Followup]]:
        """The node's agent (or the node) is gone: its attempts are lost (no failure of their
        tasks, which are re-queued; see ``FailurePolicy.lost_attempts``). ``comes_back``: the agent is expected back (:meth:`on_node_back`);
        otherwise the node takes no more work and an instance is released (``gone``: EC2 says
        it no longer exists, cause ``instance_lost``; else ``node_lost``)."""
        node = self.nodes.get(node_id)
        if node is None or node.terminated_at_s is not None:
            return [], []
        if (comes_back and node.down) or (not comes_back and not gone and node.lost):
            return [], []  # already known (an instance EC2 says is gone still loses what it ran)
        if comes_back:
            node.down = True
            self._touch(node)
        else:
            if not gone:
                self._never_came_up(node, now)
            self._set_lost(node)
        ended = []
        for a in list(node.running.values()):
            if node.running.get(a.slot) is not a:
                continue  # stopped meanwhile: a copy the failure of another cancelled (a quarantine)
            self._stop(a, now)
            if node.notice_at_s is not None and not comes_back:  # gone after EC2's notice: interrupted
                follow = tuple(f for f in self._interrupted(a, node, now, WorkCause.SPOT_INTERRUPTED)
                               if not isinstance(f, Cancel))
                ended.append(Ended(Ending.INTERRUPTED, a, None, follow))
                continue
            ended.append(self._failed(a, None, Ending.LOST, now))
        followups: list[Followup] = []
        if not comes_back and node.type is not None:
            cause = ReleaseCause.INSTANCE_LOST if gone else ReleaseCause.NODE_LOST
            followups.append(self._release_now(node, now, cause))
        return ended, followups

    def on_node_away(self, node_id: str, now: float) -> bool:
        """The node stopped answering and is being reached again: it takes no new work, its
        attempts are held (its agent runs them on) until :meth:`on_node_back`, or
        :meth:`on_node_lost` once it is given up."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return False
        node.down = True
        self._touch(node)
        return True

    def on_node_back(self, node_id: str, now: float) -> bool:
        node = self.nodes.get(node_id)
        if node is None or not node.down:
            return False
        node.down = False
        self._touch(node)
        return node.terminated_at_s is None

    # -- releases ----------------------------------------------------------------------------
    def schedule_release(self, instance_id: str, at_s: float, cause: str, now: float) -> ScheduleRelease | None:
        """Set an instance's release (never in the past); each new one gets a new version, so
        a timer set for an older one is ignored (:meth:`release_due`)."""
        node = self.nodes.get(instance_id)
        if node is None or node.type is None or node.terminated_at_s is not None:
            return None
        node.release_at_s = max(at_s, now)
        node.release_cause = cause
        node.release_version += 1
        self._touch(node)
        return ScheduleRelease(instance_id, node.release_at_s, cause)

    def _release_now(self, node: NodeRecord, now: float, cause: str) -> ScheduleRelease:
        release = self.schedule_release(node.id, now, cause, now)
        assert release is not None
        return release

    def release_due(self, instance_id: str, version: int) -> bool:
        node = self.nodes.get(instance_id)
        return node is not None and node.terminated_at_s is None and node.release_version == version

    def on_released(self, instance_id: str, now: float, cause: str | None = None) -> list[Followup]:
        """The instance was terminated: its attempts are cancelled (no failure) and re-queued."""
        node = self.nodes.get(instance_id)
        if node is None or node.type is None or node.terminated_at_s is not None:
            return []
        self._advance_billing(now)
        stopped = self._stop_order(node)
        for a in stopped:
            self._stop(a, now)
        if node.alive:
            self._alive -= 1
        node.terminated_at_s = now
        node.release_cause = cause or node.release_cause
        self._live.pop(node.id, None)
        self._cloud_live.pop(node.id, None)
        self._live_by_type[node.type.name] -= 1
        self._late.pop(node.id, None)
        self._closed_usd += self._ended(node, now)  # its cost (and a spot one's exposure: spot.py)
        self._live_usd -= node.charged_usd
        if not self._cloud_live:
            self._live_usd = 0.0  # no rounding left over
        self._touch(node)
        out: list[Followup] = [Cancel(a.task_id, a.attempt, "released", a.node) for a in stopped]
        return out + [r for r in (self._requeue(a.task_id, False, "released") for a in stopped) if r is not None]

    def live_count(self, type_name: str) -> int:
        return self._live_by_type.get(type_name, 0)

    @property
    def live_instances(self) -> int:
        return len(self._cloud_live)

    def live_nodes(self) -> list[NodeRecord]:
        return list(self._live.values())

    # -- the stall watch ---------------------------------------------------------------------
    def on_tick(self, now: float, budget_stopped: bool = False, private_stopped: bool = False) -> bool:
        """A monitoring tick: True when the run should give up (nothing runs, no node is left
        to run on, and :func:`~broker.core.control.failures.may_give_up` says so). A private
        node the budget no longer pays for (``private_stopped``) is no node to run on."""
        alive = self._running > 0 or any(
            not n.lost and ((n.type is None and not private_stopped)
                            or (n.type is not None and (n.release_at_s is None or n.release_at_s > now)))
            for n in self._live.values())
        self.idle_ticks = 0 if alive else self.idle_ticks + 1
        # With no type to rent (a private-only inventory) nothing can come: no re-plan to wait for.
        return may_give_up(self.idle_ticks, budget_stopped=budget_stopped or self.budget_stopped or not self.types,
                           types_avoided=bool(self.cooldown.avoided(now) - self.broken_types), tick_s=self.tick_s,
                           replan_every_s=self.replan_every_s)

    def private_cost_usd(self) -> float:
        return private_cost_usd(self.nodes.values(), self.last_done_s)
