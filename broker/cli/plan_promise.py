"""The promise ``broker plan`` prints next to its chosen plan (broker/core/plan/promise.py).

What is known before anything runs: the bag's per-task estimates (each off by a relative
error of 15% until runs say otherwise; their total off by the ``--estimate-bias`` declared,
else 15%: the promise's interval counts it, the plan is chosen without it), or a mean and
sd (stated with ``--mean-runtime`` / ``--runtime-sd``: taken as exact; or learnt by
``--sample`` under an (eps, delta) contract: its relative standard error is
eps / z_{1 - delta/2}). A deadline goal is held at the
confidence (``hold_deadline``): the cheapest plan whose makespan's ``confidence`` quantile
is within the deadline, or, when none is, the plan with the earliest such quantile and a
message saying what can be promised instead.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from broker.core.plan import Goal, NoFeasiblePlan, Plan, PlanOptions, plan_for_goal
from broker.core.plan.capacity import Catalogue
from broker.core.plan.promise import Pending, Promise, RuntimeLaw, forecast, hold_deadline, machines_of_plan
from broker.core.plan.spotplan import plan_risk, uses_spot
from broker.core.plan.spotsummary import forecast_types, widened


@dataclass(frozen=True, slots=True)
class PlanPromise:
    plan: Plan | None
    promise: Promise | None
    warning: str | None = None  # the deadline cannot be promised at the confidence


def _law_and_pending(args, work, sampled) -> tuple[RuntimeLaw, Pending]:
    timeout = None
    estimates = None
    if getattr(args, "bag", None):
        from broker.config.bag import load_bag

        bag = load_bag(args.bag)
        timeout = bag.timeout_s
        per_task = [statistics.fmean(t.estimates_s.values()) for t in bag.tasks if t.estimates_s]
        if per_task and not sampled and getattr(args, "mean_runtime", None) is None:
            estimates = np.asarray(per_task, dtype=float)
    se = 0.0
    if sampled is not None:
        se = sampled.eps / NormalDist().inv_cdf(1 - sampled.delta / 2)
    law = RuntimeLaw.parametric(work.mean_ref_s, work.sd_ref_s, se, timeout)
    if estimates is not None and estimates.size == work.tasks:
        return law, Pending(0, estimates)
    return law, Pending(work.tasks)


def promise_for(args, types, private, work, goal, chosen: Plan | None, confidence: float, sampled=None) -> PlanPromise:
    """The chosen plan (a deadline's held at ``confidence``) and its promise."""
    law, pending = _law_and_pending(args, work, sampled)

    def _spot(promise: Promise, plan: Plan | None = None) -> Promise:
        """A plan on spot: its interval widened by the interruptions' (spotplan.plan_risk)."""
        plan = plan or chosen
        if plan is None or not uses_spot(plan, types):
            return promise
        risk = plan_risk(plan, Catalogue.build(types, private, work, (), 0.0, PlanOptions()), work,
                         confidence=confidence)
        return replace(promise,
                       makespan_s_range=widened(promise.makespan_s, promise.makespan_s_range, risk.makespan_s,
                                                risk.makespan_s_range),
                       cost_usd_range=widened(promise.cost_usd, promise.cost_usd_range, risk.cost_usd,
                                              risk.cost_usd_range))
    rng = np.random.default_rng(0)  # the same command prints the same promise

    seen = forecast_types(types, work)  # spot at its effective speed (interruptions in the mean)

    def predict(plan: Plan, with_law: RuntimeLaw = law, gen: np.random.Generator = rng):
        horizon = plan.horizon_s if goal is None or goal.kind != "budget" else 0.0
        return forecast(machines_of_plan(seen, private, plan), with_law, pending, now_s=0.0, rng=gen,
                        horizon_at_s=horizon if horizon > 0 else None,
                        budget_usd=float(goal.value) if goal is not None and goal.kind == "budget" else None)

    told_law = _told_law(args, law, pending, confidence)

    def told(plan: Plan, f=None):
        """The forecast the promise is read off: with estimates, the same plan forecast again
        with the estimates' overall bias the user declared (or 15%); the plan is chosen as before."""
        if told_law is law:
            return predict(plan) if f is None else f
        return predict(plan, told_law, np.random.default_rng(1))

    if goal is not None and goal.kind == "deadline":
        def solve(h: float):
            try:  # on spot, the deadline held under interruptions too (spotplan.spot_min_cost)
                return plan_for_goal(types, private, work, Goal("deadline", h), confidence=confidence)
            except NoFeasiblePlan:
                return None

        held = hold_deadline(solve, predict, float(goal.value), confidence)
        if held is None:
            return PlanPromise(chosen, None if chosen is None else _spot(told(chosen).promise(confidence)))
        promise = _spot(told(held.plan, held.forecast).promise(confidence, "plan"), held.plan)
        if held.held:
            return PlanPromise(held.plan, promise)
        q = held.forecast.makespan_quantile(confidence)
        warning = (f"the deadline cannot be promised with {100 * confidence:g}% confidence: the fastest plan "
                   f"found finishes within {q / 3600:.2f} h with that confidence; it promises {promise.text()}")
        return PlanPromise(held.plan, promise, warning)
    if chosen is None:
        return PlanPromise(None, None)
    return PlanPromise(chosen, _spot(told(chosen).promise(confidence, "plan"), chosen))


def _told_law(args, law: RuntimeLaw, pending: Pending, confidence: float) -> RuntimeLaw:
    """With estimates (nothing has run): the correction ratio known to the declared
    ``--estimate-bias`` or 15% (broker/core/control/estimate_bias.py); else ``law`` itself."""
    if pending.estimates_ref_s.size == 0:
        return law
    from broker.cli.plan import estimate_bias_from_args
    from broker.core.control.estimate_bias import prior_ratio_se

    return replace(law, ratio_rel_se=prior_ratio_se(estimate_bias_from_args(args), confidence))
