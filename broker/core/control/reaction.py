"""The controller's reaction to a bag whose estimates are off as a whole, in the promise.

Until tasks with estimates have ended (``estimate_bias.RATIO_MIN_TASKS``) the promise draws
the estimates' correction ratio ``rho`` around 1 with the stated (or assumed) bias
(``estimate_bias.py``); its forecast then carries out the fleet as this decision leaves it,
shed or kept on to the planning deadline: a replicate with more work than that fleet
covers runs late, its makespan stretched with the work. The controller does not let it:
once the first tasks show the ratio (an hour in), its forecasts overshoot the deadline,
the tail allowance pulls the planning deadline in by the overshoot
(``promises._adjust_allowance``) and the re-plan buys for the larger work by then. The run
ends early, not late (thesis LM, 10,000 tasks, every estimate 10% low, undeclared: the
first promise said 17.7 h (90%: 17.4-20.2 h); the controller pulled its planning deadline
in three times, bought three c1.xlarge and ended at 15.8 h; the interval held the makespan
in 30% of 20 runs).

So the promise carries the reaction out per stratum of ``rho``: the told forecast's
replicates are split by the ratio each drew into ``STRATA`` groups; from the largest down,
a group's ratio (its median) is given to the controller's own rules as if it were known
(the work scaled by it, the ratio's error the group's spread): the fleet as left by this
decision is forecast with the controller's law; while its makespan's ``confidence``
quantile overshoots the deadline, the planning deadline is pulled in as
``_adjust_allowance`` does and the remaining plan re-solved as a re-plan does
(``replan.solve``, the fleet so far as existing instances), at most ``ROUNDS`` times.
When that changed the fleet, the reacted fleet's forecast (the promise's law and view)
joins the group's replicates, and those of the group that ended past the deadline leave:
the controller holds the deadline, so a run past it is one it has reacted in; one that
ends before it may have been absorbed by the fleet it had (the reaction comes when the
overshoot shows, an hour or three in: on a 3,000-task bag the controller did not buy and
ended near the stretched fleet's end), so both stay. The first group whose fleet needs no
reaction ends the walk (a smaller ratio needs less). Only the promise reads this: nothing
here is a decision, and its draws come from their own generators.

What is left out: the reaction is solved at the promise's moment, not an hour later with
an hour of the old fleet's work done; a ratio below 1 changes nothing here (the controller
corrects the work only upward, ``estimates.remaining_work``; the forecast's shedding is
its answer to less work).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .estimate_bias import RATIO_MIN_TASKS
from .promising import forecast_fleet, tail_fitted
from .replan import solve
from .snapshot import NodeView

if TYPE_CHECKING:
    from .controller import Controller
    from .estimates import RemainingWork
    from .scratch import Scratch
    from .snapshot import Memory, Snapshot

STRATA = 8  # groups of the told forecast's replicates by the ratio they drew
ROUNDS = 4  # re-plans a group's reaction may take (the controller pulled in 3 times on LM-est10-low)


def applies(ctl: Controller, snap: Snapshot, told, told_se: float | None) -> bool:
    """Deadline goals, tasks with estimates left (``told_se``: the ratio's error the promise
    states, None without them), before the ratio is known."""
    obs = snap.observations
    return (ctl.goal.kind == "deadline" and told_se is not None and told_se > 0 and told.ratios is not None
            and told.ratios.size >= STRATA
            and not (obs.count_with_estimate >= RATIO_MIN_TASKS and obs.count == obs.count_with_estimate))


def with_reaction(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: Scratch,
                  launches, told, reps: int, told_se: float | None):
    """``told`` with the forecast of the controller's reaction joined to each ratio group it
    would react to, that group's replicates past the deadline left out; see the module docstring."""
    if not applies(ctl, snap, told, told_se) or memory.deadline_at_s is None:
        return told
    order = np.argsort(told.ratios, kind="stable")
    keep = np.ones(told.ratios.size, dtype=bool)
    fleet = after_decision(snap, now, dict(s.release), launches)
    extra = []
    for k, idx in enumerate(reversed(np.array_split(order, STRATA))):
        r = told.ratios[idx]
        rho = float(np.median(r))
        if rho <= rem.estimate_ratio + 1e-9:
            break
        f = reacted(ctl, fleet, memory, now, _scaled(rem, snap, rho), idx.size, k, ratio_rel_se=float(np.std(r) / rho))
        if f is None:
            break
        # past the deadline the controller has reacted; before it, either may happen
        keep[idx] = told.makespans_s[idx] <= float(ctl.goal.value)
        extra.append((f, r))
    return joined(told, keep, [f for f, _ in extra], [r for _, r in extra])


def joined(told, keep, reacted_forecasts, ratios):
    """``told``'s replicates where ``keep``, then each reacted forecast's, replicate by replicate
    (``ratios``: the ratio each reacted replicate counts as having drawn); ``told`` itself when
    nothing reacted."""
    if not reacted_forecasts:
        return told

    def cat(x, ys):
        return None if x is None or any(y is None for y in ys) else np.concatenate([x[keep]] + ys)

    fs = reacted_forecasts
    return replace(told, makespans_s=cat(told.makespans_s, [f.makespans_s for f in fs]),
                   costs_usd=cat(told.costs_usd, [f.costs_usd for f in fs]), ratios=cat(told.ratios, ratios),
                   running_ends_s=cat(told.running_ends_s, [f.running_ends_s for f in fs]),
                   stopped=cat(told.stopped, [f.stopped for f in fs]),
                   work_ref_s=cat(told.work_ref_s, [f.work_ref_s for f in fs]))


def after_decision(snap: Snapshot, now: float, releases, launches) -> Snapshot:
    """The snapshot as this decision leaves it: new releases, the launches as instances."""
    nodes = [replace(n, release_at_s=releases[n.id]) if n.id in releases else n for n in snap.nodes]
    for name, count, life_s in launches:
        t = snap.types[name]
        for _ in range(count):
            nodes.append(NodeView(f"promise-{len(nodes)}", t.slots, t.speed, (), name, now, now + t.boot_s,
                                  t.billing.paid_until(now, now + 1e-3), now + max(life_s, t.boot_s)))
    return replace(snap, nodes=tuple(nodes), free_nodes=None)


def _scaled(rem: RemainingWork, snap: Snapshot, rho: float) -> RemainingWork:
    """The remaining work with the estimates corrected by ``rho`` (the ratio known)."""
    known = snap.pending.known_total_ref_s * rem.estimate_ratio
    extra = known * (rho / rem.estimate_ratio - 1.0)
    own = rem.upper_ref_s - rem.point_ref_s - rem.ratio_upper_ref_s  # the band less the ratio's share
    return replace(rem, point_ref_s=rem.point_ref_s + extra, upper_ref_s=rem.point_ref_s + extra + max(own, 0.0),
                   estimate_ratio=rho, ratio_upper_ref_s=0.0)


def reacted(ctl: Controller, snap: Snapshot, memory: Memory, now: float, work: RemainingWork, reps: int, k: int,
            salt: int = 17, **law_kw):
    """The promise's forecast of the fleet the controller ends with once it knows the work is
    ``work`` (None: it keeps the fleet it has); ``law_kw``: the law of that work, for
    ``forecast_fleet`` (``ratio_rel_se``, ``law_of``); ``salt``: the draws' own stream."""
    conf = ctl.config.confidence
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    reacted = False
    for round_ in range(ROUNDS):
        gen = np.random.default_rng([int(now * 1000) % (1 << 62), snap.tasks_done, salt, k, round_])
        f = forecast_fleet(ctl, snap, work, now, {}, [], gen, memory.deadline_at_s, memory.tail_size_ref_s,
                           replicates=reps, **law_kw)
        if f is None:
            return None
        over = snap.started_at_s + f.makespan_quantile(conf) - deadline_at
        # the pull of promises._adjust_allowance
        pull = min(over + 0.02 * (memory.deadline_at_s - now),
                   memory.deadline_at_s - (now + 0.5 * (deadline_at - now)))
        if over <= 0 or pull <= 0:
            break
        memory = replace(memory, deadline_at_s=memory.deadline_at_s - pull,
                         tail_allowance_s=memory.tail_allowance_s + pull)
        result = solve(ctl, snap, memory, now, work)  # the re-plan on the corrected work, by then
        if result.plan is None:
            break
        margin = ctl.config.margin_s
        releases = {e.instance_id: e.release_at_s - margin for e in result.plan.existing}
        snap = after_decision(snap, now, releases,
                               [(g.type_name, g.count, g.release_after_s - margin) for g in result.plan.new])
        reacted = True
    if not reacted:
        return None
    gen = np.random.default_rng([int(now * 1000) % (1 << 62), snap.tasks_done, salt + 1, k])
    return forecast_fleet(ctl, snap, work, now, {}, [], gen, memory.deadline_at_s, memory.tail_size_ref_s,
                          replicates=reps, fit_tail=tail_fitted(snap), **law_kw)
