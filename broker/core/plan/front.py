"""The Pareto front of makespan against cost, its knee points, and picking a point (ALGORITHMS.md 3.3).

    T_lower  the fastest any plan can be (all capacity at once, boots and allowances included)
    T_upper  the time the most cost-efficient resource (least USD per reference second: a type
             at its limit, or a private node; ties pooled) needs alone; at least T_lower + dT
    dT       one billing unit: the largest planning quantum in the catalogue, made coarser (a
             whole multiple) when [T_lower, T_upper] holds more than ``GRID_POINTS`` steps

MinCost(T) is solved on a grid (T_lower and the boundaries k dT up to T_upper; thesis Ch. 5.3.1,
6.3: Pareto points have whole-unit completion times), then *where the cost curve bends*: between
neighbouring horizons whose costs differ by more than ``BEND`` the midpoint is solved too, down
to one planning quantum. An even grid alone has holes: on thesis LM20 (100,000 tasks) it jumped
from 46 h / $1,166 to 163 h / $924.21 while 58 h costs $925.81, a third of the makespan for
0.17% more; the knee of the curve fell between two samples.

The printed front is its **knee points** (``knee_points``): a point is printed only if no plan
is at least ``FASTER`` (10%) faster for at most ``DEARER`` (0.5%) more. MinCost is
non-increasing, so that is MinCost(0.9 M_p) > 1.005 C_p; it is proved from a solved horizon
h >= 0.9 M_p (MinCost(0.9 M_p) >= MinCost(h)) or settled by one more solve at 0.9 M_p. Solved
costs are within the solver's relative gap of the optimum, so the test is made with that gap as
a margin. Past the knee a front often creeps on for weeks (LM20: from 55 h / $927 down to the
private node alone, 2,803 h / $896.83): each step saves less than 0.5% for 10% more time, so no
point there is printed, and the cheapest plan is kept apart (``Front.cheapest``: what a run
with no goal, or theta 1, carries out; ``broker plan`` names it under the table).

Choosing: ``choose_point(front, k)`` is the k-th printed row (1-based);
``choose_theta(front, theta)`` minimizes z = theta C' + (1 - theta) T' with C', T' the cost and
makespan scaled to [0, 1] over the candidates' ranges (Eq. 5.1; dollars and hours do not add).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import Catalogue, Ramp, least_time_s
from .mincost import solve_at
from .search import fastest_horizon
from .types import Plan, PlanOptions, Work

# A point must be cheaper than every faster point by more than this (USD) to be kept.
_COST_TOL_USD = 1e-6
# The knee test: a printed point has no plan FASTER (relative) faster for at most DEARER more.
FASTER = 0.10
DEARER = 0.005
# Neighbouring horizons whose costs differ by more than this are bisected (the curve bends there),
# until they are one planning quantum or RESOLUTION (relative) apart.
BEND = 0.005
RESOLUTION = 0.02
# Horizons of the even grid (the bisection adds where the cost moves).
GRID_POINTS = 10
# At most this many solves in all (grid, bisection, knee checks): the front's speed goal is 0.5 s
# for the thesis catalogue x60 at ~15 ms a solve.
MAX_SOLVES = 28


@dataclass(frozen=True)
class Front:
    """``points``: the knee points, by makespan ascending (the printed rows);
    ``cheapest``: the cheapest plan found (often slower than every knee point);
    ``solved``: every non-dominated plan solved on the way."""

    points: list[Plan]
    cheapest: Plan
    solved: list[Plan]

    def with_cheapest(self) -> list[Plan]:
        """The printed rows, and the cheapest plan after them when it is not one of them."""
        if any(p is self.cheapest for p in self.points):
            return list(self.points)
        return list(self.points) + [self.cheapest]


def plan_front(
    types: Sequence[MachineType],
    private: Sequence[PrivateNode],
    work: Work,
    *,
    existing: Sequence[ExistingInstance] = (),
    now_s: float = 0.0,
    options: PlanOptions = PlanOptions(),
    max_points: int = 24,
) -> Front:
    """The front's knee points and its cheapest plan. Raises NoFeasiblePlan with nothing to run on."""
    if max_points < 2:
        raise ValueError(f"a front needs max_points >= 2, got {max_points}")
    catalogue = Catalogue.build(types, private, work, existing, now_s, options)
    t_lower = fastest_horizon(catalogue, work)
    solver = _Solver(catalogue, work, options)
    for t in candidate_horizons(catalogue, work, t_lower, GRID_POINTS):
        solver.at(t)
    _bisect_bends(solver, _quantum_s(catalogue))
    points = knee_points(solver, non_dominated(solver.plans.values()))
    if len(points) > max_points:
        points = _thin(points, max_points)
    solved = non_dominated(solver.plans.values())  # with the knee checks' solves
    cheapest = next((p for p in points if same_cost_and_time(p, solved[-1])), solved[-1])
    return Front(points, cheapest, solved)


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
    """The printed front: knee points sorted by makespan ascending (``plan_front`` for the cheapest)."""
    return plan_front(types, private, work, existing=existing, now_s=now_s, options=options,
                      max_points=max_points).points


class _Solver:
    """MinCost(T) by horizon, each solved once, within a budget of solves."""

    def __init__(self, catalogue: Catalogue, work: Work, options: PlanOptions):
        self.catalogue, self.work, self.options = catalogue, work, options
        self.plans: dict[float, Plan] = {}

    @property
    def spent(self) -> bool:
        return len(self.plans) >= MAX_SOLVES

    def at(self, horizon_s: float) -> Plan:
        if horizon_s not in self.plans:
            self.plans[horizon_s] = solve_at(self.catalogue, self.work, horizon_s, self.options)
        return self.plans[horizon_s]

    def least_cost_from(self, horizon_s: float) -> float | None:
        """A lower bound on MinCost(horizon): the cost solved at the least solved horizon >= it."""
        later = [t for t in self.plans if t >= horizon_s - 1e-9]
        return self.plans[min(later)].cost_usd if later else None


def _quantum_s(catalogue: Catalogue) -> float:
    quanta = [o.quantum_s for o in catalogue.new] + [o.quantum_s for o in catalogue.existing]
    return min(quanta, default=3600.0)


def _bisect_bends(solver: _Solver, resolution_s: float) -> None:
    """Solve the midpoint of neighbouring horizons whose costs differ by more than ``BEND``,
    the widest gap first, until none is wider than ``resolution_s`` (or ``RESOLUTION`` of its
    start) or the solves run out."""
    while not solver.spent:
        horizons = sorted(solver.plans)
        gaps = [(b - a, a, b) for a, b in zip(horizons, horizons[1:])
                if b - a > max(resolution_s, RESOLUTION * a) and solver.plans[a].cost_usd > solver.plans[b].cost_usd * (1 + BEND)]
        if not gaps:
            return
        _, a, b = max(gaps)
        solver.at((a + b) / 2)


def knee_points(solver: _Solver, solved: Sequence[Plan]) -> list[Plan]:
    """The plans of ``solved`` (non-dominated, by makespan) that no plan beats by ``FASTER`` in
    makespan for at most ``DEARER`` more (see the module docstring); the fastest always is one.
    When the check solve at 0.9 M_p finds such a plan, that plan is tested in p's place: a
    cost step narrower than the grid hides the knee, and the check is what finds it (an hourly
    catalogue solved $0.80 at 10,136 s from a horizon of 3 h, and $0.80 at 9,101 s from 0.9 of
    that)."""
    margin = 1.0 + solver.options.gap_rel
    knees: list[Plan] = []
    for p in solved:
        while p is not None:
            faster_s = (1.0 - FASTER) * p.makespan_s
            limit = (1.0 + DEARER) * p.cost_usd
            # settled by a plan already solved: one that is 10% faster and cheap enough ...
            if any(q.makespan_s <= faster_s and q.cost_usd <= limit for q in solved):
                break
            # ... or a solved horizon >= 0.9 M_p that already costs too much (MinCost is non-increasing)
            bound = solver.least_cost_from(faster_s)
            if (bound is not None and bound > limit * margin) \
                    or faster_s < solver.catalogue.fastest_horizon_s(solver.work.total_ref_s):
                knees.append(p)  # ... or nothing is that fast
                break
            q = solver.at(faster_s)
            if q.cost_usd > limit * margin:
                knees.append(p)
                break
            p = q if q.makespan_s < p.makespan_s else None  # q beats p: is q a knee?
    return non_dominated(knees)


def _thin(points: list[Plan], max_points: int) -> list[Plan]:
    """At most ``max_points`` of the points, evenly spread by cost, the first and last kept."""
    lo, hi = points[-1].cost_usd, points[0].cost_usd
    keep = {0, len(points) - 1}
    for k in range(1, max_points - 1):
        target = hi - (hi - lo) * k / (max_points - 1)
        keep.add(min(range(len(points)), key=lambda i: abs(points[i].cost_usd - target)))
    return [points[i] for i in sorted(keep)]


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


def same_cost_and_time(a: Plan, b: Plan) -> bool:
    return abs(a.cost_usd - b.cost_usd) <= _COST_TOL_USD and abs(a.makespan_s - b.makespan_s) <= 1e-6 * max(1.0, a.makespan_s)


def non_dominated(plans) -> list[Plan]:
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
