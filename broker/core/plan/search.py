"""Min makespan under a budget, and the two extreme plans (ALGORITHMS.md 3.2).

MinCost(T) is non-increasing in T: a longer deadline only adds plans (every ramp of a plan
feasible at T has at least the same capacity at T' > T). So the fastest plan within a budget
B is at the least T with MinCost(T) <= B. The search:

1. T_lower (the fastest any plan can be): if MinCost(T_lower) <= B, that is the answer.
2. T_sat (beyond it nothing is cheaper): if MinCost(T_sat) > B, no plan fits the budget.
3. Binary search over the quantum boundaries k q (q the finest planning quantum) for the
   least k with MinCost(k q) <= B, then bisect the bracket ((k-1) q, k q] down to
   ``PlanOptions.bisect_tol_s``. The plan returned is the last one found within the budget;
   its makespan is within the tolerance of the least feasible one.

Every plan found within the budget narrows the bracket to its makespan, not just to the
horizon it was solved at: a plan that finishes by m is a plan for the deadline m (an instance
kept past m is only dearer), so MinCost(m) <= B. Plans bought in whole quanta usually finish
well before the horizon, which saves most of the bisection's solves. A horizon is never
solved twice.

The cheapest plan is the fastest plan whose cost equals MinCost(T_sat) (several plans often
cost the same, e.g. one private node busy for a week or seven nodes busy for a day).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from broker.config.durations import format_duration

from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import Catalogue
from .mincost import nothing_to_run_on, solve_at
from .types import NoFeasiblePlan, Plan, PlanOptions, Work


def min_makespan(
    types: Sequence[MachineType],
    private: Sequence[PrivateNode],
    work: Work,
    budget_usd: float,
    *,
    existing: Sequence[ExistingInstance] = (),
    now_s: float = 0.0,
    options: PlanOptions = PlanOptions(),
    hint_s: float | None = None,
) -> Plan:
    """The fastest plan whose cost (from now on) is within ``budget_usd`` (``math.inf``: the fastest).

    ``hint_s``: where the answer probably is (a re-plan passes what its last plan had
    left); the search starts there and gallops outwards instead of bracketing the whole
    range [T_lower, T_sat]. The answer is the same, within ``bisect_tol_s``.

    Raises :class:`NoFeasiblePlan` naming the cheapest plan when the budget is below it.
    """
    catalogue = Catalogue.build(types, private, work, existing, now_s, options)
    return fastest_within(catalogue, work, budget_usd, options, hint_s=hint_s)


def _fits(cost_usd: float, budget_usd: float) -> bool:
    return cost_usd <= budget_usd + 1e-6 * max(1.0, abs(budget_usd))


def fastest_horizon(catalogue: Catalogue, work: Work) -> float:
    """A deadline just past T_lower (so the fastest plan is feasible in floating point)."""
    t_fast = catalogue.fastest_horizon_s(work.total_ref_s)
    if not math.isfinite(t_fast):
        raise nothing_to_run_on()
    return max(t_fast * (1 + 1e-9) + 1e-6, 1e-3)


def fastest_within(catalogue: Catalogue, work: Work, budget_usd: float, options: PlanOptions,
                   hint_s: float | None = None) -> Plan:
    if math.isnan(budget_usd) or budget_usd < 0:
        raise ValueError(f"a budget must be >= 0 USD, got {budget_usd!r}")
    t_fast = fastest_horizon(catalogue, work)
    solve = _Solves(catalogue, work, options)
    fastest = solve(t_fast)
    if _fits(fastest.cost_usd, budget_usd):
        return solve.answer(fastest)
    t_sat = max(catalogue.saturation_horizon_s(work.total_ref_s), t_fast)
    quanta = [o.quantum_s for o in catalogue.new] + [o.quantum_s for o in catalogue.existing]

    def cheapest_or_raise() -> Plan:
        cheapest = solve(t_sat)
        if not _fits(cheapest.cost_usd, budget_usd):
            # The message names the cheapest cost (known now); the fastest of the cheapest
            # plans is a whole search, made only if someone reads ``cheapest`` (a budget
            # controller asks again for a share of the work and never does).
            lowest = cheapest.cost_usd
            raise NoFeasiblePlan(
                f"no plan for {work.total_ref_s:.0f} ref-s of work fits a budget of ${budget_usd:.2f}: "
                f"the cheapest plan costs ${lowest:.2f} (taking at most {format_duration(cheapest.makespan_s)}); "
                f"the fastest takes {format_duration(fastest.makespan_s)} (${fastest.cost_usd:.2f})",
                cheapest=lambda: fastest_within(catalogue, work, lowest, options),
                fastest=fastest,
            )
        return cheapest

    # Invariant: MinCost(lo) > B, and ``best`` costs <= B and finishes by hi. A plan solved at
    # a horizon finishes by its makespan, so that (not the horizon) is the new upper end.
    if hint_s is not None and math.isfinite(hint_s) and t_fast < hint_s < t_sat:
        lo_s, hi_s, best = _gallop(solve, cheapest_or_raise, budget_usd, hint_s, t_fast, t_sat,
                                   min(quanta) if quanta else 60.0)
    else:
        lo_s, hi_s, best = t_fast, t_sat, cheapest_or_raise()
    hi_s = min(hi_s, best.makespan_s)
    if quanta:
        q = min(quanta)
        k_lo, k_hi = math.floor(lo_s / q) + 1, math.ceil(hi_s / q - 1e-9)
        while k_lo < k_hi:  # least k in [k_lo, k_hi] with a plan within B by k q
            k = (k_lo + k_hi) // 2
            plan = solve(k * q)
            if _fits(plan.cost_usd, budget_usd):
                best, hi_s = plan, min(hi_s, plan.makespan_s)
                k_hi = min(k, math.ceil(hi_s / q - 1e-9))
            else:
                k_lo, lo_s = k + 1, max(lo_s, k * q)
        lo_s = max(lo_s, min((k_hi - 1) * q, hi_s))
    while hi_s - lo_s > options.bisect_tol_s:
        mid_s = (lo_s + hi_s) / 2
        plan = solve(mid_s)
        if _fits(plan.cost_usd, budget_usd):
            best, hi_s = plan, min(mid_s, plan.makespan_s)
        else:
            lo_s = mid_s
    return solve.answer(best)


class _Solves:
    """MinCost at a horizon, each horizon solved once; counts the solver's milliseconds."""

    def __init__(self, catalogue: Catalogue, work: Work, options: PlanOptions):
        self.catalogue, self.work, self.options = catalogue, work, options
        self.plans: dict[float, Plan] = {}
        self.solve_ms = 0.0

    def __call__(self, horizon_s: float) -> Plan:
        plan = self.plans.get(horizon_s)
        if plan is None:
            plan = self.plans[horizon_s] = solve_at(self.catalogue, self.work, horizon_s, self.options)
            self.solve_ms += plan.solve_ms
        return plan

    def answer(self, plan: Plan) -> Plan:
        return dataclasses.replace(plan, solve_ms=self.solve_ms)


def _gallop(solve, cheapest_or_raise, budget_usd: float, hint_s: float, t_fast: float, t_sat: float,
            step_s: float) -> tuple[float, float, Plan]:
    """A bracket (lo, hi, plan finishing by hi) around the least feasible horizon, found from
    a hint: solve at the hint, then step away from it by one quantum, two, four, ... until the
    answer changes side. A good hint costs two or three solves instead of the log2 of the
    whole range."""
    plan = solve(hint_s)
    if _fits(plan.cost_usd, budget_usd):
        hi_s, best, step = min(hint_s, plan.makespan_s), plan, step_s
        while True:
            probe = hi_s - step
            if probe <= t_fast:
                return t_fast, hi_s, best  # MinCost(t_fast) > B was solved by the caller
            plan = solve(probe)
            if not _fits(plan.cost_usd, budget_usd):
                return probe, hi_s, best
            hi_s, best, step = min(probe, plan.makespan_s), plan, 2 * step
    lo_s, step = hint_s, step_s
    while True:
        probe = lo_s + step
        if probe >= t_sat:
            return lo_s, t_sat, cheapest_or_raise()
        plan = solve(probe)
        if _fits(plan.cost_usd, budget_usd):
            return lo_s, probe, plan
        lo_s, step = probe, 2 * step


def cheapest_plan(catalogue: Catalogue, work: Work, options: PlanOptions) -> Plan:
    """The fastest among the cheapest plans."""
    t_fast = fastest_horizon(catalogue, work)
    t_sat = max(catalogue.saturation_horizon_s(work.total_ref_s), t_fast)
    return fastest_within(catalogue, work, solve_at(catalogue, work, t_sat, options).cost_usd, options)


def infeasible_deadline(catalogue: Catalogue, work: Work, deadline_s: float, options: PlanOptions) -> NoFeasiblePlan:
    """The error for a deadline no plan meets, with the fastest and the cheapest plans."""
    if not catalogue.has_capacity():
        return nothing_to_run_on()
    fastest = solve_at(catalogue, work, fastest_horizon(catalogue, work), options)

    def message() -> str:
        cheapest = error.cheapest
        return (f"no plan finishes {work.total_ref_s:.0f} ref-s of work within {format_duration(deadline_s)}: "
                f"the fastest possible takes {format_duration(fastest.makespan_s)} (${fastest.cost_usd:.2f}); "
                f"the cheapest costs ${cheapest.cost_usd:.2f} and takes {format_duration(cheapest.makespan_s)}")

    # The cheapest plan (a whole search) only when someone reads it or the message.
    error = NoFeasiblePlan(message, cheapest=lambda: cheapest_plan(catalogue, work, options), fastest=fastest)
    return error
