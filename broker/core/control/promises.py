"""The promise pass: what the user is promised, and deadlines held at a confidence.

Two rules, each small, each saying what it buys:

- :func:`hold_first_deadline` (deadline goals, first plan). The planner covers an amount of
  work by a horizon; what decides whether the deadline holds is the end of the bag: the
  last tasks to start and the longest still running (ALGORITHMS.md 8). So the first plan is
  the cheapest whose makespan's ``confidence`` quantile, read off the forecast of that plan,
  meets the deadline (:func:`broker.core.plan.promise.hold_deadline`): the horizon starts
  at the deadline and is pulled in by the forecast's overshoot. The difference is the *tail
  allowance*: later plans aim at ``deadline - allowance``. It buys capacity only as far as
  the risk asks. When no plan holds the deadline at the confidence, the note says so, and
  what can be promised, before anything is launched.
- :func:`update_promise` (every goal, after a plan is carried out). The fleet as it now
  stands (releases and launches of this decision included) is forecast, and the promise is
  its point and interval (:meth:`broker.core.plan.promise.Forecast.promise`), with why it
  changed. Under a deadline, when the quantile has crept past the deadline (the work grew,
  a long task started late), the allowance grows by the overshoot and the next re-plan
  comes early: more capacity, bought when the risk says so.

A forecast costs tens of milliseconds (a few tenths of a second for 200 machines), so it is
made at the first plan (``promise_replicates`` replicates), whenever a decision launches,
and otherwise at most every ``promise_every_s`` (refreshes with half the replicates). Its random draws come from a
generator seeded by the moment and the tasks done, so a decision stays a function of its
inputs and the controller's own random stream is left alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..plan.promise import hold_deadline
from .actions import Launch
from .causes import LaunchCause
from .estimate_bias import promise_ratio_se
from .estimates import RemainingWork
from .planning import PlanResult
from .promising import forecast_fleet, tail_fitted, tail_size_ref_s
from .reaction import with_reaction
from .reaction_work import with_work_reaction
from .replan import hedge_can_wait, solve
from .snapshot import Memory, Snapshot

if TYPE_CHECKING:
    from .controller import Controller
    from .scratch import Scratch


def promise_rng(snap: Snapshot, now: float) -> np.random.Generator:
    return np.random.default_rng([int(now * 1000) % (1 << 62), snap.tasks_done, 16])


def _plan_changes(ctl: Controller, plan) -> tuple[dict[str, float], list[tuple[str, int, float]]]:
    margin = ctl.config.margin_s
    releases = {e.instance_id: e.release_at_s - margin for e in plan.existing}
    launches = [(g.type_name, g.count, g.release_after_s - margin) for g in plan.new]
    return releases, launches


def hold_first_deadline(ctl: Controller, snap: Snapshot, memory: Memory, now: float,
                        rem: RemainingWork) -> tuple[PlanResult, Memory]:
    """The first plan under a deadline goal, held at ``config.confidence``; see the module
    docstring. Returns the plan and the memory with the planning deadline pulled in."""
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    conf = ctl.config.confidence
    rng = promise_rng(snap, now)
    tail = tail_size_ref_s(snap, rem, conf)
    memory = replace(memory, tail_size_ref_s=tail, hold_pending=False)

    def plan_for(h: float) -> PlanResult | None:
        r = solve(ctl, snap, replace(memory, deadline_at_s=now + h), now, rem)
        return r if r.plan is not None else None

    def predict(r: PlanResult, gen: np.random.Generator = rng):
        releases, launches = _plan_changes(ctl, r.plan)
        return forecast_fleet(ctl, snap, rem, now, releases, launches, gen, horizon_at_s=now + r.plan.horizon_s
                              if r.plan.horizon_s > 0 else None, tail_ref_s=tail)

    held = hold_deadline(plan_for, predict, float(ctl.goal.value), conf, elapsed_s=now - snap.started_at_s)
    left = deadline_at - now
    if held is not None and (not held.held or held.horizon_s < (1.0 - FAR_PULL) * left):
        waited = defer_hold(ctl, snap, memory, now, rem, plan_for, predict)
        if waited is not None:
            return waited
    if held is None:
        return solve(ctl, snap, memory, now, rem), memory
    result = held.plan
    memory = replace(memory, deadline_at_s=now + held.horizon_s, tail_allowance_s=deadline_at - (now + held.horizon_s))
    if not held.held:
        q = held.forecast.makespan_quantile(conf)
        note = (f"deadline at risk: no plan finishes by the deadline with {100 * conf:g}% confidence; the best "
                f"does by {q:.0f} s from the start ({held.forecast.promise(conf).text()})")
        result = replace(result, cause=LaunchCause.DEADLINE_AT_RISK, reason=note)
    return result, memory


HOLD_WAITS = 4  # re-plans the first plan's hold may wait for the runtimes' law to firm up
FAR_PULL = 0.75  # of the time left: a hold that pulls its horizon in further may wait (defer_hold)


def defer_hold(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
               plan_for, predict) -> tuple[PlanResult, Memory] | None:
    """Rule "a hold that the young law pulls far in waits for the runtimes the next re-plan brings".

    Called when the hold at the confidence (``hold_deadline``) holds the deadline only with a
    horizon pulled in by more than ``FAR_PULL`` (75%) of the time left, or not at all: the first
    plan would then buy nearly the fastest fleet at once. While the remaining work's band,
    (upper - point) / point, is wider than ``hysteresis`` (20%: right after sampling 30
    runtimes of a bag without estimates it is 50% and more), that verdict is mostly the error
    of the runtimes' mean, and that error is mostly gone a re-plan later (thesis LM20 without
    estimates: 31 runtimes at 1.05 h, 341 at the next re-plan 15 minutes on; the band 52% ->
    23%). At FirstFit's makespan (3.39 h) the hold's horizon was 28 minutes of the 2.34 h
    left, and its plan bought all 80 instances for 2 h: $30.91 against FirstFit's $27.49.

    So the deadline is then held at the forecast's *median* (``hold_deadline`` at 0.5: the
    plan for the work's point value, pulled in as far as its median overshoots), provided it
    is held there and the work's upper value still fits in what can be bought at the next
    re-plan (``hedge_can_wait``, at the user's deadline); the hold at the confidence is made
    again at the next re-plan (at most ``HOLD_WAITS`` times in a row), on the runtimes seen
    by then, and carried out as solved; until then the promise's refreshes leave the
    allowance alone. The promise keeps the full uncertainty of the fleet as bought; its
    median meets the deadline. What it buys (bench/league.py --quick, seed 1, on main at
    a6cafe8): LM20 without estimates at FirstFit's makespan $49.76 -> $25.43 (FirstFit
    $27.49: 1.81x -> 0.925x its cost), the deadline met (2.65 h of 3.39 h);
    over seeds 1-6 at 1.0, 0.8, 0.74 and 0.6 x the knee's deadline, LM20 without estimates
    1.58/1.58/1.60/1.64 -> 1.29/1.44/1.48/1.64 x the fluid bound on average, the heavy tail
    1.21/1.25/1.36/1.43 -> 1.21/1.26/1.34/1.42, every deadline met as before. ``FAR_PULL``
    is 0.75: waiting whenever the band is wide, or from a pull of half the time left, made
    the first promise of bench/promises.py's thesis LL bag miss the delivered makespan in 2
    of 10 runs (none before), and waiting on every wide band held the makespan in 70-80% of
    logn-1 and bimodal runs at 10% done (90-100% before). None: hold now."""
    if not ctl.config.hedge_later or rem.point_ref_s <= 0 or memory.hold_waits >= HOLD_WAITS:
        return None
    if rem.band <= ctl.config.hysteresis:
        return None
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    # its own draws (the generator the hold used is left where the hold left it)
    gen = np.random.default_rng([int(now * 1000) % (1 << 62), snap.tasks_done, 15])
    held = hold_deadline(plan_for, lambda r: predict(r, gen), float(ctl.goal.value), 0.5,
                         elapsed_s=now - snap.started_at_s)
    if held is None or not held.held or held.plan.cause != LaunchCause.DEADLINE_PLAN:
        return None
    if not hedge_can_wait(ctl, snap, replace(memory, deadline_at_s=deadline_at), now, rem, held.plan.plan):
        return None
    at = now + held.horizon_s
    return held.plan, replace(memory, deadline_at_s=at, tail_allowance_s=deadline_at - at, hold_pending=True,
                              hold_waits=memory.hold_waits + 1)


def update_promise(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                   s: Scratch, cause: str | None) -> Memory:
    """Forecast the fleet as this decision leaves it and keep the promise; see the module docstring."""
    launched = any(isinstance(a, Launch) for a in s.actions)
    due = (memory.promise is None or launched or memory.promise_at_s is None
           or now - memory.promise_at_s >= ctl.config.promise_every_s - 1e-9)
    if not due:
        return memory
    launches = [(a.type_name, a.count, a.release_after_s) for a in s.actions if isinstance(a, Launch)]
    horizon = None if ctl.goal.kind == "budget" else memory.deadline_at_s
    conf = ctl.config.confidence
    if ctl.goal.kind == "deadline":
        memory = replace(memory, tail_size_ref_s=tail_size_ref_s(snap, rem, conf))
    # the first promise with every replicate; refreshes with half (a forecast of a large
    # fleet costs a fraction of a second, and a refresh corrects the last one)
    reps = ctl.config.promise_replicates if memory.first_promise is None else ctl.config.promise_replicates // 2
    f = forecast_fleet(ctl, snap, rem, now, dict(s.release), launches, promise_rng(snap, now), horizon,
                       memory.tail_size_ref_s, replicates=reps)
    if f is None:
        return memory
    # the estimates' bias as the user is told it (estimate_bias.py)
    se = promise_ratio_se(snap, ctl.config.estimate_bias, conf)
    told = _after_give_backs(ctl, snap, memory, now, rem, s, launches, f, reps, horizon, se)
    told = with_reaction(ctl, snap, memory, now, rem, s, launches, told, reps, se)  # reaction.py
    told = with_work_reaction(ctl, snap, memory, now, rem, s, launches, told, se)  # reaction_work.py
    why = ("first plan" if memory.first_promise is None else f"re-plan ({cause or 'replan'})") + (
        f": {rem.pending} tasks pending, {rem.running} running, {rem.point_ref_s:.4g} ref-s of work left")
    tol = min(ctl.config.hysteresis, max(ctl.config.hysteresis_min, promise_band(rem)))
    promise = told.promise(conf, why, tolerance=tol, cost_tolerance=cost_tolerance(ctl, snap, memory, told, tol))
    memory = replace(memory, promise=promise, promise_at_s=now,
                     first_promise=memory.first_promise if memory.first_promise is not None else promise)
    if ctl.goal.kind == "deadline" and memory.deadline_at_s is not None and not memory.hold_pending:
        # (a hold still waiting for the next re-plan sets the allowance then: defer_hold)
        memory = _adjust_allowance(ctl, snap, memory, now, f, s)
    return memory


def promise_band(rem: RemainingWork) -> float:
    """The work's relative band the promise widens its interval by (before the hysteresis
    bounds): (upper - point) / point less the correction ratio's share, which the forecast
    draws in every replicate (``RuntimeLaw.ratio_rel_se``, the same s_r / sqrt(k + prior
    weight)). Counted in both, it made the first promise of a bag with estimates twice as
    wide as its uncertainty: LM, 10,000 tasks with estimates within 10%, 18.7% in cost and
    12.4% in time, 4.7% on each side of either the band added again."""
    return rem.band - rem.ratio_upper_ref_s / max(rem.point_ref_s, 1e-9)


SETTLED_STEPS = 2  # of the priciest instance-hour: a cost interval narrower than this reads as settled


def cost_tolerance(ctl: Controller, snap: Snapshot, memory: Memory, told, tolerance: float) -> float:
    """Rule "the cost interval spans the controller's hysteresis band only where the forecast
    cannot".

    The band (``tolerance``) moves both bounds of the promise out by the work's relative band
    times what is left: a change of the work smaller than the band is not acted on, so what
    is still to come may end that much either side of where the forecast's fleet puts it.
    For the makespan that is real: without it the promise at 10% done held the delivered
    makespan in 48% of bimodal runs and 75% of lognormal(sigma 0.5) ones (40 seeds; 92% and
    100% with it). The cost of the rest is the work's: each replicate draws the work's mean
    (bootstrap) and the tasks' spread and pays for it on the fleet the controller keeps, so
    the band counted that uncertainty twice (at 10% done the cost interval was 2.3x the floor
    2 z cv / sqrt(n) and held the delivered cost in 100% of runs). After the first promise
    the cost's tolerance is ``hysteresis_min`` (1%); at 10% done, 40 seeds (bench/results/
    promises-costband40.txt): lognormal(sigma 0.5) 10.4% -> 6.4% wide, held in 95% of runs;
    bimodal 18.3% -> 9.4%, 100%; lognormal(sigma 1) 25.9% -> 14.7%, 90%; thesis LL 32.1% ->
    14.9%, 90%; 20 seeds (promises.txt): LM 40.8% -> 18.6%, 95%. (The other figures here were
    recomputed from the forecasts of those runs, whose decisions no tolerance changes.)

    It keeps the band (1) at the first promise: its fleet is the first plan, bought on 30
    runtimes, and the re-plans that follow reshape it as the mean firms up, which the
    forecast does not carry out (with 1% there, lognormal(sigma 0.5) held the cost in 85% of
    runs, LM in 87%); (2) where the forecast's cost interval spans fewer than
    ``SETTLED_STEPS`` instance-hours (billing units) of the catalogue's priciest type: the
    replicates then agree on which hours are paid, and the controller's later re-plans,
    which add or drop an instance-hour, are not drawn (thesis LS with boot delays, $18 a run,
    one c1.xlarge hour 3.6% of it: with 1% the cost held in 88% of 40 runs, 95% with the
    band)."""
    if memory.first_promise is None:
        return tolerance
    conf = ctl.config.confidence
    step = max((t.unit_cost_usd for t in snap.types.values()), default=0.0)
    if told.cost_quantile(1 - (1 - conf) / 2) - told.cost_quantile((1 - conf) / 2) < SETTLED_STEPS * step:
        return tolerance
    return min(tolerance, ctl.config.hysteresis_min)


GIVE_BACK_ROUNDS = 8  # the controller's give-backs a promise looks ahead (each halves the slack)


def _give_back_s(ctl: Controller, snap: Snapshot, tail_allowance_s: float, now: float, f) -> float:
    """What :func:`_adjust_allowance` gives back of the tail allowance on forecast ``f`` (0: none)."""
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    slack = deadline_at - (snap.started_at_s + f.makespan_quantile(ctl.config.confidence))
    if tail_allowance_s > 0 and slack > 0.05 * max(deadline_at - now, 1.0):
        return min(tail_allowance_s, 0.5 * slack)
    return 0.0


def _after_give_backs(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: Scratch,
                      launches, f, reps: int, horizon0: float | None = None, told_se: float | None = None):
    """The forecast a deadline's promise is read off: the fleet shed against the planning
    deadline the controller holds now, and against the one it will hold.

    Under a deadline the planning deadline is pulled in by a tail allowance, and each
    refresh that finds slack gives half of it back (:func:`_adjust_allowance`); the fleet is
    then shed against the later deadline and the run ends later. A promise read off the
    fleet shed against today's planning deadline alone missed the delivered makespan in 65%
    of the bimodal runs (20 seeds, the promise made at 10% done; ``bench/promises.py``),
    mostly below it. So the give-backs the rule makes are carried out here, in turn (each on
    the forecast of the one before); whether the run will bear them out (a later overshoot
    pulls the deadline in again) is not known now, so the promise is read off the replicates
    of both forecasts: the run as it stands and the run after the give-backs. (Off the
    second alone, the thesis LL bag was promised too late as often as before too early.)

    ``told_se``: the correction ratio's error the promise states (``estimate_bias.py``), when
    it is not the controller's: the give-backs are decided on the controller's forecasts, and
    the runs they leave are forecast again with it (the same draws otherwise), and with the
    promise's runtime law (the censored tail fitted, ``promising.runtime_law``) and its
    lengthening rule (``shed.py``), which the controller's forecasts leave out."""
    fitted = tail_fitted(snap)

    def told(h, t, g):
        if told_se is None and not fitted:
            return g
        again = forecast_fleet(ctl, snap, rem, now, dict(s.release), launches, promise_rng(snap, t), h,
                               memory.tail_size_ref_s, replicates=reps, ratio_rel_se=told_se, fit_tail=fitted)
        return g if again is None else again

    if ctl.goal.kind != "deadline" or memory.deadline_at_s is None:
        return told(horizon0, now, f)
    now_f = f
    allowance, horizon = memory.tail_allowance_s, memory.deadline_at_s
    at = now
    for k in range(GIVE_BACK_ROUNDS):
        give = _give_back_s(ctl, snap, allowance, now, f)
        if give <= 0:
            break
        allowance, horizon = allowance - give, horizon + give
        later = forecast_fleet(ctl, snap, rem, now, dict(s.release), launches, promise_rng(snap, now + k + 1),
                               horizon, memory.tail_size_ref_s, replicates=reps)
        if later is None:
            break
        f, at = later, now + k + 1
    first = told(memory.deadline_at_s, now, now_f)
    return first if f is now_f else _mixture(first, told(horizon, at, f))


def _mixture(a, b):
    """One forecast of the replicates of both: the run as either of them."""
    def both(x, y):
        return None if x is None or y is None else np.concatenate([x, y])

    return replace(b, makespans_s=np.concatenate([a.makespans_s, b.makespans_s]),
                   costs_usd=np.concatenate([a.costs_usd, b.costs_usd]),
                   running_ends_s=both(a.running_ends_s, b.running_ends_s), stopped=both(a.stopped, b.stopped),
                   ratios=both(a.ratios, b.ratios), work_ref_s=both(a.work_ref_s, b.work_ref_s),
                   fallbacks=max(a.fallbacks, b.fallbacks))


def _adjust_allowance(ctl: Controller, snap: Snapshot, memory: Memory, now: float, f, s: Scratch) -> Memory:
    """Keep the makespan's quantile on the deadline. On an overshoot, pull the planning
    deadline in by it (and re-plan soon), but only as far as capacity can help: not when
    the tasks running now alone already end past the deadline at the quantile (no machine
    bought shortens them: the note says so), and never by more than half of the time left
    to the user's deadline (a planning deadline in the past would buy the fastest fleet
    for the last few tasks). On a slack of more than 5% of the time left, give back half
    of it (a pull made on a loose early estimate is not kept to the end)."""
    conf = ctl.config.confidence
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    over = snap.started_at_s + f.makespan_quantile(conf) - deadline_at
    room = memory.deadline_at_s - now
    if over > 0:
        running = None if f.running_ends_s is None else snap.started_at_s + float(np.quantile(f.running_ends_s, conf))
        if running is not None and running > deadline_at:
            s.notes.append(f"deadline at risk at {100 * conf:g}%: tasks running now may end "
                           f"{running - deadline_at:.0f} s past it; more machines would not help")
            return memory
        pull = min(over + 0.02 * room, memory.deadline_at_s - (now + 0.5 * (deadline_at - now)))
        if pull <= 0 or room <= ctl.config.min_replan_gap_s:
            return memory
        s.notes.append(f"deadline at risk at {100 * conf:g}%: the makespan's quantile is {over:.0f} s past it; "
                       f"planning {pull:.0f} s earlier")
        return replace(memory, deadline_at_s=memory.deadline_at_s - pull,
                       tail_allowance_s=memory.tail_allowance_s + pull,
                       # the next re-plan comes after the shortest gap, not the regular interval
                       last_plan_at_s=now - ctl.config.replan_every_s + ctl.config.min_replan_gap_s)
    give = _give_back_s(ctl, snap, memory.tail_allowance_s, now, f)
    if give > 0:
        return replace(memory, deadline_at_s=memory.deadline_at_s + give,
                       tail_allowance_s=memory.tail_allowance_s - give)
    return memory
