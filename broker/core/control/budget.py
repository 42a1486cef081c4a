"""The budget pass: planned spend, what is affordable, and the guard that keeps the plan within it.

A budget is the user's whole bill: cloud spend and the private nodes' cost, which runs at
``cost_per_hour`` over the makespan (the report, ``status`` and the metrics count it so). The
cap left it out once, and ``--budget 201.8`` on thesis LM (20,000 tasks) spent $205.35.

Budget invariant: every instance always has a scheduled release, and the total planned spend
(``total_spend``: each live instance charged up to its scheduled release, what terminated ones
cost, and the private nodes' cost up to the run's planned end, the latest of those releases and
the expected end of the private nodes' running tasks) never exceeds the budget; a launch or a
lengthening that would break it is cut or refused, ``budget_guard`` pulls releases in (latest
first) until it fits again, and ``private_until_s`` is the moment the budget stops paying for
private time: no private task starts that would end after it, and one still running when it
comes is cancelled (``stop_private_work``).

``ctl`` is the deciding :class:`~broker.core.control.controller.Controller` (its goal and
configuration); ``s`` the decision's :class:`~broker.core.control.scratch.Scratch`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..model import MachineType
from .actions import Cancel, ScheduleRelease
from .causes import GoalKind, ReleaseCause, WorkCause
from .scratch import Scratch
from .snapshot import Memory, NodeView, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


def planned_spend(snap: Snapshot, release: dict[str, float], now: float) -> float:
    """Committed spend plus what every live instance will cost up to its scheduled release."""
    total = snap.committed_usd
    for n in snap.nodes:
        if n.is_private or n.launched_at_s is None:
            continue
        t = snap.types[n.type_name]
        rel = release.get(n.id, n.release_at_s)
        if rel is None:
            continue
        so_far = t.billing.cost_usd(max(now, n.launched_at_s) - n.launched_at_s, t.price_per_hour)
        planned = t.billing.cost_usd(max(rel, now) - n.launched_at_s, t.price_per_hour)
        total += max(0.0, planned - so_far)
    return total


def on_its_boundary(n: NodeView, now: float) -> bool:
    """An instance alive exactly on its billing boundary, not released there: it has begun
    the next unit (EC2 charges a unit once the instance is running when it starts)."""
    return (not n.is_private and not n.lost and n.launched_at_s is not None and n.paid_until_s is not None
            and n.paid_until_s <= now + 1e-6 and (n.release_at_s is None or n.release_at_s > now + 1e-6))


def paid_until_alive(t: MachineType, n: NodeView, now: float) -> float:
    """Where the instance's paid time ends, seen from ``now`` while it is alive: on its boundary
    that is the end of the unit beginning there, not ``now``."""
    return t.billing.paid_until(n.launched_at_s, now + 1e-3 if on_its_boundary(n, now) else now)


def unit_started_usd(snap: Snapshot, now: float) -> float:
    """Rule "an instance alive on its billing boundary has begun the next unit".

    The ledger charges a unit once the clock passes the boundary; a decision on the boundary
    itself saw the instance as paid only to ``now``, so a budget plan released it there, where
    EC2 starts the next unit (600 s units, a $0.50 budget: a surplus seen at 7,680 s = launch
    + 2 units, released at 7,680 s; tests/test_sim_properties.py). The planner now counts
    such an instance as paid to the end of that unit (``unit_started``), and this is what that
    unit costs, taken from the money a budget plan may spend: keeping the instance without
    counting it spent what the plan meant for the rest of the bag (league, LM20 without
    estimates at $18.84: 154 tasks left)."""
    total = 0.0
    for n in snap.nodes:
        if on_its_boundary(n, now):
            t = snap.types[n.type_name]
            total += t.billing.cost_usd(paid_until_alive(t, n, now) - n.launched_at_s, t.price_per_hour) \
                - t.billing.cost_usd(now - n.launched_at_s, t.price_per_hour)
    return total


def private_rate_usd_per_s(ctl: Controller) -> float:
    """What the private nodes cost per second of the run (always on: every node, idle or not)."""
    return sum(p.cost_per_hour for p in ctl.private) / 3600.0


def run_end_s(snap: Snapshot, release: dict[str, float], now: float, also: float = -math.inf) -> float:
    """The latest the run is planned to work: the last scheduled release of a live instance and
    the expected end of the private nodes' running tasks (``also``: one more moment, a launch's)."""
    end = max(now, also)
    mean = snap.observations.mean_ref_s or snap.prior_mean_ref_s or 0.0
    for n in snap.nodes:
        if n.is_private:
            for r in n.running:
                size = r.estimate_ref_s if r.estimate_ref_s is not None else mean
                end = max(end, r.started_at_s + size / n.speed)
            continue
        rel = release.get(n.id, n.release_at_s)
        if rel is not None and not n.lost:
            end = max(end, rel)
    return end


def total_spend(ctl: Controller, snap: Snapshot, release: dict[str, float], now: float,
                also: float = -math.inf) -> float:
    """Planned cloud spend plus the private nodes' cost up to the run's planned end."""
    cloud = planned_spend(snap, release, now)
    rate = private_rate_usd_per_s(ctl)
    if rate <= 0:
        return cloud
    return cloud + rate * max(0.0, run_end_s(snap, release, now, also) - snap.started_at_s)


def private_until_s(ctl: Controller, snap: Snapshot, s: Scratch, now: float) -> float:
    """The moment the budget stops paying for private time, the cloud's planned spend paid."""
    budget = budget_of(ctl, snap)
    rate = private_rate_usd_per_s(ctl)
    if budget is None or rate <= 0:
        return math.inf
    return snap.started_at_s + (budget - planned_spend(snap, s.release, now) - s.launched_usd) / rate


def stop_private_work(ctl: Controller, snap: Snapshot, now: float, s: Scratch) -> bool:
    """Cancel the private nodes' running tasks when the budget cannot pay for another tick of
    private time; True when private time is spent (nothing more starts there)."""
    if budget_of(ctl, snap) is None or not ctl.private:
        return False
    until = private_until_s(ctl, snap, s, now)
    if now + ctl.config.tick_s <= until:
        return False
    for n in snap.nodes:
        if n.is_private:
            for r in n.running:
                s.actions.append(Cancel(r.task_id, r.attempt, WorkCause.PRIVATE_BUDGET_SPENT))
    return True


def budget_left(ctl: Controller, snap: Snapshot, s: Scratch, now: float) -> float:
    budget = budget_of(ctl, snap)
    if budget is None:
        return math.inf
    return budget - total_spend(ctl, snap, s.release, now) - s.launched_usd


def cheapest_unit(snap: Snapshot) -> float:
    costs = [t.billing.cost_usd(0, t.price_per_hour) for t in snap.types.values() if t.limit > 0]
    return min(costs) if costs else math.inf


def short_life_s(ctl: Controller, t: MachineType) -> float:
    """Paid life of an instance bought without a plan (sampling, FirstFit): its first
    billed time, but never so short that the release margin eats it (per-second billing
    has a 60 s minimum; keep such an instance a few margins)."""
    return t.billing.billed_s(max(t.boot_s + 4 * ctl.config.margin_s, 1.0))


def budget_of(ctl: Controller, snap: Snapshot) -> float | None:
    if ctl.goal.kind == GoalKind.BUDGET:
        return float(ctl.goal.value)
    return snap.budget_usd


def affordable(ctl: Controller, snap: Snapshot, s: Scratch, t: MachineType, count: int, life_s: float) -> bool:
    budget = budget_of(ctl, snap)
    if budget is None:
        return True
    cost = count * t.billing.cost_usd(life_s, t.price_per_hour)
    spend = total_spend(ctl, snap, s.release, snap.now_s, also=snap.now_s + life_s)
    return spend + s.launched_usd + cost <= budget + 1e-9


def affordable_extension(ctl: Controller, snap: Snapshot, s: Scratch, node: NodeView, t: MachineType, target: float,
                         now: float) -> bool:
    budget = budget_of(ctl, snap)
    if budget is None:
        return True
    trial = dict(s.release)
    trial[node.id] = target
    return total_spend(ctl, snap, trial, now) + s.launched_usd <= budget + 1e-9


def budget_guard(ctl: Controller, snap: Snapshot, memory: Memory, now: float, s: Scratch) -> None:
    """Pull releases in (latest first) until the planned spend fits the budget."""
    budget = budget_of(ctl, snap)
    if budget is None:
        return
    over = total_spend(ctl, snap, s.release, now) + s.launched_usd - budget
    if over <= 1e-9:
        return
    live = sorted(
        (n for n in snap.nodes if not n.is_private and s.release_of(n) is not None),
        key=lambda n: -(s.release_of(n)),
    )
    for n in live:
        if over <= 1e-9:
            break
        t = snap.types[n.type_name]
        earliest = max(now, paid_until_alive(t, n, now) - ctl.config.margin_s)
        if earliest < s.release_of(n) - 1e-9:
            before = total_spend(ctl, snap, s.release, now)
            s.release[n.id] = earliest
            s.actions.append(ScheduleRelease(n.id, earliest, ReleaseCause.BUDGET_CAP))
            over -= before - total_spend(ctl, snap, s.release, now)
