"""The user's goal, shared by ``broker plan``, ``broker simulate`` and ``broker run``.

One of: finish by a deadline at least cost (``deadline``, seconds from now), finish as soon
as possible within a budget (``budget``, USD), a point of the printed front (``point``, 1-based)
or a weight between cost and time on the front (``theta``: 1 cheapest, 0 fastest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..model import ExistingInstance, MachineType, PrivateNode
from ..units import format_duration
from .front import Front, choose_point, choose_theta, plan_front
from .mincost import min_cost
from .search import min_makespan
from .types import Plan, PlanOptions, Work

GOAL_KINDS = ("deadline", "budget", "point", "theta")


@dataclass(frozen=True, slots=True)
class Goal:
    kind: str
    value: float

    def __post_init__(self) -> None:
        if self.kind not in GOAL_KINDS:
            raise ValueError(f"a goal is one of {', '.join(GOAL_KINDS)}, got {self.kind!r}")
        if math.isnan(self.value) or self.value < 0:
            raise ValueError(f"the {self.kind} must be >= 0, got {self.value!r}")
        if self.kind == "deadline" and self.value <= 0:
            raise ValueError("the deadline must be more than 0 seconds from now")
        if self.kind == "point" and (self.value != int(self.value) or self.value < 1):
            raise ValueError(f"a front point is a row number 1, 2, ..., got {self.value!r}")
        if self.kind == "theta" and self.value > 1:
            raise ValueError(f"theta is between 0 (fastest) and 1 (cheapest), got {self.value!r}")

    def describe(self) -> str:
        if self.kind == "deadline":
            return f"deadline {format_duration(self.value)}"
        if self.kind == "budget":
            return f"budget ${self.value:.2f}"
        if self.kind == "point":
            return f"front point {int(self.value)}"
        return f"theta {self.value:g}"


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
) -> Plan:
    """The plan meeting ``goal``; ``front`` (when the caller has one) serves point and theta goals:
    a point is a printed row (a knee point), theta chooses among those and the cheapest plan.

    Raises NoFeasiblePlan when a deadline or budget cannot be met, ValueError for a point
    that is not on the front.
    """
    if goal.kind == "deadline":
        return min_cost(types, private, work, goal.value, existing=existing, now_s=now_s, options=options)
    if goal.kind == "budget":
        return min_makespan(types, private, work, goal.value, existing=existing, now_s=now_s, options=options)
    if front is None:
        front = plan_front(types, private, work, existing=existing, now_s=now_s, options=options)
    if goal.kind == "point":
        return choose_point(front.points, int(goal.value))
    return choose_theta(front.with_cheapest(), goal.value)
