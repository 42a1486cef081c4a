"""One goal class (broker/core/goal.py) for plan, simulate and run, and one path from a goal to a
plan: the controller's planner gives the plan ``broker plan`` prints for the same input."""

from __future__ import annotations

import math

import pytest

from broker.core.billing import Billing
from broker.core.control import snapshot
from broker.core.control.planning import FleetPlanner, PlannerInput
from broker.core.goal import Goal, GoalKind
from broker.core.model import MachineType, PrivateNode
from broker.core.plan import Work, plan_for_goal, plan_front

TYPES = (
    MachineType("small", slots=1, speed=1.0, price_per_hour=0.10, limit=6, boot_s=60.0, billing=Billing.hourly()),
    MachineType("large", slots=4, speed=1.5, price_per_hour=0.55, limit=3, boot_s=90.0, billing=Billing.hourly()),
)
PRIVATE = (PrivateNode("lab", 2, 1.0, 0.0, local=True),)
WORK = Work(total_ref_s=40 * 1800.0, tasks=40, mean_ref_s=1800.0)


def test_plan_simulate_and_run_share_one_goal_class():
    import broker.core.plan as plan

    assert snapshot.Goal is Goal and plan.Goal is Goal
    assert Goal("deadline", 3600) == Goal(GoalKind.DEADLINE, 3600.0)
    assert Goal("theta", 0.5).kind is GoalKind.THETA
    assert Goal().kind is GoalKind.NONE and Goal().value is None


@pytest.mark.parametrize("kind, value, message", [
    ("cheapest", None, "unknown goal kind"),
    ("deadline", 0.0, "more than 0 seconds"),
    ("deadline", None, "must be a number"),
    ("budget", -1.0, "must be a number >= 0"),
    ("budget", math.nan, "must be a number >= 0"),
    ("point", 1.5, "row number"),
    ("theta", 1.5, "between 0"),
    ("none", 2.0, "no goal takes no value"),
])
def test_a_goal_that_means_nothing_is_refused_with_a_reason(kind, value, message):
    with pytest.raises(ValueError, match=message):
        Goal(kind, value)


def _pin() -> PlannerInput:
    return PlannerInput(TYPES, PRIVATE, (), WORK, 0.0)


def _same(a, b) -> bool:
    return (a.cost_usd, a.makespan_s, a.status) == (b.cost_usd, b.makespan_s, b.status)


@pytest.mark.parametrize("goal", [Goal("deadline", 4 * 3600.0), Goal("budget", 2.0)])
def test_the_controller_plans_a_deadline_or_budget_as_broker_plan_does(goal):
    printed = plan_for_goal(TYPES, PRIVATE, WORK, goal)
    planner = FleetPlanner()
    adopted = (planner.cheapest_by(_pin(), goal.value) if goal.kind is GoalKind.DEADLINE
               else planner.fastest_within(_pin(), goal.value)).plan
    assert _same(adopted, printed), (adopted, printed)


@pytest.mark.parametrize("goal", [Goal("point", 1), Goal("point", 2), Goal("theta", 0.5), Goal()])
def test_the_controller_chooses_a_front_goal_as_broker_plan_prints_it(goal):
    front = plan_front(TYPES, PRIVATE, WORK)
    planner = FleetPlanner()
    printed = planner.soonest_at_cost(_pin(), plan_for_goal(TYPES, PRIVATE, WORK, goal, front=front))
    assert _same(planner.front_choice(_pin(), goal), printed)


def test_a_point_beyond_a_run_time_front_takes_its_last_row_but_broker_plan_refuses_it():
    front = plan_front(TYPES, PRIVATE, WORK)
    beyond = Goal("point", len(front.points) + 3)
    with pytest.raises(ValueError, match="not on the front"):
        plan_for_goal(TYPES, PRIVATE, WORK, beyond, front=front)
    last = plan_for_goal(TYPES, PRIVATE, WORK, beyond, front=front, nearest=True)
    assert last is front.points[-1]
