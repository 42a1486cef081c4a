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

from .budget import private_rate_usd_per_s, unit_started_usd
from .causes import GoalKind, LaunchCause
from .estimates import RemainingWork
from .planning import PlanResult
from .snapshot import Memory, Snapshot
from .spotrates import learned_types

if TYPE_CHECKING:
    from .controller import Controller


def drifted(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> bool:
    """True when the fleet cannot finish the remaining work by the planned end (the point value
    when the plans are made for it, a deadline whose hedge waits: measured against the upper
    value, such a fleet looked off its plan at every tick and re-planned every 5 min)."""
    if ctl.goal.kind != GoalKind.BUDGET and ctl.config.hedge_later and not cost_first(ctl):
        rem = replace(rem, upper_ref_s=rem.point_ref_s)
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


def tail_size_ref_s(snap: Snapshot, rem: RemainingWork) -> float:
    """The size of the tasks that run last, for the lean packing allowance.

    Dispatch runs the largest task that fits, so what each slot runs last is among the
    smallest tasks left: the allowance is half of their mean (one per slot), not half of the
    bag's mean (LM's 2^x minutes: a mean of 1,000 reference seconds, the smallest 15). Tasks
    without an estimate count as the mean of the work left."""
    slots = sum(n.slots for n in snap.nodes if not n.lost) + sum(t.limit * t.slots for t in snap.types.values())
    left = rem.pending + rem.running
    mean = rem.point_ref_s / left if left and rem.point_ref_s > 0 else rem.mean_ref_s
    known = snap.pending.smallest_estimates_ref_s(slots)
    unknown = min(slots - len(known), snap.pending.unknown_count)
    if not known and unknown <= 0:
        return mean
    return (sum(known) + unknown * mean) / (len(known) + max(unknown, 0))


def planner_input(ctl: Controller, snap: Snapshot, now: float, rem: RemainingWork, lean: bool = False):
    # A private node that is lost (or quarantined as bad) is no capacity: planning with it
    # would leave its work to nobody.
    lost = {n.id for n in snap.nodes if n.is_private and n.lost}
    return ctl.planner.input(
        types=learned_types(ctl, snap, now),  # spot rates as the run has seen them
        private=tuple(p for p in ctl.private if p.name not in lost) if lost else ctl.private,
        nodes=snap.nodes,
        rem=rem,
        now_s=now,
        tail_ref_s=tail_size_ref_s(snap, rem) if lean else None,
    )


def solve(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, scale: float = 1.0,
          launches: bool = True) -> PlanResult:
    if scale != 1.0:
        rem = replace(rem, upper_ref_s=rem.upper_ref_s * scale, point_ref_s=rem.point_ref_s * scale)
    if ctl.config.hedge_later and ctl.goal.kind != GoalKind.BUDGET and not cost_first(ctl):
        lean = solve_hedging_later(ctl, snap, memory, now, rem, launches)
        if lean is not None:
            return lean
    return solve_plain(ctl, snap, memory, now, rem, scale, launches)


def solve_hedging_later(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                        launches: bool) -> PlanResult | None:
    """Rule "cheaper types first within a deadline; hedge later".

    The plan for the work's *point* value, with the lean allowance (no gap factor), when the
    *upper* value can still be covered by what the plan buys plus everything the limits allow
    bought at the next re-plan (``hedge_can_wait``); None otherwise (the plain plan for the upper
    value, bought now). What it buys: the hedge against a longer bag is bought only once the run
    shows it is needed, from the capacity still left, instead of at the start with the least
    efficient types (thesis LM20 at List's own makespan: +7.3% cost with the hedge bought at the
    start, +0.2% with it deferred, the deadline met; the gap factor alone cost +3.5%).
    """
    if memory.deadline_at_s is None:
        return None
    if memory.deadline_at_s <= now:
        return by_user_deadline(ctl, snap, memory, now, rem, launches)
    lean = ctl.planner.lean()

    def plan_for(work: RemainingWork) -> PlanResult:
        pin = planner_input(ctl, snap, now, work, lean=True)
        if not launches:
            pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
        return lean.cheapest_by(pin, memory.deadline_at_s - now)

    result = plan_for(replace(rem, upper_ref_s=rem.point_ref_s))
    if result.plan is None or result.cause != LaunchCause.DEADLINE_PLAN:
        return by_user_deadline(ctl, snap, memory, now, rem, launches)
    if hedge_can_wait(ctl, snap, memory, now, rem, result.plan):
        return result
    # The hedge is due: the upper value, still without the gap factor (near the deadline five
    # minutes a machine is most of what is left, and buying the fastest plan for it bought
    # 39 slow instances for the last quarter hour of thesis LL20, +13% for nothing). If even
    # that cannot be met while the point value still can, the point plan stands: the fastest
    # plan would buy whole billing units for the last minutes (thesis LL20, 2 minutes before
    # the deadline: 40 instances launched and 40 extended an hour, +12%, for work the fleet
    # finished in time).
    upper = plan_for(rem)
    if upper.plan is not None and upper.cause == LaunchCause.DEADLINE_PLAN:
        return upper
    return result


def by_user_deadline(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                     launches: bool) -> PlanResult | None:
    """Rule "an allowance that cannot be met buys no more than the deadline needs".

    The planning deadline is the user's pulled in by the tail allowance (``promises``). When no
    plan meets that one but a plan for the work's point value still meets the user's own
    deadline, the cheapest such plan (lean allowance); None otherwise (the fastest plan follows).
    What it buys: the fastest plan spreads the work over every machine to the last second, so a
    run just short of a billing boundary extends every instance by a whole unit (thesis LM20,
    2,000 tasks, deadline 1.11 h: the fastest plan extended all 55 instances into their second
    hour for 14 s of work past the first, $45.64 against List's $33.36); the cheapest plan by the
    user's deadline extends the few the remainder needs."""
    if memory.tail_allowance_s <= 0 or memory.deadline_at_s is None:
        return None
    deadline_at = memory.deadline_at_s + memory.tail_allowance_s
    if deadline_at <= now:
        return None
    for work in (rem, replace(rem, upper_ref_s=rem.point_ref_s)):  # the upper value if it can, else the point
        pin = planner_input(ctl, snap, now, work, lean=True)
        if not launches:
            pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
        result = ctl.planner.lean().cheapest_by(pin, deadline_at - now)
        if result.plan is not None and result.cause == LaunchCause.DEADLINE_PLAN:
            break
    else:
        return None
    return replace(result, reason=f"no plan meets the deadline with its tail allowance ({memory.tail_allowance_s:.0f} s): "
                                  f"the cheapest plan for the deadline itself")


def hedge_can_wait(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, plan) -> bool:
    """Whether the work's upper value fits by the deadline in what can still be had after the
    next re-plan: the plan's instances kept to the deadline (a later re-plan may extend them),
    every instance the limits still allow bought a re-plan interval from now (with its boot
    delay), the private nodes' share; each with the full packing allowance."""
    deadline, later = memory.deadline_at_s, now + ctl.config.replan_every_s
    left = rem.pending + rem.running
    mean = rem.point_ref_s / left if left else rem.mean_ref_s
    names = set(snap.types)
    capacity = sum(c for name, c in plan.capacity.items() if name not in names)  # private nodes
    for t in snap.types.values():
        allowance = ctl.planner.options.phi_s + ctl.planner.options.tail_task_fraction * mean / t.speed
        planned = plan.fleet.get(t.name, 0)
        capacity += planned * t.capacity_per_s * max(0.0, deadline - now - t.boot_s - allowance)
        room = max(0, t.limit - planned)
        capacity += room * t.capacity_per_s * max(0.0, deadline - later - t.boot_s - allowance)
    return capacity >= rem.upper_ref_s


def solve_plain(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, scale: float,
                launches: bool) -> PlanResult:
    if cost_first(ctl):
        # The cheapest point has no slack: covering the work's upper confidence value by
        # its finish means buying hours of EC2 for work that is probably not there (300-
        # task bags without estimates spent 87% over the promise on average, and
        # finished early, which nobody asked for). A cost-first run plans for the work's
        # point value; a launch still has to survive the hysteresis band.
        rem = replace(rem, upper_ref_s=min(rem.upper_ref_s, rem.point_ref_s))
    if ctl.goal.kind == GoalKind.BUDGET:
        return solve_budget(ctl.planner.for_budget(), ctl, snap, memory, now, rem, scale, launches)
    pin = planner_input(ctl, snap, now, rem)
    if not launches:  # the current fleet (and private nodes) only
        pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
    deadline_s = (memory.deadline_at_s or math.inf) - now
    return ctl.planner.cheapest_by(pin, deadline_s, late_slack_s=late_slack_s(ctl, snap, memory))


LATE_SLACK = 0.05  # of the run's deadline: how much later than the fastest a passed deadline may end


def late_slack_s(ctl: Controller, snap: Snapshot, memory: Memory) -> float:
    """How much later than the fastest plan's end a passed deadline's plan may end
    (``FleetPlanner._late_plan``): the shortest re-plan gap (5 minutes), but no more than 5% of
    the deadline itself (a 2-minute dry run would otherwise give up 5 minutes to save an
    instance: the crash test's runs launched nothing)."""
    if memory.deadline_at_s is None:
        return 0.0
    return min(ctl.config.min_replan_gap_s, LATE_SLACK * max(0.0, memory.deadline_at_s - snap.started_at_s))


def solve_budget(planner, ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                 scale: float, launches: bool) -> PlanResult:
    """The fastest plan within what is left of the budget (for the upper value of the work,
    else its point value, else the share of it the budget buys: ``FleetPlanner.fastest_within``).

    Planning a budget on the point value instead (the fastest fleet for the work as estimated)
    was measured and is not used: at a baseline's cost it matched thesis LL20's List makespan
    (0.993) where this plan is 50% slower, but near the cost floor it ran out of money with
    tasks left (LM, 2,000 tasks at the knee's cost: 545 of 2,000; a reserve for the
    estimate's band made it as slow as this plan again). A budget that leaves the bag undone
    is the worse failure.
    """
    pin = planner_input(ctl, snap, now, rem)
    if not launches:
        pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
    # The planner sees existing instances paid up to their current boundary (the unit an
    # instance alive on its boundary has begun included: unit_started_usd) and decides their
    # extensions itself, so it gets the budget minus what is charged and begun, not minus
    # the units already scheduled (that would count them twice).
    # The private nodes' cost so far counts against it too (a budget is the whole bill);
    # the plan's own cost includes their share from now on.
    budget_left = float(ctl.goal.value) - snap.committed_usd - unit_started_usd(snap, now) \
        - private_rate_usd_per_s(ctl) * max(0.0, now - snap.started_at_s)
    hint = None
    if memory.last_plan is not None and memory.last_plan_at_s is not None and ctl.config.warm_start:
        # where the last plan ended, from now: the search starts there
        hint = (memory.last_plan.makespan_s - (now - memory.last_plan_at_s)) * scale
    return planner.fastest_within(pin, budget_left, rem.point_ref_s, hint_s=hint)
