"""The user's goal: one class for ``broker plan``, ``broker simulate`` and ``broker run``.

One of: finish by a deadline at least cost (``deadline``, seconds from the start), finish as
soon as possible within a budget (``budget``, USD), a point of the printed front (``point``,
1-based), a weight between cost and time on the front (``theta``: 1 cheapest, 0 fastest), or
no goal at all (``none``: the cheapest plan). ``broker.core.plan.plan_for_goal`` is the one
path from a goal to a plan. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from .units import format_duration


class GoalKind(StrEnum):
    DEADLINE = "deadline"  # seconds from the start, at least cost
    BUDGET = "budget"  # USD, as soon as possible
    POINT = "point"  # 1-based row of the printed front
    THETA = "theta"  # 0 fastest .. 1 cheapest
    NONE = "none"  # the cheapest point


# The kinds a user gives on the command line (``none`` is giving none).
GOAL_KINDS = tuple(k.value for k in GoalKind if k is not GoalKind.NONE)


@dataclass(frozen=True, slots=True)
class Goal:
    """``kind`` and its ``value`` (``None`` for no goal); a plain string kind is accepted and
    stored as its :class:`GoalKind`. Raises ``ValueError`` with a message fit for the user."""

    kind: GoalKind = GoalKind.NONE
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in GoalKind.__members__.values():
            raise ValueError(f"unknown goal kind {self.kind!r}: a goal is one of {', '.join(GOAL_KINDS)}")
        kind = GoalKind(self.kind)
        object.__setattr__(self, "kind", kind)
        value = self.value
        if kind is GoalKind.NONE:
            if value is not None:
                raise ValueError(f"no goal takes no value, got {value!r}")
            return
        if value is None or isinstance(value, bool) or math.isnan(value) or value < 0:
            raise ValueError(f"the {kind} must be a number >= 0, got {value!r}")
        if kind is GoalKind.DEADLINE and value <= 0:
            raise ValueError("the deadline must be more than 0 seconds from now")
        if kind is GoalKind.POINT and (value != int(value) or value < 1):
            raise ValueError(f"a front point is a row number 1, 2, ..., got {value!r}")
        if kind is GoalKind.THETA and value > 1:
            raise ValueError(f"theta is between 0 (fastest) and 1 (cheapest), got {value!r}")

    def describe(self) -> str:
        if self.kind is GoalKind.DEADLINE:
            return f"deadline {format_duration(self.value)}"
        if self.kind is GoalKind.BUDGET:
            return f"budget ${self.value:.2f}"
        if self.kind is GoalKind.POINT:
            return f"front point {int(self.value)}"
        if self.kind is GoalKind.THETA:
            return f"theta {self.value:g}"
        return "no goal (the cheapest plan)"
