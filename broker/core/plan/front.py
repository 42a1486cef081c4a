"""The Pareto front of makespan against cost, and picking a point on it (ALGORITHMS.md 3.3).

    T_lower  the fastest any plan can be (all capacity at once, boots and allowances included)
    T_upper  the time the most cost-efficient resource (least USD per reference second: a type
             at its limit, or a private node; ties pooled) needs alone; at least T_lower + dT
    dT       one billing unit: the largest planning quantum in the catalogue, made coarser (a
             whole multiple) when [T_lower, T_upper] holds more than ``max_points`` steps

Candidates are T_lower and the boundaries k dT in (T_lower, T_upper] (thesis Ch. 5.3.1, 6.3:
Pareto points have whole-unit completion times; the gap factor phi is in each machine's
allowance). Each is solved with MinCost(T); a point is kept if it is strictly cheaper than every
faster one, so the front is sorted by makespan ascending and by cost descending.

Choosing: ``choose_point(front, k)`` is the k-th row (1-based, as printed);
``choose_theta(front, theta)`` minimizes z = theta C' + (1 - theta) T' with C', T' the cost and
makespan scaled to [0, 1] over the front's ranges (Eq. 5.1; dollars and hours do not add).
"""

from __future__ import annotations

import math
from typing import Sequence

from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import Catalogue, Ramp, least_time_s
from .mincost import solve_at
from .search import fastest_horizon
from .types import Plan, PlanOptions, Work

# A point must be cheaper than every faster point by more than this (USD) to be kept.
_COST_TOL_USD = 1e-6


def pareto_front(
    types: Sequence[MachineType],
    private: Sequence[PrivateNode],
    work: Work,
    *,
    existing: Sequence[ExistingInstance] = (),
    now_s: float = 0.0,
    options: PlanOptions = PlanOptions(),
    max_points: int = 24,
) -> list[Plan]:
    """Non-dominated plans, sorted by makespan ascending. Raises NoFeasiblePlan with nothing to run on."""
    if max_points < 2:
        raise ValueError(f"a front needs max_points >= 2, got {max_points}")
    catalogue = Catalogue.build(types, private, work, existing, now_s, options)
    t_lower = fastest_horizon(catalogue, work)
    plans = [solve_at(catalogue, work, t, options) for t in candidate_horizons(catalogue, work, t_lower, max_points)]
    return non_dominated(plans)


def candidate_horizons(catalogue: Catalogue, work: Work, t_lower_s: float, max_points: int) -> list[float]:
    quanta = [o.quantum_s for o in catalogue.new] + [o.quantum_s for o in catalogue.existing]
    step_s = max(quanta, default=3600.0)
    t_upper = max(efficient_only_horizon_s(catalogue, work), t_lower_s + step_s)
    first_k, last_k = math.floor(t_lower_s / step_s) + 1, math.ceil(t_upper / step_s - 1e-9)
    stride = max(1, math.ceil((last_k - first_k + 1) / (max_points - 1)))
    ks = list(range(last_k, first_k - 1, -stride))[::-1]  # always ends at T_upper's boundary
    return [t_lower_s] + [k * step_s for k in ks]


def efficient_only_horizon_s(catalogue: Catalogue, work: Work) -> float:
    """T_upper: the makespan when only the most cost-efficient resources (tied ones pooled) run."""
    pool: list[tuple[float, Ramp]] = []
    for o in catalogue.new:
        per_ref_s = o.type.price_per_hour / 3600.0 / o.rate_per_s
        pool.append((per_ref_s, Ramp(o.rate_per_s * o.limit, o.start_s, math.inf)))
    for p in catalogue.private:
        pool.append((p.cost_per_ref_s_usd(), Ramp(p.rate_per_s, p.start_s, math.inf)))
    if not pool:
        return 0.0
    best = min(price for price, _ in pool)
    ramps = [ramp for price, ramp in pool if price <= best * (1 + 1e-9)]
    ramps += [o.ramp(0) for o in catalogue.existing]  # paid time is free
    return least_time_s(ramps, work.total_ref_s)


def non_dominated(plans: Sequence[Plan]) -> list[Plan]:
    front: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.makespan_s, p.cost_usd)):
        if not front or plan.cost_usd < front[-1].cost_usd - _COST_TOL_USD:
            front.append(plan)
    return front


def choose_point(front: Sequence[Plan], k: int) -> Plan:
    """The k-th point of the front, 1-based as the table prints it."""
    if not 1 <= k <= len(front):
        raise ValueError(f"point {k} is not on the front: choose 1..{len(front)}")
    return front[k - 1]


def choose_theta(front: Sequence[Plan], theta: float) -> Plan:
    """argmin theta C' + (1 - theta) T' over the front (theta = 1: cheapest, 0: fastest)."""
    if not front:
        raise ValueError("the front is empty")
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be between 0 and 1, got {theta}")

    def scaled(values: list[float]) -> list[float]:
        lo, hi = min(values), max(values)
        return [0.0 if hi <= lo else (v - lo) / (hi - lo) for v in values]

    costs = scaled([p.cost_usd for p in front])
    times = scaled([p.makespan_s for p in front])
    scores = [(theta * c + (1 - theta) * t, c + t, k) for k, (c, t) in enumerate(zip(costs, times))]
    return front[min(scores)[2]]
