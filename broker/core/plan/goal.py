"""The one path from a user's goal (:class:`broker.core.goal.Goal`) to a plan, taken by
``broker plan`` and, through the controller's planner (``broker.core.control.planning``), by
``broker simulate`` and ``broker run``: a deadline is met at least cost, a budget buys the
fastest plan it can, a point or theta is chosen on the front and no goal takes its cheapest plan.
"""

from __future__ import annotations

from typing import Sequence

from ..goal import GOAL_KINDS, Goal, GoalKind  # noqa: F401 - re-exported
from ..model import ExistingInstance, MachineType, PrivateNode
from .front import Front, choose_point, choose_theta, plan_front
from .mincost import min_cost
from .search import min_makespan
from .spotplan import spot_min_cost, spot_min_makespan
from .types import Plan, PlanOptions, Work


def choose_on_front(front: Front, goal: Goal, *, nearest: bool = False) -> Plan:
    """The front's plan for a point, theta or no goal. A point is a printed row (``nearest``:
    the nearest row there is, for a run-time front that may have fewer rows than the one the
    user saw; else a ValueError for a row that is not on it); theta chooses among the rows and
    the cheapest plan; no goal is the cheapest plan."""
    if goal.kind is GoalKind.POINT:
        row = int(goal.value)
        return choose_point(front.points, min(max(row, 1), len(front.points)) if nearest else row)
    if goal.kind is GoalKind.THETA:
        return choose_theta(front.with_cheapest(), float(goal.value))
    if goal.kind is GoalKind.NONE:
        return front.cheapest
    raise ValueError(f"a {goal.kind} goal is not chosen on the front")


def plan_for_goal(
    types: Sequence[MachineType],
    private: Sequence[PrivateNode],
    work: Work,
    goal: Goal,
    *,
    existing: Sequence[ExistingInstance] = (),
    now_s: float = 0.0,
    options: PlanOptions = PlanOptions(),
    front: Front | None = None,
    hint_s: float | None = None,
    nearest: bool = False,
    confidence: float = 0.9,
) -> Plan:
    """The plan meeting ``goal``; ``front`` (when the caller has one) serves point, theta and
    no goal (:func:`choose_on_front`, with ``nearest``); ``hint_s`` is where a budget's
    search starts. With spot offers in ``types`` a deadline is held at ``confidence`` under
    interruptions and a budget keeps a reserve for them (``spotplan.py``).

    Raises NoFeasiblePlan when a deadline or budget cannot be met, ValueError for a point
    that is not on the front.
    """
    spot = any(t.is_spot for t in types)
    if spot and goal.kind is GoalKind.DEADLINE:
        return spot_min_cost(types, private, work, goal.value, existing=existing, now_s=now_s, options=options,
                             confidence=confidence)
    if spot and goal.kind is GoalKind.BUDGET:
        return spot_min_makespan(types, private, work, goal.value, existing=existing, now_s=now_s, options=options,
                                 confidence=confidence, hint_s=hint_s)
    if goal.kind is GoalKind.DEADLINE:
        return min_cost(types, private, work, goal.value, existing=existing, now_s=now_s, options=options)
    if goal.kind is GoalKind.BUDGET:
        return min_makespan(types, private, work, goal.value, existing=existing, now_s=now_s, options=options,
                            hint_s=hint_s)
    if front is None:
        front = plan_front(types, private, work, existing=existing, now_s=now_s, options=options)
    return choose_on_front(front, goal, nearest=nearest)
