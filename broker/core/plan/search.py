"""Min makespan under a budget, and the two extreme plans (ALGORITHMS.md 3.2).

MinCost(T) is non-increasing in T: a longer deadline only adds plans (every ramp of a plan
feasible at T has at least the same capacity at T' > T). So the fastest plan within a budget
B is at the least T with MinCost(T) <= B. The search:

1. T_lower (the fastest any plan can be): if MinCost(T_lower) <= B, that is the answer.
2. A bracket: from a hint (the caller's, or where the LP relaxation first fits the budget,
   found with sub-millisecond LP solves), gallop a quantum, two, four, ... until the answer
   changes side; without one, [T_lower, T_sat] (T_sat: beyond it nothing is cheaper; if
   MinCost(T_sat) > B, no plan fits the budget).
3. Binary search over the quantum boundaries k q (q the finest planning quantum) for the
   least k with MinCost(k q) <= B, then narrow the bracket ((k-1) q, k q] down to
   ``PlanOptions.bisect_tol_s`` (secant steps, each followed by a probe on the other side of
   where it landed; every fourth probe halves). The plan returned is the last one found within
   the budget; its makespan is within the tolerance of the least feasible one.

Every plan found within the budget narrows the bracket to its makespan, not just to the
horizon it was solved at: a plan that finishes by m is a plan for the deadline m (an instance
kept past m is only dearer), so MinCost(m) <= B; and further, to the least deadline by which
its instances, with private time bought for that deadline, still fit the budget (no solve).
A horizon is never solved twice. Thesis catalogue, budget 1% above the fluid bound: 18 solves
became 9 (x20) and 16 became 7 (x60); 64 running machines launched a second apart: 11 solves.

The cheapest plan is the fastest plan whose cost equals MinCost(T_sat) (several plans often
cost the same, e.g. one private node busy for a week or seven nodes busy for a day).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from ..units import format_duration

from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import Catalogue
from .mincost import assemble, choice_of, fit_private, instance_usd, nothing_to_run_on, relaxed_cost, solve_at
from .solver import lp_solver
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
    if hint_s is None:
        hint_s = _relaxed_hint(catalogue, work, budget_usd, t_fast, t_sat, min(quanta) if quanta else 60.0, options)
    if hint_s is not None and math.isfinite(hint_s) and t_fast < hint_s < t_sat:
        lo_s, hi_s, best = _gallop(solve, cheapest_or_raise, budget_usd, hint_s, t_fast, t_sat,
                                   min(quanta) if quanta else 60.0)
    else:
        lo_s, hi_s, best = t_fast, t_sat, cheapest_or_raise()
    tol_s = options.bisect_tol_s
    best, hi_s = _pull_down(catalogue, work, budget_usd, best, lo_s, min(hi_s, best.makespan_s), tol_s)
    if quanta and hi_s - lo_s > min(quanta):
        q = min(quanta)
        k_lo, k_hi = math.floor(lo_s / q) + 1, math.ceil(hi_s / q - 1e-9)
        while k_lo < k_hi:  # least k in [k_lo, k_hi] with a plan within B by k q
            k = (k_lo + k_hi) // 2
            plan = solve(k * q)
            if _fits(plan.cost_usd, budget_usd):
                best, hi_s = _pull_down(catalogue, work, budget_usd, plan, lo_s, min(hi_s, plan.makespan_s), tol_s)
                k_hi = min(k, math.ceil(hi_s / q - 1e-9))
            else:
                k_lo, lo_s = k + 1, max(lo_s, k * q)
        lo_s = max(lo_s, min((k_hi - 1) * q, hi_s))
    return solve.answer(_narrow(solve, catalogue, work, budget_usd, best, lo_s, hi_s, tol_s))


def _narrow(solve: "_Solves", catalogue: Catalogue, work: Work, budget_usd: float, best: Plan, lo_s: float,
            hi_s: float, tol_s: float) -> Plan:
    """Narrow the bracket (lo, hi] (MinCost(lo) > B; ``best`` within B, finishing by hi) down
    to ``tol_s`` and return the last plan within the budget.

    Inside a quantum MinCost(T) falls almost linearly (private time and the last quantum of
    instances are continuous): a secant step between the bracket's ends (Illinois: an end
    kept twice has its weight halved, so the far end does not hold the estimate back) lands
    within seconds of the answer, and one probe half a tolerance to its other side closes the
    bracket (half, not all of it: the answer is then as close to the least feasible deadline
    as bisection's usually is). Every fourth probe halves the bracket, so the worst case stays
    logarithmic."""
    ends = {"lo": _excess(solve.plans.get(lo_s), budget_usd), "hi": best.cost_usd - budget_usd}
    hi_at, kept, probes, closing = best.horizon_s, None, 0, None
    while hi_s - lo_s > tol_s:
        probes += 1
        if closing is not None and lo_s < closing < hi_s:
            mid_s, kind = closing, "close"
        elif probes % 4 == 0 or ends["lo"] is None or not ends["lo"] > 0 >= ends["hi"] or hi_at <= lo_s:
            mid_s, kind = (lo_s + hi_s) / 2, "halve"
        else:
            guess = lo_s + (hi_at - lo_s) * ends["lo"] / (ends["lo"] - ends["hi"])
            mid_s, kind = min(max(guess, lo_s + 0.25 * tol_s), hi_s - 0.25 * tol_s), "secant"
        plan = solve(mid_s)
        side = "hi" if _fits(plan.cost_usd, budget_usd) else "lo"
        if side == "hi":
            best, hi_s = _pull_down(catalogue, work, budget_usd, plan, lo_s, min(mid_s, plan.makespan_s), tol_s)
            hi_at, closing = mid_s, (hi_s - 0.5 * tol_s if kind == "secant" else None)
        else:
            lo_s, closing = mid_s, (lo_s + 0.5 * tol_s if kind == "secant" else None)
        if kept == side and ends["lo"] is not None:
            other = "lo" if side == "hi" else "hi"
            ends[other] /= 2
        ends[side], kept = plan.cost_usd - budget_usd, side
    return best


def _excess(plan: Plan | None, budget_usd: float) -> float | None:
    return None if plan is None else plan.cost_usd - budget_usd


def _relaxed_hint(catalogue: Catalogue, work: Work, budget_usd: float, t_fast: float, t_sat: float,
                  step_s: float, options: PlanOptions) -> float | None:
    """Where the LP relaxation first fits the budget, to a quarter quantum: the least T with
    MinCost(T) <= B lies after it (the relaxation costs no more) and usually within a quantum
    or two. Twenty LP solves in process cost less than the two or three ILP solves they save
    from the binary search over the whole range (halved geometrically while it spans more
    than a factor of 2: T_sat can be 1,000 times T_fast). Only with HiGHS: an LP through CBC
    starts a process each time."""
    if lp_solver(options.solver) is None or not math.isfinite(t_sat):
        return None

    def fits(horizon_s: float) -> bool:
        return _fits(relaxed_cost(catalogue, work, horizon_s, options), budget_usd)

    lo_s, hi_s = t_fast, t_sat
    if fits(lo_s) or not fits(hi_s):
        return None
    while hi_s - lo_s > step_s / 4:
        mid_s = math.sqrt(lo_s * hi_s) if hi_s > 2 * lo_s > 0 else (lo_s + hi_s) / 2
        lo_s, hi_s = (lo_s, mid_s) if fits(mid_s) else (mid_s, hi_s)
    return hi_s


def _pull_down(catalogue: Catalogue, work: Work, budget_usd: float, plan: Plan, lo_s: float, hi_s: float,
               tol_s: float) -> tuple[Plan, float]:
    """The least deadline in (lo, hi] by which ``plan``'s instances, with private time bought
    for that deadline, still fit the budget (bisected to ``tol_s``, no solver call), and that
    plan. Private time is continuous: a plan solved at a horizon uses it to the horizon, and
    only this tells how much sooner the same fleet could finish for the same money."""
    if not catalogue.private or hi_s - lo_s <= tol_s:
        return plan, hi_s
    choice = choice_of(catalogue, plan)
    fixed_usd = instance_usd(catalogue, choice)

    def fits(horizon_s: float) -> bool:
        usd = fit_private(catalogue, work, horizon_s, choice)
        return usd is not None and _fits(fixed_usd + usd, budget_usd)

    a, b = lo_s, hi_s
    while b - a > tol_s / 2:
        mid = (a + b) / 2
        a, b = (a, mid) if fits(mid) else (mid, b)
    if b >= hi_s or not fits(b):
        return plan, hi_s
    sooner = assemble(catalogue, work, b, choice, plan.status, 0.0)
    return sooner, min(b, sooner.makespan_s)


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
