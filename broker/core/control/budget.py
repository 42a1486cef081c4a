"""The budget pass: planned spend, what is affordable, and the guard that keeps the plan within it.

Budget invariant: every instance always has a scheduled release, and the planned spend (each
live instance charged up to its scheduled release, plus what terminated ones cost) never
exceeds the budget; a launch or a lengthening that would break it is cut or refused, and
``budget_guard`` pulls releases in (latest first) until the planned spend fits again.

``ctl`` is the deciding :class:`~broker.core.control.controller.Controller` (its goal and
configuration); ``s`` the decision's :class:`~broker.core.control.scratch.Scratch`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..model import MachineType
from .actions import ScheduleRelease
from .causes import GoalKind, ReleaseCause
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


def budget_left(ctl: Controller, snap: Snapshot, s: Scratch, now: float) -> float:
    budget = budget_of(ctl, snap)
    if budget is None:
        return math.inf
    return budget - planned_spend(snap, s.release, now) - s.launched_usd


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
    return planned_spend(snap, s.release, snap.now_s) + s.launched_usd + cost <= budget + 1e-9


def affordable_extension(ctl: Controller, snap: Snapshot, s: Scratch, node: NodeView, t: MachineType, target: float,
                         now: float) -> bool:
    budget = budget_of(ctl, snap)
    if budget is None:
        return True
    trial = dict(s.release)
    trial[node.id] = target
    return planned_spend(snap, trial, now) + s.launched_usd <= budget + 1e-9


def budget_guard(ctl: Controller, snap: Snapshot, memory: Memory, now: float, s: Scratch) -> None:
    """Pull releases in (latest first) until the planned spend fits the budget."""
    budget = budget_of(ctl, snap)
    if budget is None:
        return
    over = planned_spend(snap, s.release, now) + s.launched_usd - budget
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
        earliest = max(now, t.billing.paid_until(n.launched_at_s, now) - ctl.config.margin_s)
        if earliest < s.release_of(n) - 1e-9:
            before = planned_spend(snap, s.release, now)
            s.release[n.id] = earliest
            s.actions.append(ScheduleRelease(n.id, earliest, ReleaseCause.BUDGET_CAP))
            over -= before - planned_spend(snap, s.release, now)
