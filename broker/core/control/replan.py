"""When to re-plan and what to solve: drift, the goal resolved to a deadline, the solve itself.

A re-plan solves the remaining work at its upper confidence value (at its point value for
a cost-first goal: no goal, or theta 1) against the goal, with the current fleet as existing
instances. A point or theta goal is resolved once, on the front of the work's point value
(the front the user saw), into a deadline the later plans hold.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from .budget import private_rate_usd_per_s
from .causes import GoalKind
from .estimates import RemainingWork
from .planning import PlanResult
from .snapshot import Memory, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


def drifted(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> bool:
    """True when the fleet cannot finish the remaining work by the planned end."""
    if memory.planned_makespan_s is None:
        return True
    end = snap.started_at_s + memory.planned_makespan_s
    capacity = 0.0
    for n in snap.nodes:
        if n.lost:
            continue
        start = max(now, n.ready_at_s or now)
        stop = end if n.is_private else min(end, (n.release_at_s or end))
        capacity += n.slots * n.speed * max(0.0, stop - start)
    return capacity < rem.upper_ref_s * (1 - ctl.config.replan_drift) or capacity > rem.upper_ref_s * 3 + 1


def cost_first(ctl: Controller) -> bool:
    """No goal, or theta 1: the user asked for the cheapest run (its promise is the
    cheapest front point)."""
    g = ctl.goal
    return g.kind == GoalKind.NONE or (g.kind == GoalKind.THETA and g.value is not None and float(g.value) >= 1.0)


def resolve_goal(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> Memory:
    g = ctl.goal
    if memory.deadline_at_s is not None or g.kind == GoalKind.BUDGET:
        return memory
    if g.kind == GoalKind.DEADLINE:
        return replace(memory, deadline_at_s=snap.started_at_s + float(g.value))
    if g.kind in (GoalKind.POINT, GoalKind.THETA, GoalKind.NONE):
        # The point is chosen on the front the user saw: the work's point estimate. A
        # front on the upper value has other candidate makespans (its grid moves with
        # W), so "point 2" there is another promise. The plans that follow still cover
        # the upper value, by this deadline.
        pin = planner_input(ctl, snap, now, replace(rem, upper_ref_s=rem.point_ref_s))
        chosen = ctl.planner.front_choice(pin, g)
        if chosen is not None:
            return replace(memory, deadline_at_s=now + chosen.makespan_s,
                           promised_makespan_s=(now - snap.started_at_s) + chosen.makespan_s,
                           promised_cost_usd=snap.committed_usd + chosen.cost_usd)
    return memory


def planner_input(ctl: Controller, snap: Snapshot, now: float, rem: RemainingWork):
    # A private node that is lost (or quarantined as bad) is no capacity: planning with it
    # would leave its work to nobody.
    lost = {n.id for n in snap.nodes if n.is_private and n.lost}
    return ctl.planner.input(
        types=tuple(snap.types.values()),
        private=tuple(p for p in ctl.private if p.name not in lost) if lost else ctl.private,
        nodes=snap.nodes,
        rem=rem,
        now_s=now,
        unit_started=ctl.goal.kind != GoalKind.BUDGET,
    )


def solve(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, scale: float = 1.0,
          launches: bool = True) -> PlanResult:
    if scale != 1.0:
        rem = replace(rem, upper_ref_s=rem.upper_ref_s * scale, point_ref_s=rem.point_ref_s * scale)
    if cost_first(ctl):
        # The cheapest point has no slack: covering the work's upper confidence value by
        # its finish means buying hours of EC2 for work that is probably not there (300-
        # task bags without estimates spent 87% over the promise on average, and
        # finished early, which nobody asked for). A cost-first run plans for the work's
        # point value; a launch still has to survive the hysteresis band.
        rem = replace(rem, upper_ref_s=min(rem.upper_ref_s, rem.point_ref_s))
    pin = planner_input(ctl, snap, now, rem)
    if not launches:  # the current fleet (and private nodes) only
        pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
    if ctl.goal.kind == GoalKind.BUDGET:
        # The planner sees existing instances paid up to their current boundary and
        # decides their extensions itself, so it gets the budget minus what is charged,
        # not minus the units already scheduled (that would count them twice).
        # The private nodes' cost so far counts against it too (a budget is the whole bill);
        # the plan's own cost includes their share from now on.
        budget_left = float(ctl.goal.value) - snap.committed_usd - private_rate_usd_per_s(ctl) * max(
            0.0, now - snap.started_at_s)
        hint = None
        if memory.last_plan is not None and memory.last_plan_at_s is not None and ctl.config.warm_start:
            # where the last plan ended, from now: the search starts there
            hint = (memory.last_plan.makespan_s - (now - memory.last_plan_at_s)) * scale
        return ctl.planner.fastest_within(pin, budget_left, rem.point_ref_s, hint_s=hint)
    deadline_s = (memory.deadline_at_s or math.inf) - now
    return ctl.planner.cheapest_by(pin, deadline_s)
