"""Planning the fleet (ALGORITHMS.md 3): how many instances of which type, for how long.

- ``min_cost``: the cheapest plan that meets a deadline (the aggregate ILP, 3.1)
- ``min_makespan``: the fastest plan within a budget (3.2)
- ``plan_front``/``pareto_front``, ``choose_point``, ``choose_theta``: the front's knee points, its
  cheapest plan, and picking from them (3.3)
- ``pnorm_allocation``: p-norm workloads (3.4); ``bats_configuration``: BaTS's policy (3.5)
- ``fluid_lower_bound``: the bound quality figures are measured against (3.6)
"""

from .bats import bats_configuration
from .bound import fluid_lower_bound
from .front import Front, choose_point, choose_theta, pareto_front, plan_front
from .goal import GOAL_KINDS, Goal, choose_on_front, plan_for_goal
from .mincost import min_cost
from .pnorm import pnorm_allocation
from .search import min_makespan
from .types import HEURISTIC, OPTIMAL, TIME_LIMIT, Extension, NewGroup, NoFeasiblePlan, Plan, PlanOptions, Work

__all__ = [
    "GOAL_KINDS", "HEURISTIC", "OPTIMAL", "TIME_LIMIT",
    "Extension", "Front", "Goal", "NewGroup", "NoFeasiblePlan", "Plan", "PlanOptions", "Work",
    "bats_configuration", "choose_point", "choose_theta", "fluid_lower_bound", "min_cost",
    "choose_on_front", "min_makespan", "pareto_front", "plan_front", "plan_for_goal", "pnorm_allocation",
]
