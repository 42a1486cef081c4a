"""Plans that mix spot and on-demand offers: the deadline and the budget held under
interruptions, the on-demand fallback, and the figures a plan table and a forecast need
(issue 21, part 2; the interruption model and its formulas are in ``spot.py``).

Every planner of this package already counts a spot offer at its effective rate eta r
(``Catalogue.build``), so a plan for a point, a theta or no goal over a mixed fleet is the
ordinary front's. A deadline and a budget must also hold *whatever happens*, within what the
user accepts:

**The makespan and cost of a plan** (``plan_risk``): the plan's ramps at their raw rates must do
the work plus the loss of its spot lineages (``spot.loss_draws``: compound Poisson over the
instance-seconds each spot group is exposed, up to the planned makespan). A draw whose loss
exceeds what the plan's paid time can absorb runs on: the controller extends the fleet, at
its full raw rate, from the moment the plan's capacity runs out, and pays the extra time (each
group by its billing). The interval is the draws' delta/2 and 1 - delta/2 quantiles; the
deadline test reads the one-sided 1 - delta quantile. Two corrections to the fluid view, both
measured against a task-level simulation (``tests/test_plan_spot.py``): a loss above its mean
lengthens the run and so the exposure of the spot instances still working at its end (a
deviation d becomes d / (1 - f), f their expected loss per second over the fleet's rate); and
the end of the bag: an interruption x ~ Exp(Lambda) before the fluid end restarts a task of
length D on an idle slot, ending (D - x)^+ later (``last_task_delay``). The ramps start after
the boot and the allowance's half task; the gap phi is the plan's margin, not part of the
distribution.

**Deadline at confidence 1 - delta** (``spot_min_cost``): the cheapest plan by the deadline at
the effective rates (``min_cost``) is accepted when (a) its makespan's 1 - delta quantile
under interruptions is within the deadline, and (b) the fallback can recover the worst case,
a whole spot type lost at once (the capacity AWS reclaims together): for every spot type i
used and each moment t of a grid over its life (0, E/3, 2E/3 and a minute before its last
lineage ends at E), the work left at t (the plan's expected progress by t subtracted, every
running task of type i counted as lost, a long task mean + 2 sd each) can be finished by the
deadline with the instances that survive (their paid time, extended as needed) and new
*on-demand* instances (``min_cost`` from t: the trigger "if i is lost by t, launch ..."). When
(a) or (b) fails, the plan is solved again for an earlier planning deadline (by the overrun,
at least 5% of the time to the deadline, up to ``MAX_TRIES`` times), which leaves every
instance's last stretch as slack for the fallback; the on-demand-only plan for the deadline is
the last resort, and it wins whenever it is expected to be cheaper.

**Budget** (``spot_min_makespan``): the plan is the fastest whose cost, spot counted at its
price cap (``spot.at_price_cap``), *plus a reserve*, fits the budget (a plan that launches no
new spot instance needs none: spot instances already running are there whatever it does, and
the controller's budget rules stop a run before it overspends). The reserve is the
largest over the spot types i used of R_i, the cost of doing type i's whole planned work again
(its effective capacity C_i plus its running tasks, a long task each) on the other types (spot
at their cap; no private node, no survivor: they do their own share), bounded from above by
one instance of the type that does it for least, kept until done (``redo_usd``; no solve): an
upper bound on what losing type i at any moment t costs beyond what the plan has paid by t,
because the work left of type i at t is at most C_i plus its running tasks and doing more work
never costs less (``min_cost`` is monotone in the work). Interruptions by themselves add no money on
per-second billing (a lineage is paid for the time it is kept, whatever ran on it) but may
leave work undone: the reserve also holds the 1 - delta quantile of the cost of running on
(``plan_risk``). The reserve is found by fixed point: solve with the budget less the reserve,
recompute it, until plan + reserve fits (``MAX_TRIES``); else the on-demand-only plan.

**What the controller and the forecast read** (``spotsummary.spot_summary``): the expected cost and its
saving against the on-demand-only plan (for the deadline; for other goals the on-demand-only
plan finishing as soon), the fallback's worst extra cost and its triggers, the worst case a
budget must hold (plan at the caps + reserve) and the makespan/cost interval.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..units import format_duration
from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import WORK_RTOL, Catalogue, Ramp, planning_quantum_s
from .mincost import min_cost
from .search import min_makespan
from .spot import at_price_cap, efficiency, loss_draws, loss_per_interruption_ref_s, rate_per_s
from .types import NoFeasiblePlan, Plan, PlanOptions, Work

MAX_TRIES = 6
DRAWS = 1000
# The fallback grid's last point: this long before the spot type's last lineage ends.
LATE_MARGIN_S = 60.0


def uses_spot(plan: Plan, types: Sequence[MachineType]) -> bool:
    spot = {t.name for t in types if t.is_spot}
    return any(count > 0 and name in spot for name, count in plan.fleet.items())


def launches_spot(plan: Plan, types: Sequence[MachineType]) -> bool:
    spot = {t.name for t in types if t.is_spot}
    return any(g.count > 0 and g.type_name in spot for g in plan.new)


def on_demand_only(types: Sequence[MachineType]) -> tuple[MachineType, ...]:
    """The types with no new spot instance allowed (running ones stay known to the planner)."""
    return tuple(dataclasses.replace(t, limit=0) if t.is_spot else t for t in types)


@dataclass(frozen=True)
class Resource:
    """One ramp of a plan with what it costs to keep it running and whether it is spot."""

    type: MachineType | None  # None: a private node
    count: int
    start_s: float
    end_s: float
    raw_rate_per_s: float  # one instance
    eff_rate_per_s: float
    price_per_hour: float
    instance: ExistingInstance | None = None  # a running instance (None: launched by the plan)
    speed: float = 1.0

    def more_usd(self, from_s: float, until_s: float) -> float:
        """What running it again from ``from_s`` (or its end, if later) until ``until_s`` costs
        beyond the plan: the extra time in whole units of its billing."""
        start = max(from_s, self.end_s)
        if self.type is None or until_s <= start:
            return 0.0
        unit = self.type.billing.unit_s
        return self.count * self.price_per_hour * unit * math.ceil((until_s - start) / unit - 1e-9) / 3600.0


def resources(plan: Plan, catalogue: Catalogue) -> list[Resource]:
    """The plan's instances and private nodes as ramps (times from now)."""
    out = []
    offers = {o.type.name: o for o in catalogue.new}
    for g in plan.new:
        o = offers[g.type_name]
        out.append(Resource(o.type, g.count, o.start_s, g.quanta * o.quantum_s, o.type.capacity_per_s,
                            o.rate_per_s, o.type.price_per_hour, None, o.type.speed))
    extra = {e.instance_id: e.extra_quanta for e in plan.existing}
    for old in catalogue.existing:
        end = old.paid_s + extra.get(old.instance.id, 0) * old.quantum_s
        out.append(Resource(old.type, 1, old.start_s, end, old.type.capacity_per_s, old.rate_per_s,
                            old.type.price_per_hour, old.instance, old.type.speed))
    for p in catalogue.private:
        busy = plan.private_share.get(p.node.name, 0.0) * plan.horizon_s
        if busy > 0:
            out.append(Resource(None, 1, p.start_s, p.start_s + busy, p.rate_per_s, p.rate_per_s,
                                p.node.cost_per_hour, None, p.node.speed))
    return out


def _curve(ramps: Sequence[Ramp]) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints and the capacity done by each: the piecewise-linear cap(T)."""
    points = sorted({0.0} | {r.start_s for r in ramps} | {r.end_s for r in ramps if math.isfinite(r.end_s)})
    caps = [sum(r.capacity(p) for r in ramps) for p in points]
    return np.array(points), np.array(caps)


def _time_to(points: np.ndarray, caps: np.ndarray, targets: np.ndarray, run_on_rate: float) -> np.ndarray:
    """Least T with cap(T) >= target, per target; past the curve's last capacity, the fleet
    runs on at ``run_on_rate`` from the moment it ran out."""
    out = np.empty_like(targets)
    last = caps[-1]
    beyond = targets > last
    # the first breakpoint whose capacity reaches the target, then back along its segment
    k = np.searchsorted(caps, np.minimum(targets, last), side="left")
    k = np.clip(k, 1, len(points) - 1) if len(points) > 1 else np.zeros_like(k)
    if len(points) > 1:
        c0, c1, t0, t1 = caps[k - 1], caps[k], points[k - 1], points[k]
        slope = np.where(c1 > c0, (t1 - t0) / np.where(c1 > c0, c1 - c0, 1.0), 0.0)
        out[:] = t0 + (np.minimum(targets, last) - c0) * slope
    else:
        out[:] = points[0]
    if beyond.any():
        out[beyond] = _ran_out_s(points, caps) + (targets[beyond] - last) / max(run_on_rate, 1e-12)
    return out


def _ran_out_s(points: np.ndarray, caps: np.ndarray) -> float:
    """When the curve reaches its last capacity (the plan's paid time is used up)."""
    return float(points[int(np.searchsorted(caps, caps[-1], side="left"))]) if len(points) else 0.0


def last_task_delay(res: Sequence[Resource], work: Work, makespan: np.ndarray, ran_out_s: float,
                    rng: np.random.Generator) -> np.ndarray:
    """The end of the bag: an interruption x seconds before the fluid end M restarts a task of
    length D there (on a slot idle by then: no boot), which ends at M - x + D. Interruptions of
    the spot instances still working at M arrive at the summed rate Lambda, so x ~ Exp(Lambda)
    back from M and the delay is (D - x)^+ (D the type's task, gamma)."""
    delay = np.zeros_like(makespan)
    for r in res:
        if r.type is None or not r.type.is_spot or r.count <= 0 or work.mean_ref_s <= 0:
            continue
        lam = r.type.interruptions_per_hour / 3600.0 * r.count
        alive = (r.end_s >= makespan) | (makespan > ran_out_s)  # working at the end (or running on)
        if lam <= 0 or not alive.any():
            continue
        x = rng.exponential(1.0 / lam, size=makespan.shape)
        mean_s, sd_s = work.mean_ref_s / r.type.speed, work.sd_ref_s / r.type.speed
        d = (rng.gamma(mean_s ** 2 / sd_s ** 2, sd_s ** 2 / mean_s, size=makespan.shape) if sd_s > 0
             else np.full(makespan.shape, mean_s))
        delay = np.maximum(delay, np.where(alive, np.maximum(0.0, d - x), 0.0))
    return delay


@dataclass(frozen=True)
class SpotRisk:
    """The makespan and cost of a plan under interruptions (seconds from now, USD from now)."""

    confidence: float
    makespan_s: float  # median
    makespan_s_range: tuple[float, float]
    makespan_hold_s: float  # the one-sided 1 - delta quantile: the deadline test
    cost_usd: float  # mean
    cost_usd_range: tuple[float, float]
    cost_hold_usd: float  # one-sided 1 - delta quantile
    interruptions: float  # expected count


def _phi_s(speed: float, work: Work, options: PlanOptions) -> float:
    """The gap phi of the allowance g (``PlanOptions.allowance_s`` without its half task)."""
    return options.allowance_s(speed, work.mean_ref_s, work.sd_ref_s) - options.tail_task_fraction * work.mean_ref_s / speed


def plan_risk(plan: Plan, catalogue: Catalogue, work: Work, *, confidence: float = 0.9,
              draws: int = DRAWS, seed: int = 0, options: PlanOptions = PlanOptions()) -> SpotRisk:
    """The distribution of ``plan``'s makespan and cost under the interruption model."""
    res = resources(plan, catalogue)
    # A ramp starts after its boot and the end-of-bag half task the allowance counts; its
    # safety gap phi (a margin of the plan, not a loss) is left out of the distribution.
    ramps = [Ramp(r.raw_rate_per_s * r.count, r.start_s - _phi_s(r.speed, work, options), r.end_s) for r in res]
    exposures = [(r.type, r.count * max(0.0, min(r.end_s, plan.makespan_s)))
                 for r in res if r.type is not None and r.type.is_spot]
    loss = loss_draws(exposures, work, draws, seed)
    points, caps = _curve(ramps)
    run_on = sum(r.raw_rate_per_s * r.count for r in res)
    # Feedback: a loss above its mean lengthens the run, which the spot instances still working
    # at its end are exposed to longer, and so on: each reference second lost adds f more,
    # f = sum of their (lambda x mean lump) over the fleet's rate; a deviation d becomes
    # d / (1 - f) (linearized; f is capped at 0.9).
    f = sum(r.count * rate_per_s(r.type) * loss_per_interruption_ref_s(r.type, work)
            for r in res if r.type is not None and r.type.is_spot and r.end_s >= plan.makespan_s)
    f = min(0.9, f / max(run_on, 1e-12))
    loss = loss.mean() + (loss - loss.mean()) / (1.0 - f)
    makespan = _time_to(points, caps, work.total_ref_s + loss, run_on)
    makespan += last_task_delay(res, work, makespan, _ran_out_s(points, caps), np.random.default_rng(seed + 1))
    cost = np.full(draws, plan.cost_usd)
    ran_out = _ran_out_s(points, caps)
    for k in np.flatnonzero(work.total_ref_s + loss > caps[-1]):
        cost[k] += sum(r.more_usd(ran_out, float(makespan[k])) for r in res)
    delta = 1.0 - confidence
    lo, hi = delta / 2.0, 1.0 - delta / 2.0
    lam = sum(t.interruptions_per_hour / 3600.0 * x for t, x in exposures)
    return SpotRisk(confidence, float(np.median(makespan)),
                    (float(np.quantile(makespan, lo)), float(np.quantile(makespan, hi))),
                    float(np.quantile(makespan, 1.0 - delta)), float(cost.mean()),
                    (float(np.quantile(cost, lo)), float(np.quantile(cost, hi))),
                    float(np.quantile(cost, 1.0 - delta)), lam)


@dataclass(frozen=True)
class Trigger:
    """If spot type ``lost`` is lost by ``by_s`` (from now): launch ``launch`` (on-demand) and
    keep the survivors until the deadline; ``extra_usd`` beyond the plan; ``feasible`` False
    when nothing can recover it by the deadline."""

    lost: str
    by_s: float
    launch: Mapping[str, int]
    extra_usd: float
    feasible: bool

    def to_json(self) -> dict[str, object]:
        return {"lost": self.lost, "by_s": round(self.by_s, 1), "launch": dict(self.launch),
                "extra_usd": round(self.extra_usd, 4) if math.isfinite(self.extra_usd) else None,
                "feasible": self.feasible}


def _in_progress_ref_s(t: MachineType, count: int, work: Work) -> float:
    return count * t.slots * (work.mean_ref_s + 2.0 * work.sd_ref_s)


def _survivors(res: Sequence[Resource], lost: str, at_s: float, now_s: float) -> list[ExistingInstance]:
    """The plan's instances still paid at ``at_s`` (from now) other than ``lost``'s, as running
    instances on the planner's clock."""
    out = []
    for k, r in enumerate(res):
        if r.type is None or r.type.name == lost or r.end_s <= at_s:
            continue
        if r.instance is not None:
            out.append(dataclasses.replace(r.instance, paid_until_s=now_s + r.end_s))
            continue
        ready = now_s + r.type.boot_s if r.type.boot_s > at_s else None
        out += [ExistingInstance(f"survivor-{k}-{j}", r.type.name, now_s, now_s + r.end_s, ready)
                for j in range(r.count)]
    return out


def fallback_at(plan: Plan, types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work,
                deadline_s: float, lost: str, at_s: float, *, catalogue: Catalogue,
                existing: Sequence[ExistingInstance] = (), now_s: float = 0.0,
                options: PlanOptions = PlanOptions(), priced: bool = True) -> Trigger:
    """The on-demand recovery if spot type ``lost`` (every instance of it) is lost at ``at_s``;
    ``priced`` False: only whether there is one (no solve: the survivors and every on-demand
    type at its limit can do the work left by the deadline)."""
    res = resources(plan, catalogue)
    done = sum(Ramp(r.eff_rate_per_s * r.count, r.start_s, r.end_s).capacity(at_s) for r in res)
    lost_res = [r for r in res if r.type is not None and r.type.name == lost and r.end_s > at_s]
    lost_type = lost_res[0].type if lost_res else None
    running = sum(r.count for r in lost_res if r.start_s <= at_s)
    left = work.total_ref_s - done + (_in_progress_ref_s(lost_type, running, work) if lost_type else 0.0)
    saved = sum(r.count * r.price_per_hour * max(0.0, r.end_s - max(at_s, 0.0)) / 3600.0 for r in lost_res)
    private_after = sum(r.price_per_hour * max(0.0, r.end_s - max(at_s, r.start_s)) / 3600.0
                        for r in res if r.type is None)
    if left <= work.total_ref_s * 1e-9:
        return Trigger(lost, at_s, {}, 0.0, True)
    rest = Work(left, max(1, math.ceil(left / max(work.mean_ref_s, 1e-9))), work.mean_ref_s, work.sd_ref_s)
    survivors = _survivors(res, lost, at_s, now_s)
    od = [dataclasses.replace(t, limit=0) if t.is_spot else t for t in types]
    if not priced:
        room = Catalogue.build(od, private, rest, survivors, now_s + at_s, options)
        ok = room.max_capacity_ref_s(deadline_s - at_s) >= left * (1 - WORK_RTOL)
        return Trigger(lost, at_s, {}, 0.0 if ok else math.inf, ok)
    try:
        rec = min_cost(od, private, rest, max(1e-3, deadline_s - at_s), existing=survivors, now_s=now_s + at_s,
                       options=options)
    except NoFeasiblePlan:
        return Trigger(lost, at_s, {}, math.inf, False)
    launch: dict[str, int] = {}
    for g in rec.new:
        launch[g.type_name] = launch.get(g.type_name, 0) + g.count
    return Trigger(lost, at_s, launch, max(0.0, rec.cost_usd - saved - private_after), True)


def fallback_triggers(plan: Plan, types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work,
                      deadline_s: float, *, catalogue: Catalogue, existing: Sequence[ExistingInstance] = (),
                      now_s: float = 0.0, options: PlanOptions = PlanOptions(), priced: bool = True
                      ) -> list[Trigger]:
    """Per spot type used, the worst point of the grid (an infeasible one first, else the
    dearest recovery; ``priced`` False: the first point that cannot be recovered, else any)."""
    res = resources(plan, catalogue)
    out = []
    for name in sorted({r.type.name for r in res if r.type is not None and r.type.is_spot}):
        end = min(deadline_s, max(r.end_s for r in res if r.type is not None and r.type.name == name))
        grid = sorted({0.0, end / 3.0, 2.0 * end / 3.0, max(0.0, end - LATE_MARGIN_S)})
        found = []
        for t in sorted(grid, reverse=not priced):  # late points fail first
            found.append(fallback_at(plan, types, private, work, deadline_s, name, t, catalogue=catalogue,
                                     existing=existing, now_s=now_s, options=options, priced=priced))
            if not found[-1].feasible and not priced:
                break
        out.append(max(found, key=lambda tr: (not tr.feasible, tr.extra_usd, tr.by_s)))
        if not out[-1].feasible and not priced:
            break
    return out


def spot_min_cost(types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work, deadline_s: float, *,
                  existing: Sequence[ExistingInstance] = (), now_s: float = 0.0,
                  options: PlanOptions = PlanOptions(), confidence: float = 0.9) -> Plan:
    """The cheapest plan by ``deadline_s`` that holds it at ``confidence`` under interruptions
    and whose fallback recovers a whole spot type lost at any moment (module docstring)."""
    od_types = on_demand_only(types)
    try:
        od_plan: Plan | None = min_cost(od_types, private, work, deadline_s, existing=existing, now_s=now_s,
                                        options=options)
    except NoFeasiblePlan:
        od_plan = None
    horizon = deadline_s
    uncovered: Plan | None = None  # the first plan that holds the deadline but not a whole-type loss
    for _ in range(MAX_TRIES):
        try:
            plan = min_cost(types, private, work, horizon, existing=existing, now_s=now_s, options=options)
        except NoFeasiblePlan:
            if od_plan is None and uncovered is None:
                raise
            break
        if not uses_spot(plan, types):
            return plan if od_plan is None or plan.cost_usd <= od_plan.cost_usd else od_plan
        catalogue = Catalogue.build(types, private, work, existing, now_s, options)
        risk = plan_risk(plan, catalogue, work, confidence=confidence)
        overrun = risk.makespan_hold_s - deadline_s
        triggers = [] if overrun > 0 else fallback_triggers(plan, types, private, work, deadline_s,
                                                            catalogue=catalogue, existing=existing, now_s=now_s,
                                                            options=options, priced=False)
        if overrun <= 0 and all(tr.feasible for tr in triggers):
            if od_plan is not None and od_plan.cost_usd <= risk.cost_usd:
                return od_plan
            return dataclasses.replace(plan, horizon_s=deadline_s)
        if overrun <= 0 and uncovered is None:
            uncovered = dataclasses.replace(plan, horizon_s=deadline_s)
        horizon -= max(overrun, 0.05 * deadline_s)
        if horizon <= 0:
            break
    if od_plan is not None:
        return od_plan
    if uncovered is not None:
        # Nothing on demand can recover a whole spot type lost late: the plan holds the
        # deadline under independent interruptions only (``spot_summary`` says so).
        return uncovered
    raise NoFeasiblePlan(
        f"no plan holds the deadline of {format_duration(deadline_s)} at {confidence:.0%} under spot "
        "interruptions, and no on-demand plan meets it")


def redo_usd(types: Sequence[MachineType], work: Work, options: PlanOptions = PlanOptions()) -> float:
    """An upper bound on the cheapest plan for ``work`` on ``types`` (no private node, no
    deadline): one instance of the type that does it for least, kept until it is done (spot at
    its effective rate): the cheapest plan is at most that. +inf with no type to run on."""
    best = math.inf
    for t in types:
        rate = t.capacity_per_s * (efficiency(t, work) if t.is_spot else 1.0)
        if t.limit <= 0 or rate <= 0:
            continue
        start = t.boot_s + options.allowance_s(t.speed, work.mean_ref_s, work.sd_ref_s)
        q = planning_quantum_s(t.billing, options)
        quanta = max(1, math.ceil((work.total_ref_s / rate + start) / q - 1e-9))
        best = min(best, t.billing.cost_usd(quanta * q, t.price_per_hour))
    return best


def budget_reserve(plan: Plan, types: Sequence[MachineType], work: Work, *, catalogue: Catalogue,
                   options: PlanOptions = PlanOptions(), confidence: float = 0.9) -> float:
    """The money a budget keeps back for ``plan`` (module docstring): the dearest whole-type
    loss R_i (bounded by ``redo_usd``) plus the 1 - delta quantile of the cost of running on."""
    res = resources(plan, catalogue)
    worst = 0.0
    for name in sorted({r.type.name for r in res if r.type is not None and r.type.is_spot}):
        mine = [r for r in res if r.type is not None and r.type.name == name]
        t = mine[0].type
        again = sum(Ramp(r.eff_rate_per_s * r.count, r.start_s, r.end_s).capacity(math.inf) for r in mine)
        again += _in_progress_ref_s(t, sum(r.count for r in mine), work)
        others = [dataclasses.replace(o, limit=0) if o.name == name else o for o in types]
        redo = Work(again, max(1, math.ceil(again / max(work.mean_ref_s, 1e-9))), work.mean_ref_s, work.sd_ref_s)
        worst = max(worst, redo_usd(others, redo, options))
        if math.isinf(worst):
            return worst
    risk = plan_risk(plan, catalogue, work, confidence=confidence)
    return worst + max(0.0, risk.cost_hold_usd - plan.cost_usd)


def spot_min_makespan(types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work, budget_usd: float,
                      *, existing: Sequence[ExistingInstance] = (), now_s: float = 0.0,
                      options: PlanOptions = PlanOptions(), confidence: float = 0.9,
                      hint_s: float | None = None) -> Plan:
    """The fastest plan whose cost at the spot caps plus its reserve fits ``budget_usd``."""
    capped = at_price_cap(types)
    od_types = on_demand_only(capped)
    od_plan: Plan | NoFeasiblePlan | None = None  # solved once spot first fails to fit
    reserve = 0.0
    for _ in range(MAX_TRIES):
        if reserve > budget_usd:
            break
        try:
            plan = min_makespan(capped, private, work, budget_usd - reserve, existing=existing, now_s=now_s,
                                options=options, hint_s=hint_s)
        except NoFeasiblePlan:
            break
        if not launches_spot(plan, capped):
            if reserve <= 0:
                return plan  # running spot instances are there whatever the plan does
            break  # bought without spot on the money the reserve left: on demand with the whole budget
        if isinstance(od_plan, Plan) and plan.makespan_s >= od_plan.makespan_s:
            return od_plan  # what the reserve leaves for spot is no faster than on demand alone
        catalogue = Catalogue.build(capped, private, work, existing, now_s, options)
        need = budget_reserve(plan, capped, work, catalogue=catalogue, options=options, confidence=confidence)
        if plan.cost_usd + need <= budget_usd * (1 + 1e-9):
            return plan
        if od_plan is None:
            try:
                od_plan = min_makespan(od_types, private, work, budget_usd, existing=existing, now_s=now_s,
                                       options=options, hint_s=hint_s)
            except NoFeasiblePlan as exc:
                od_plan = exc
        reserve = max(need, reserve + 0.02 * budget_usd)
    if isinstance(od_plan, Plan):
        return od_plan
    try:
        if isinstance(od_plan, NoFeasiblePlan):
            raise od_plan
        return min_makespan(od_types, private, work, budget_usd, existing=existing, now_s=now_s,
                            options=options, hint_s=hint_s)
    except NoFeasiblePlan as exc:
        raise NoFeasiblePlan(
            f"no plan fits the budget of ${budget_usd:,.2f} whatever happens on spot (spot counted at its price "
            "cap, max_price, and money kept back to redo a whole spot type's work on the others), nor on "
            f"on-demand alone: {exc}", cheapest=lambda: exc.cheapest, fastest=exc.fastest) from None
