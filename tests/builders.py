"""Builders for controller tests: a snapshot at the edge in a few lines, no simulator.

Every builder is full of defaults; a test names only what its rule turns on::

    snap = snapshot(now_s=3400.0, nodes=[node("i-1", running=[running("t1", 0.0)])])
    d = decide(snap)
    assert releases(d) == {"i-1": (7080.0, "running_task_needs_longer")}

Defaults: one hourly machine type ``m`` (1 slot, speed 1, $0.10/h, 10 of them, no boot), an
instance launched at 0 paid to 3,600 s and released a margin before that, 60 observed
runtimes with a mean of 800 reference seconds, and a memory as if a plan had just been made
for a 4-hour deadline (so a tick dispatches and keeps, and re-plans only when asked to).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from broker.core.billing import Billing
from broker.core.control.actions import Assign, Launch, Replicate, ScheduleRelease
from broker.core.control.controller import Controller, ControllerConfig, Decision
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Memory, NodeView, Observations, RunningTask, Snapshot
from broker.core.model import MachineType, PrivateNode

HOURLY = Billing.hourly()
AUTO = object()  # node(release_at_s=AUTO): a margin before paid-until
MARGIN_S = ControllerConfig().margin_s
DEADLINE_S = 4 * 3600.0


def machine(name: str = "m", *, slots: int = 1, speed: float = 1.0, price_per_hour: float = 0.10, limit: int = 10,
            boot_s: float = 0.0, billing: Billing = HOURLY) -> MachineType:
    return MachineType(name, slots, speed, price_per_hour, limit, boot_s, billing)


M = machine()
TYPES = {"m": M}


def running(task_id: str, started_at_s: float, *, slot: int = 0, attempt: int = 1,
            estimate_ref_s: float | None = None) -> RunningTask:
    return RunningTask(task_id, attempt, slot, started_at_s, estimate_ref_s)


def node(id: str = "i-1", *, private: bool = False, type: MachineType = M, slots: int | None = None,
         speed: float | None = None, running: Iterable[RunningTask] = (), launched_at_s: float = 0.0,
         ready_at_s: float | None = None, paid_until_s: float | None = None, release_at_s=AUTO,
         lost: bool = False) -> NodeView:
    """An EC2 instance of ``type`` (launched at ``launched_at_s``, ready after its boot, paid
    for its first billed time, released ``MARGIN_S`` before that), or with ``private=True`` a
    private node (no type, no launch, no release; 1 slot of speed 1 unless told).
    ``release_at_s=None``: an instance the controller has not given a release yet."""
    if private:
        return NodeView(id, slots or 1, speed or 1.0, tuple(running), lost=lost)
    paid = launched_at_s + type.billing.billed_s(0.0) if paid_until_s is None else paid_until_s
    return NodeView(
        id, slots or type.slots, speed or type.speed, tuple(running), type.name, launched_at_s,
        launched_at_s + type.boot_s if ready_at_s is None else ready_at_s, paid,
        paid - MARGIN_S if release_at_s is AUTO else release_at_s, lost,
    )


def observations(n: int = 60, mean_ref_s: float = 800.0) -> Observations:
    """``n`` runtimes of mean ``mean_ref_s``: one half, one, and one and a half times it in turn."""
    obs = Observations()
    for k in range(n):
        obs = obs.add(mean_ref_s * (0.5 + 0.5 * (k % 3)), None)
    return obs


def pool(tasks: int | Iterable[tuple[str, float | None]] = 0) -> TaskPool:
    """Pending tasks: a count of tasks without estimates (``p0``, ``p1``, ...), or (id, estimate) pairs."""
    p = TaskPool()
    p.extend([(f"p{k}", None) for k in range(tasks)] if isinstance(tasks, int) else tasks)
    return p


def snapshot(**overrides) -> Snapshot:
    """A snapshot at ``now_s`` (default 0): nodes, pending tasks (a ``pool`` argument: a count
    or pairs), the machine types, observations and spend as given, the rest defaulted.
    ``tasks_total`` defaults to done + pending + running."""
    nodes = tuple(overrides.pop("nodes", ()))
    pending = overrides.pop("pending", 0)
    pending = pending if isinstance(pending, TaskPool) else pool(pending)
    done = overrides.pop("tasks_done", 60)
    total = overrides.pop("tasks_total", done + len(pending) + sum(len(n.running) for n in nodes))
    base = Snapshot(now_s=0.0, types=TYPES, nodes=nodes, pending=pending, tasks_total=total, tasks_done=done,
                    observations=observations(), committed_usd=0.0)
    return replace(base, **overrides)


def planned_memory(now_s: float, deadline_s: float = DEADLINE_S, **overrides) -> Memory:
    """Memory as if a plan for ``deadline_s`` (from 0) had been made 10 s before ``now_s``."""
    base = Memory(deadline_at_s=deadline_s, last_plan_at_s=now_s - 10.0, planned_makespan_s=deadline_s,
                  planned_cost_usd=1.0)
    return replace(base, **overrides)


def decide(snap: Snapshot | None = None, *, goal: Goal = Goal("deadline", DEADLINE_S), memory: Memory | None = None,
           private: Iterable[PrivateNode] = (), rng=None, tick: bool = True, **config) -> Decision:
    """One decision on ``snap`` (default: ``snapshot()``) by a controller for ``goal`` with
    ``ControllerConfig(**config)``; ``memory`` defaults to ``planned_memory(now)``."""
    snap = snapshot() if snap is None else snap
    memory = planned_memory(snap.now_s) if memory is None else memory
    ctl = Controller(goal, ControllerConfig(**config), private=tuple(private))
    return ctl.decide(snap, memory, snap.now_s, rng, tick=tick)


# -- flattening a decision: the whole assertion is one comparison -------------------------
def releases(d: Decision) -> dict[str, tuple[float, str]]:
    """instance -> (release at, cause), the last one scheduled for each."""
    return {a.instance_id: (a.at_s, a.cause) for a in d.actions if isinstance(a, ScheduleRelease)}


def launches(d: Decision) -> dict[str, int]:
    """type -> instances launched."""
    out: dict[str, int] = {}
    for a in d.actions:
        if isinstance(a, Launch):
            out[a.type_name] = out.get(a.type_name, 0) + a.count
    return out


def assigned(d: Decision) -> dict[str, str]:
    """task -> node, for new assignments (not copies)."""
    return {a.task_id: a.slot.node for a in d.actions if isinstance(a, Assign)}


def copies(d: Decision) -> dict[str, str]:
    """task -> node, for tail copies."""
    return {a.task_id: a.slot.node for a in d.actions if isinstance(a, Replicate)}
