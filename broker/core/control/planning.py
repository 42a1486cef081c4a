"""The controller's narrow view of the planner (``broker.core.plan``).

Translates a snapshot's fleet into the planner's existing instances, asks the planner for
a goal's plan by the one path ``broker plan`` takes too (``broker.core.plan.plan_for_goal``),
and turns planner exceptions into results with a reason (the controller never raises on an
infeasible goal: it falls back to the fastest plan and says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..goal import Goal, GoalKind
from ..model import ExistingInstance, MachineType, PrivateNode
from .budget import on_its_boundary
from .causes import LaunchCause


@dataclass(frozen=True, slots=True)
class PlannerInput:
    types: tuple[MachineType, ...]
    private: tuple[PrivateNode, ...]
    existing: tuple[ExistingInstance, ...]
    work: object  # broker.core.plan.Work
    now_s: float


@dataclass(frozen=True, slots=True)
class PlanResult:
    plan: object | None  # broker.core.plan.Plan
    cause: LaunchCause | None = None
    reason: str | None = None


class FleetPlanner:
    def __init__(self, options=None):
        self._options = options

    @property
    def options(self):
        if self._options is None:
            from ..plan import PlanOptions

            self._options = PlanOptions()
        return self._options

    def lean(self) -> "FleetPlanner":
        """The same planner without the gap factor phi in the packing allowance (half a task
        per slot is kept): for launches that a later re-plan can still correct (``replan``'s
        rules say when)."""
        if getattr(self, "_lean", None) is None:
            from dataclasses import replace

            self._lean = FleetPlanner(replace(self.options, phi_s=0.0))
        return self._lean

    def for_budget(self) -> "FleetPlanner":
        """The planner a budget goal plans with: no gap factor on types billed by the second
        (``PlanOptions.phi_fine_billed``); hourly types keep it (a plan that runs short there
        buys whole hours, or leaves the bag undone when the budget cannot)."""
        if getattr(self, "_budget", None) is None:
            from dataclasses import replace

            self._budget = FleetPlanner(replace(self.options, phi_fine_billed=False))
        return self._budget

    def input(self, types, private, nodes, rem, now_s: float, tail_ref_s: float | None = None) -> PlannerInput:
        """An instance kept past ``now`` counts as paid to the end of the billing unit that
        starts at ``now`` when ``now`` is exactly a boundary (``budget.on_its_boundary``).
        Otherwise, at that instant, keeping it costs the same as a new instance and the
        solver picks between them at random (re-plans on a boundary then launch new instances and
        shorten running ones). Budgets too: an instance alive on its boundary has begun the
        next unit (EC2 charges it; ``budget.unit_started_usd`` counts it against the budget),
        so releasing it there saves nothing, and a budget plan that saw the instance as
        unpaid released it on the boundary (tests/test_sim_properties.py)."""
        from ..plan import Work

        by_name = {t.name: t for t in types}
        existing = []
        for n in nodes:
            if n.is_private or n.lost or n.launched_at_s is None:
                continue
            if n.release_at_s is not None and n.release_at_s <= now_s:
                continue
            paid = n.paid_until_s
            t = by_name.get(n.type_name)
            if t is not None and on_its_boundary(n, now_s):
                paid = t.billing.paid_until(n.launched_at_s, now_s + 1e-3)
            existing.append(
                ExistingInstance(
                    id=n.id,
                    type_name=n.type_name,
                    launched_at_s=n.launched_at_s,
                    paid_until_s=paid,
                    ready_at_s=n.ready_at_s,
                )
            )
        tasks = max(rem.pending + rem.running, 1)
        # The packing allowance is half a task of the work that is left. The mean of the
        # finished tasks is not that when the bag has estimates: dispatch runs the largest
        # first, so the first to finish are the longest (thesis LM: 11x the bag's mean after an
        # hour), and every machine's allowance grew with it (a deadline plan on thesis LM20
        # found 60 reference-hours missing and bought five m1.large for two hours).
        left = rem.pending + rem.running
        mean_ref_s = rem.point_ref_s / left if left > 0 and rem.point_ref_s > 0 else rem.mean_ref_s
        if tail_ref_s is not None:  # the size of the tasks that run last (replan.tail_size_ref_s)
            mean_ref_s = tail_ref_s
        work = Work(total_ref_s=max(rem.upper_ref_s, 1e-6), tasks=tasks, mean_ref_s=mean_ref_s, sd_ref_s=rem.sd_ref_s)
        return PlannerInput(tuple(types), tuple(private), tuple(existing), work, now_s)

    def for_goal(self, pin: PlannerInput, goal: Goal, *, work=None, hint_s: float | None = None, front=None):
        """``plan_for_goal`` (the one path from a goal to a plan) on ``pin``; ``work`` instead
        of ``pin.work`` when given. A point beyond a run-time front takes its nearest row."""
        from ..plan import plan_for_goal

        return plan_for_goal(pin.types, pin.private, pin.work if work is None else work, goal,
                             existing=pin.existing, now_s=pin.now_s, options=self.options, front=front,
                             hint_s=hint_s, nearest=True)

    def cheapest_by(self, pin: PlannerInput, deadline_s: float, late_slack_s: float = 0.0) -> PlanResult:
        """The cheapest plan that meets ``deadline_s`` from now; when none does, the fastest
        (cause ``deadline_at_risk``); when the deadline has passed, the fastest too, or with
        ``late_slack_s`` > 0 the cheapest that ends within that much of the fastest
        (``_late_plan``)."""
        from ..plan import NoFeasiblePlan

        if math.isfinite(deadline_s) and deadline_s > 0:
            try:
                return PlanResult(self.for_goal(pin, Goal(GoalKind.DEADLINE, deadline_s)), LaunchCause.DEADLINE_PLAN)
            except NoFeasiblePlan as exc:
                fallback = exc.fastest
                if fallback is not None:
                    # (not str(exc): its message names the cheapest plan, a whole search)
                    return PlanResult(fallback, LaunchCause.DEADLINE_AT_RISK,
                                      f"no plan meets the deadline: the fastest takes {fallback.makespan_s:.0f} s "
                                      f"(${fallback.cost_usd:.2f})")
        # No finite deadline left (or none given): the fastest plan there is.
        try:
            plan = self.for_goal(pin, Goal(GoalKind.BUDGET, math.inf))
        except NoFeasiblePlan as exc:
            return PlanResult(None, None, str(exc))
        note = "deadline cannot be met: running the fastest plan"
        if late_slack_s > 0 and math.isfinite(deadline_s):
            late = self._late_plan(pin, plan, late_slack_s)
            if late is not plan:  # the cause keeps its name (events carry it); the note says which plan
                note = (f"deadline cannot be met: running the cheapest plan that ends within {late_slack_s:.0f} s "
                        f"of the fastest ({late.makespan_s:.0f} s against {plan.makespan_s:.0f} s)")
                plan = late
        return PlanResult(plan, LaunchCause.DEADLINE_PASSED_FASTEST_PLAN, note)

    def _late_plan(self, pin: PlannerInput, fastest, slack_s: float):
        """Rule "a passed deadline buys the soonest end, not every last second of it".

        Once the deadline has passed, the cheapest plan that ends within ``slack_s`` (the
        controller's shortest re-plan gap, 5 minutes, at most 5% of the deadline:
        ``replan.late_slack_s``) of the fastest plan's end. The fastest plan spreads what is
        left over every machine the limits allow, each bought a whole billing unit: thesis LM20 (10,000 tasks, estimates
        within 10%) planned without its promise at the knee's 6.00 h ended its fleet at the
        deadline with 986 small tasks, 6 reference-hours, left; the fastest plan launched 76
        instances for an hour ($23) to end about a minute sooner than two or three would."""
        from ..plan import NoFeasiblePlan

        try:
            return self.for_goal(pin, Goal(GoalKind.DEADLINE, fastest.makespan_s + slack_s))
        except NoFeasiblePlan:
            return fastest

    def fastest_within(self, pin: PlannerInput, budget_usd: float, point_ref_s: float | None = None,
                       hint_s: float | None = None) -> PlanResult:
        """The fastest plan within the budget for the upper confidence value of the work; if
        that cannot be bought, for the point estimate (cause ``budget_tight``); if not even
        that, for the largest share of the work the budget buys (``budget_short``: the rest
        is left to private nodes and reported, BaTS semantics). ``hint_s``: where the last
        plan ended, from now (the search starts there)."""
        from dataclasses import replace

        from ..plan import NoFeasiblePlan

        def attempt(work):
            return self.for_goal(pin, Goal(GoalKind.BUDGET, max(budget_usd, 0.0)), work=work, hint_s=hint_s)

        try:
            return PlanResult(attempt(pin.work), LaunchCause.BUDGET_PLAN)
        except NoFeasiblePlan as exc:
            first_error = str(exc)
        point = pin.work.total_ref_s if point_ref_s is None else min(point_ref_s, pin.work.total_ref_s)
        lean = efficient_only(pin)
        for p in ((lean, pin) if lean is not None else (pin,)):
            try:
                plan = self.for_goal(p, Goal(GoalKind.BUDGET, max(budget_usd, 0.0)),
                                     work=replace(pin.work, total_ref_s=point), hint_s=hint_s)
                return PlanResult(plan, LaunchCause.BUDGET_TIGHT, first_error)
            except NoFeasiblePlan:
                pass
        lo, hi, best = 0.0, 1.0, None
        for _ in range(6):
            mid = (lo + hi) / 2
            try:
                best = attempt(replace(pin.work, total_ref_s=point * mid))
                lo = mid
            except NoFeasiblePlan:
                hi = mid
        if best is None:
            return PlanResult(None, None, first_error)
        return PlanResult(best, LaunchCause.BUDGET_SHORT, f"{first_error}; buying about {lo:.0%} of the remaining work")

    def front_choice(self, pin: PlannerInput, goal: Goal):
        """The plan a point, theta or no goal adopts: its front choice (the nearest row when the
        run-time front has fewer than ``broker plan`` printed), as soon as its cost allows."""
        from ..plan import NoFeasiblePlan, plan_front

        try:
            front = plan_front(pin.types, pin.private, pin.work, existing=pin.existing, now_s=pin.now_s,
                               options=self.options)
        except NoFeasiblePlan:
            return None
        if not front.points:
            return None
        return self.soonest_at_cost(pin, self.for_goal(pin, goal, front=front))

    def soonest_at_cost(self, pin: PlannerInput, chosen):
        """The soonest plan that costs no more than ``chosen``.

        Front points sit on a grid of billing-unit horizons (coarser on a long front), and the
        plan solved at a horizon spreads its paid hours up to it; the same money often buys
        the same hours side by side and finishes sooner. A run promised the grid horizon
        then "over-delivers" by the gap (thesis Table 6.6 measures delivered against
        proposed). One min-makespan search, once, when the goal is resolved.
        """
        from ..plan import NoFeasiblePlan

        try:
            sooner = self.for_goal(pin, Goal(GoalKind.BUDGET, chosen.cost_usd))
        except NoFeasiblePlan:
            return chosen
        return sooner if sooner.makespan_s < chosen.makespan_s else chosen

    def bats(self, types, rem, budget_usd, spent_usd, private_usd_per_s: float = 0.0) -> dict[str, int] | None:
        from ..plan import NoFeasiblePlan, bats_configuration

        # BaTS sizes the fleet for N tasks left at their mean runtime. That mean is the remaining
        # work's (the bag's estimates, corrected by what finished), not the finished tasks'
        # mean: dispatch runs the largest tasks first, so the first to finish are the longest
        # (thesis LM: 11,700 ref-s after an hour against 1,009), and a budget that buys the bag
        # twice over then bought nothing after the first hour (10,000 tasks: nothing launched
        # from t = 0 until 187.8 h, the private node doing the work alone).
        tasks = rem.pending + rem.running
        mean_ref_s = rem.point_ref_s / tasks if tasks > 0 and rem.point_ref_s > 0 else rem.mean_ref_s
        mean_per_type = {t.name: mean_ref_s / t.speed for t in types}
        budget = math.inf if budget_usd is None else budget_usd - spent_usd
        try:
            plan = bats_configuration(types, tasks, mean_per_type, budget)
            # A budget is the whole bill: the private nodes cost ``private_usd_per_s`` over the
            # configuration's makespan too (BaTS has no private nodes; twice round is enough).
            for _ in range(2 if private_usd_per_s > 0 and math.isfinite(budget) else 0):
                plan = bats_configuration(types, tasks, mean_per_type, budget - private_usd_per_s * plan.makespan_s)
        except NoFeasiblePlan:
            return None
        return dict(plan.fleet)


def efficient_only(pin: PlannerInput, within: float = 0.95) -> PlannerInput | None:
    """Rule "a budget that cannot cover the work's upper value buys no speed at a premium".

    When the budget cannot buy the upper value, the plan is made for the point value
    (``budget_tight``), and the money the point plan leaves is all the reserve the run has for
    the work the point value misses. The fastest plan within the budget spends that reserve on
    machines that do less work per dollar (they finish sooner at a premium): on the heavy-tailed
    bag at List's $19.06 the first plan bought 6 m1.large and an m1.small beside the 40 efficient
    machines to finish the point value in 0.97 h, left $0.56 for the rest, and stopped with 3
    tasks left (1 left with this rule, at 2.73 h; LM20 billed per second at List's $18.94: 1.95 h
    -> 1.85 h; league --quick, no goal line changes verdict). So the point plan is first
    sought on the new machines within ``within`` of the best work per dollar (List's efficient
    machines; private nodes and instances already running stay), and on every type only when
    those cannot buy it. None when every type is efficient (nothing to leave out)."""
    from dataclasses import replace

    effs = [t.efficiency for t in pin.types if t.limit > 0]
    effs += [math.inf if p.cost_per_hour <= 0 else p.capacity_per_s * 3600.0 / p.cost_per_hour for p in pin.private]
    if not effs:
        return None
    best = max(e for e in effs if math.isfinite(e)) if any(math.isfinite(e) for e in effs) else math.inf
    slow = [t for t in pin.types if t.limit > 0 and t.efficiency < best * within]
    if not slow:
        return None
    return replace(pin, types=tuple(replace(t, limit=0) if t in slow else t for t in pin.types))

