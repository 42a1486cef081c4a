"""A promise with its real uncertainty: "done in 19.6 h (90%: 18.9-20.0 h), $231 (90%: $219-$246)".

ALGORITHMS.md 8. A plan is a fleet: slots of speed ``s_j`` usable from ``a_j`` (boot done,
or now) until the planned release ``r_j`` (infinite for private nodes). What it delivers
depends on runtimes nobody knows yet, so the promise is read off ``R`` replicates of the
rest of the run, each a cheap simulation of the plan carried out by list scheduling
(the controller's own dispatch: a free slot takes the next task that fits before its
release, largest estimate first, tasks without one in the bag's random order).

Uncertainty in a replicate ``r`` (notation: ``F`` the runtime distribution in reference
seconds, ``n_o`` the runtimes it was estimated from):

- **the mean and the shape of F** (its sampling error): an observed law (Kaplan-Meier over
  finished tasks with the running ones censored, ``broker.core.estimate.survival``) is
  re-weighed in each replicate by a Bayesian bootstrap, its mean moved to the bootstrap-t
  reading (``law.py``); a stated law (a lognormal of a given mean and sd on 4,096 quantile
  atoms) is scaled by ``m_r = exp(e_r sqrt(log(1 + c^2)) - log(1 + c^2) / 2)``,
  ``e_r ~ N(0, 1)``, ``c`` the relative standard error of its mean;
- **the spread and the tail** of the tasks' own runtimes: each task's runtime is a draw of
  the replicate's law; a single task may also outrun everything seen (the unseen tail,
  ``law.py``); a task with an estimate ``e`` runs ``e rho_r exp(N(0, s_r^2) - s_r^2 / 2)``
  with ``s_r`` the relative error of the estimates and ``rho_r`` the correction ratio drawn
  around its value with its standard error; no draw exceeds the cap (the timeout);
- **running tasks**: one of age ``a`` still needs ``X - a`` with ``X`` conditioned on
  ``X > a`` (the conditional atoms); when no runtime seen is longer than ``a``, an
  exponential remainder (``law.py``), flagged in ``Forecast.fallbacks``;
- **boot delays and billing rounding** are carried out exactly: a slot starts at its ready
  time; an instance is charged by its billing model from launch to
  ``max(e_i, min(r_i, M, e_i + d))``, with ``e_i`` its last task's end, ``M`` the end of
  the bag and ``d`` the controller's surplus delay (a task that runs past the planned
  release keeps its instance; an instance idle at the bag's end is shed at its billing
  boundary once its surplus has lasted ``d``; the bag's end releases everything);
- **speed calibration**: optionally each machine's speed is scaled by
  ``exp(N(0, speed_rel_sd^2))`` per replicate (0 when speeds are measured).

Fast path. Only the end of a bag needs task-by-task scheduling: while work is plentiful every
slot is busy, and the bulk's total ``W_b`` (sum of the first ``n_p - K`` tasks) is a sum of
independent runtimes: drawn exactly when small, else ``N(n m_r mu, n m_r^2 sigma^2)`` (central
limit). The last bulk task is handed out at ``t_b``; each slot still in its
window is then part-way through a bulk task, whose remaining work ``rho_j`` has the
equilibrium (length-biased) residual law of renewal theory: density ``S(x) / mu``, drawn as
``U X*`` with ``X*`` a length-biased draw. So ``t_b`` solves
``C(t_b) = W_b - sum_{j open at t_b} rho_j`` with the fleet's fluid capacity
``C(t) = sum_j s_j clip(min(t, r_j - mu/(2 s_j)) - b_j, 0)`` (``b_j`` when the slot is free of
its running task; half a mean task per slot is the end-of-life waste the fit rule leaves),
and slot ``j`` is next free at ``t_b + rho_j / s_j``. The last
``K = min(n_p, 3 x slots)`` tasks are then list-scheduled exactly, vectorised over the
replicates. Work past every release (the plan was short in this replicate) runs on the
slot free first, as the controller would extend or buy; this replicate then overruns. With
a planning deadline ``H`` (and no budget) a private node takes work only as far as it ends
by ``H``: the controller holds ``H`` by keeping instances on, it does not leave the rest to
a slow private node up to the user's deadline (while ``H`` is far, the private node does
take what the instances leave).

The controller's own rules, carried out per replicate. With a planning deadline ``H``
(every goal but a budget) it sheds the capacity the replicate's work does not need by ``H``
(whole billing units, the instance leaving first pulled in furthest, a ``keep_margin``
kept), or keeps its instances on up to ``H`` when the work needs more (``shed.py``).
Near a user's deadline a slot slower than the fastest takes no task
whose high quantile (``tail_ref_s``) would end after the deadline there. Tail
replication: a task still running past its assumed size (the fit size, F's 90% quantile)
is copied to a free slot more than twice as fast and the first result wins; applied to
the three tasks that end last.

A replicate gives makespan ``M_r`` (from the run's start) and cost ``C_r`` = spend already
closed + every live or planned instance's charge + private nodes' hourly cost times
``M_r``. The promise is the median and the central ``1 - delta`` interval
``[q_{delta/2}, q_{1 - delta/2}]`` of each, each bound moved away by the controller's
hysteresis band times what is still to come (``Forecast.promise``: a change of the work
smaller than the band is not acted on); a deadline ``T`` is held at confidence
``1 - delta`` when ``q_{1 - delta}(M) <= T`` (:func:`hold_deadline`).

Pure: numpy only, a seeded generator passed in, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..billing import Billing
from .hold import HeldDeadline, hold_deadline
from .law import RuntimeLaw, _Replicas
from .shed import shed as _shed

__all__ = ["Forecast", "HeldDeadline", "Machine", "Pending", "Promise", "RuntimeLaw", "forecast", "hold_deadline"]

REPLICATES = 200
TAIL_SLOTS_FACTOR = 3  # tasks scheduled one by one at the end: this many per slot
EXACT_BULK_DRAWS = 100_000  # below this many draws the bulk is summed exactly (else the CLT)
IDLE_RELEASE_S = 600.0  # an instance idle at the bag's end is shed once its surplus lasted this long
# (the default of ControllerConfig.scale_down_after_s; the controller passes its own as ``idle_release_s``)


@dataclass(frozen=True, slots=True)
class Promise:
    """What the user is promised: points and (``confidence``) central intervals.

    ``makespan_s`` counts from the run's start. A range is None when nothing uncertain is
    left to spread it (or the promise was made without a forecast).
    """

    confidence: float
    makespan_s: float
    cost_usd: float
    makespan_s_range: tuple[float, float] | None = None
    cost_usd_range: tuple[float, float] | None = None
    why: str | None = None  # what made this promise (first plan, re-plan and its cause)
    # Under a budget: the cap (no cost promised above it) and the share of forecasts in
    # which the budget stops the run with work left (the run then exits 1).
    budget_usd: float | None = None
    stop_share: float = 0.0

    def to_json(self) -> dict:
        def rng(r, digits):
            return None if r is None else [round(float(r[0]), digits), round(float(r[1]), digits)]

        return {
            "confidence": self.confidence,
            "makespan_s": round(float(self.makespan_s), 1),
            "makespan_s_range": rng(self.makespan_s_range, 1),
            "cost_usd": round(float(self.cost_usd), 4),
            "cost_usd_range": rng(self.cost_usd_range, 4),
        } | ({} if self.budget_usd is None else {"budget_usd": self.budget_usd,
                                                  "stop_share": round(float(self.stop_share), 4)})

    def text(self) -> str:
        """``done in 19.6 h (90%: 18.9-20.0 h), $231 (90%: $219-$246)``."""
        pct = f"{100 * self.confidence:g}%"
        hours = self.makespan_s >= 3600 * 2
        unit, div = ("h", 3600.0) if hours else ("min", 60.0)
        t = f"{'ends' if self.stop_share > 0 else 'done'} in {self.makespan_s / div:.1f} {unit}"
        if self.makespan_s_range is not None:
            lo, hi = self.makespan_s_range
            t += f" ({pct}: {lo / div:.1f}-{hi / div:.1f} {unit})"
        t += f", ${self.cost_usd:,.2f}"
        if self.cost_usd_range is not None:
            lo, hi = self.cost_usd_range
            t += f" ({pct}: ${lo:,.2f}-${hi:,.2f})"
        if self.stop_share > 0:
            t += (f"; the budget of ${self.budget_usd:,.2f} may stop the run with work left "
                  f"({100 * self.stop_share:.0f}% of forecasts; exit 1)")
        return t

    def holds(self, makespan_s: float, cost_usd: float) -> tuple[bool, bool]:
        """Whether a delivered makespan and cost lie inside the promised ranges."""
        def inside(x, r, point, tol):
            lo, hi = r if r is not None else (point, point)
            return lo - tol <= x <= hi + tol

        return inside(makespan_s, self.makespan_s_range, self.makespan_s, 1e-6), inside(
            cost_usd, self.cost_usd_range, self.cost_usd, 1e-9)


# -- the fleet --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Machine:
    """One private node or (existing or planned) instance as the plan leaves it.

    ``ready_at_s``: when its slots can take work; ``release_at_s``: planned release (inf for
    a private node); ``running``: (age_ref_s, estimate_ref_s or None) per busy slot;
    ``launched_at_s`` and ``billing`` are None for a private node, whose ``price_per_hour``
    is its amortised cost over the makespan.
    """

    slots: int
    speed: float
    ready_at_s: float
    release_at_s: float = math.inf
    price_per_hour: float = 0.0
    launched_at_s: float | None = None
    billing: Billing | None = None
    running: tuple[tuple[float, float | None], ...] = ()
    type_name: str | None = None

    @property
    def is_private(self) -> bool:
        return self.billing is None


@dataclass(frozen=True, slots=True)
class Forecast:
    """Replicates of the rest of the run: makespans from the run's start and total costs."""

    makespans_s: np.ndarray
    costs_usd: np.ndarray
    fallbacks: int = 0  # running tasks older than every observation (cap used)
    # When the tasks running now end (from the run's start), whatever else is bought: the
    # part of the makespan no capacity can shorten (None: nothing runs).
    running_ends_s: np.ndarray | None = None
    elapsed_s: float = 0.0  # the forecast's moment, from the run's start
    spent_usd: float = 0.0  # what is already spent for good (terminated instances)
    budget_usd: float | None = None  # the cap every cost is held to (None: no budget)
    stopped: np.ndarray | None = None  # per replicate: the budget stops the run with work left
    ratios: np.ndarray | None = None  # per replicate: the estimates' correction ratio drawn (control/reaction.py)
    work_ref_s: np.ndarray | None = None  # per replicate: the work left at its moment (control/reaction_work.py)

    def makespan_quantile(self, q: float) -> float:
        return float(np.quantile(self.makespans_s, q))

    def cost_quantile(self, q: float) -> float:
        return float(np.quantile(self.costs_usd, q))

    def promise(self, confidence: float, why: str | None = None, tolerance: float = 0.0,
                cost_tolerance: float | None = None) -> Promise:
        """Medians and central ``confidence`` intervals. ``tolerance``: the relative change of
        the work the controller lets pass without acting (its hysteresis band): what is still
        to come may end that much either side of where the forecast's fleet puts it, so each
        bound moves away from the point by that share of what is left (time after
        ``elapsed_s``, spend beyond ``spent_usd``). ``cost_tolerance``: the cost's own share
        (default ``tolerance``; ``promises.cost_tolerance``)."""
        lo, hi = (1 - confidence) / 2, 1 - (1 - confidence) / 2
        m, c = self.makespans_s, self.costs_usd

        def band(x, base, cap=math.inf, tol=tolerance):
            a, b = float(np.quantile(x, lo)), float(np.quantile(x, hi))
            return min(a - tol * max(a - base, 0.0), cap), min(b + tol * max(b - base, 0.0), cap)

        cap = math.inf if self.budget_usd is None else self.budget_usd  # a budget is a hard cap
        cost_tol = tolerance if cost_tolerance is None else cost_tolerance
        return Promise(
            confidence=confidence,
            makespan_s=float(np.median(m)), cost_usd=min(float(np.median(c)), cap),
            makespan_s_range=band(m, self.elapsed_s), cost_usd_range=band(c, self.spent_usd, cap, cost_tol),
            why=why, budget_usd=self.budget_usd,
            stop_share=0.0 if self.stopped is None else float(np.mean(self.stopped)),
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """The tasks not started: how many have no estimate, and the estimates of the others."""

    unknown: int
    estimates_ref_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def count(self) -> int:
        return self.unknown + int(self.estimates_ref_s.size)


def forecast(
    machines: Sequence[Machine],
    law: RuntimeLaw,
    pending: Pending,
    *,
    now_s: float,
    started_at_s: float = 0.0,
    spent_usd: float = 0.0,
    rng: np.random.Generator,
    replicates: int = REPLICATES,
    speed_rel_sd: float = 0.0,
    fit_ref_s: float | None = None,
    horizon_at_s: float | None = None,
    keep_margin: float | tuple[float, float] = 0.05,
    end_allowance_s: float = 300.0,
    deadline_at_s: float | None = None,
    tail_ref_s: float | None = None,
    budget_usd: float | None = None,
    idle_release_s: float = IDLE_RELEASE_S,
    bare_lengthen: bool = False,
) -> Forecast:
    """Simulate the rest of the run ``replicates`` times; see the module docstring.

    ``spent_usd``: what instances already terminated cost (live ones are charged here from
    their launch). ``fit_ref_s``: the size the dispatcher assumes for a task without an
    estimate when it checks a task fits before a release (default F's 90% quantile).
    ``horizon_at_s``: the controller's planning deadline; when given, each replicate sheds the
    capacity its work does not need by then with a ``keep_margin`` (a pair: uniform between the
    two in each replicate, for a controller whose margin narrows as it learns), counting a
    slot's capacity as the controller does, less ``end_allowance_s`` and half a mean task.
    ``deadline_at_s``, ``tail_ref_s``: the dispatcher's straggler rule: a slot slower than
    the fastest takes no task once ``tail_ref_s`` would not end there by the deadline.
    ``budget_usd``: a hard cap: no instance works past its release, work left goes to the private
    nodes or stays undone (the run stops, exit 1), no cost exceeds the cap. ``bare_lengthen``:
    the promise's view of lengthening (``shed.py``), not the controller's."""
    R = int(replicates)
    slots = _slot_table(machines)
    if (m := slots["speed"].size) == 0:
        raise ValueError("a forecast needs at least one machine slot")
    speed = np.broadcast_to(slots["speed"], (R, m)).copy()
    if speed_rel_sd > 0:
        per_machine = np.exp(rng.standard_normal((R, len(machines))) * speed_rel_sd)
        speed *= per_machine[:, slots["machine"]]
    laws = _Replicas(law, R, rng)
    ratio = law.mean_multipliers(rng, R, law.ratio_rel_se) * law.estimate_ratio
    busy, fallbacks = _running_ends(machines, laws, ratio, speed, now_s, rng)
    fit_u = law.quantile(0.9) if fit_ref_s is None else fit_ref_s
    order = _dispatch_order(pending, fit_u, rng)
    K = min(pending.count, TAIL_SLOTS_FACTOR * m)
    bulk, tail = order[: pending.count - K], order[pending.count - K:]
    work = _bulk_work(bulk, laws, ratio, rng) if bulk.size else np.zeros(R)
    x = _draw_tasks(tail, laws, ratio, rng)
    rel = np.broadcast_to(slots["release"], (R, m)).copy()
    left = work + x.sum(axis=1) + ((busy - now_s) * speed).sum(axis=1)
    if horizon_at_s is not None:
        lo, hi = keep_margin if isinstance(keep_margin, tuple) else (keep_margin, keep_margin)
        keep = lo + (hi - lo) * rng.random(R)
        need = left * (1.0 + keep)
        start = busy + end_allowance_s + 0.5 * laws.mean[:, None] / speed
        bare = need / (1.0 + keep) if bare_lengthen else None
        rel = _shed(machines, slots, rel, busy, start, speed, need, horizon_at_s, now_s, bare)
    planned_rel = rel.copy()
    if deadline_at_s is not None and tail_ref_s is not None:
        # a task of the fit size fits before ``cutoff`` iff its high quantile ends by the deadline
        slow = speed < speed.max(axis=1, keepdims=True)
        cutoff = deadline_at_s - max(tail_ref_s - fit_u, 0.0) / speed
        rel = np.where(slow, np.minimum(rel, cutoff), rel)
    extend = budget_usd is None  # under a budget nothing paid runs past its release
    if horizon_at_s is not None and extend:
        rel = _private_until(rel, slots, max(horizon_at_s, now_s))
    free, rel = _after_bulk(work, bulk.size > 0, rel, laws, speed, busy, rng, extend)
    fit = np.where(np.isnan(tail), fit_u, tail)
    ends, last_start, last_ref, undone = _list_schedule(free, rel, speed, x, fit, extend)
    ends = _replicate_last(ends, last_start, last_ref, speed, fit_u)
    makespan = np.maximum(np.max(np.where(np.isfinite(ends), ends, -np.inf), axis=1), now_s)
    cost = spent_usd + _charges(machines, slots, ends, makespan, planned_rel, started_at_s, idle_release_s)
    running = np.where(np.isfinite(busy), busy, -np.inf).max(axis=1) - started_at_s
    cost, stopped = _capped(cost, undone, budget_usd, machines)
    return Forecast(makespan - started_at_s, cost, fallbacks, running, now_s - started_at_s, spent_usd,
                    budget_usd, stopped, ratio, left)


def _private_until(rel: np.ndarray, slots, until_s: float) -> np.ndarray:
    """The controller holds its planning deadline H: a private node takes what the instances
    leave only as far as it ends by H (``until_s``); work past that keeps instances on
    (re-plans extend or buy), it does not queue on the private node up to the deadline."""
    private = np.isposinf(slots["release"])[None, :]
    return np.where(private, np.minimum(rel, until_s), rel)


def _capped(cost: np.ndarray, undone: np.ndarray, budget_usd: float | None, machines):
    """(cost, stopped) under a budget: the controller stops what the budget cannot pay for (a
    task past a paid release is cancelled there, and runs again on a private node if any)."""
    if budget_usd is None:
        return cost, None
    stopped = (undone > 0) | ((cost > budget_usd + 1e-9) & ~any(mc.is_private for mc in machines))
    return np.minimum(cost, budget_usd), stopped


def _slot_table(machines: Sequence[Machine]) -> dict[str, np.ndarray]:
    speed, ready, release, machine = [], [], [], []
    for i, mc in enumerate(machines):
        for _ in range(mc.slots):
            speed.append(mc.speed)
            ready.append(mc.ready_at_s)
            release.append(mc.release_at_s)
            machine.append(i)
    first = np.concatenate(([0], np.cumsum([mc.slots for mc in machines], dtype=int)))  # i's: first[i]:first[i+1]
    return {"speed": np.asarray(speed, dtype=float), "ready": np.asarray(ready, dtype=float), "first": first,
            "release": np.asarray(release, dtype=float), "machine": np.asarray(machine, dtype=int)}


def _running_ends(machines, laws: _Replicas, ratio, speed, now_s: float, rng):
    """(R, m): when each slot is free of the task it runs now (its ready time if idle)."""
    law = laws.law
    R, m = speed.shape
    ready = np.concatenate([np.full(mc.slots, mc.ready_at_s) for mc in machines])
    busy = np.broadcast_to(np.maximum(ready, now_s), (R, m)).copy()
    fallbacks = 0
    j = 0
    for mc in machines:
        for k in range(mc.slots):
            if k < len(mc.running):
                age, est = mc.running[k]
                if est is not None:
                    left = np.maximum(est * ratio * _noise(rng, law.estimate_rel_sd, R) - age, 0.05 * est)
                else:
                    left, capped = law.draw_beyond(rng, age, R)
                    if not capped:  # the replicate's law is the observed one scaled: so is X
                        left = np.maximum((age + left) * laws.ratio_to_law - age, 0.05 * left)
                    fallbacks += capped
                busy[:, j] = now_s + left / speed[:, j]
            j += 1
    return busy, fallbacks


def _noise(rng, rel_sd: float, shape) -> np.ndarray:
    """Multiplicative lognormal noise of mean 1 and log-sd ``rel_sd``."""
    if rel_sd <= 0:
        return np.ones(shape)
    return np.exp(rng.standard_normal(shape) * rel_sd - rel_sd * rel_sd / 2)


def _dispatch_order(pending: Pending, unknown_size: float, rng) -> np.ndarray:
    """Sizes in dispatch order (NaN: no estimate): largest first, tasks without an estimate
    counted at ``unknown_size`` (the pool's fit size), ties in random order."""
    sizes = np.concatenate((np.asarray(pending.estimates_ref_s, dtype=float), np.full(pending.unknown, np.nan)))
    key = np.where(np.isnan(sizes), unknown_size, sizes)
    perm = rng.permutation(sizes.size)
    order = perm[np.argsort(-key[perm], kind="stable")]
    return sizes[order]


def _draw_tasks(sizes: np.ndarray, laws: _Replicas, ratio, rng, unseen: bool = True) -> np.ndarray:
    """(R, k) runtimes in reference seconds for tasks of these estimates (NaN: none)."""
    R, k = ratio.size, sizes.size
    x = laws.draw(rng, k, unseen)
    known = ~np.isnan(sizes)
    if known.any():
        noise = _noise(rng, laws.law.estimate_rel_sd, (R, int(known.sum())))
        x[:, known] = sizes[known][None, :] * ratio[:, None] * noise
    return x


def _bulk_work(sizes: np.ndarray, laws: _Replicas, ratio, rng) -> np.ndarray:
    """(R,) total reference work of the bulk tasks: exact sums when cheap, else the CLT."""
    R = ratio.size
    if sizes.size * R <= EXACT_BULK_DRAWS:
        return _draw_tasks(sizes, laws, ratio, rng, unseen=False).sum(axis=1)
    known = sizes[~np.isnan(sizes)]
    n_u = int(np.isnan(sizes).sum())
    total = n_u * laws.mean + np.sqrt(n_u * laws.var) * rng.standard_normal(R)
    if known.size:
        s2 = math.expm1(laws.law.estimate_rel_sd ** 2)  # variance of the mean-1 noise
        total += ratio * (known.sum() + math.sqrt(s2 * float(known @ known)) * rng.standard_normal(R))
    return np.maximum(total, 0.0)


def _after_bulk(work: np.ndarray, any_bulk: bool, rel: np.ndarray, laws: _Replicas, speed, busy, rng,
                extend: bool = True):
    """(free, release), each (R, m): the slots' state when the bulk's work is handed out.
    ``extend`` False (a budget): no slot works past its release; a replicate whose bulk
    outlasts every paid slot and has no private one stops with every slot closed."""
    R, m = speed.shape
    if not any_bulk:
        return busy, rel
    waste = laws.mean[:, None] / (2 * speed)
    stop = np.where(np.isfinite(rel), rel - waste, np.inf)
    # When the last bulk task is handed out, the slots are part-way through bulk tasks: the
    # work done by then is the bulk less those tasks' remaining work (two passes: which
    # slots are still open decides whose remainder counts).
    residual_ref = laws.draw_residual(rng, m)
    residual = residual_ref / speed
    t_b, extended = _fluid_end(work, busy, stop, speed, extend)
    for _ in range(2):
        active = (busy < t_b[:, None]) & ((t_b[:, None] < stop) | extended[:, None])
        t_b, extended = _fluid_end(np.maximum(work - (residual_ref * active).sum(axis=1), 0.0), busy, stop, speed,
                                   extend)
    active = (busy < t_b[:, None]) & ((t_b[:, None] < stop) | extended[:, None])
    free = np.where(busy >= t_b[:, None], busy, np.where(active, t_b[:, None] + residual, np.inf))
    if not extend:  # closed slots worked to their stop and take nothing more
        closed = ~np.isfinite(free)
        return np.where(closed, np.maximum(busy, np.minimum(stop, t_b[:, None])), free), np.where(closed, -np.inf, rel)
    # No slot left in its window (the bulk ended exactly at the last release): as extended.
    extended = extended | ~np.isfinite(free).any(axis=1)
    free = np.where(extended[:, None] & ~np.isfinite(free), t_b[:, None] + residual, free)
    rel = np.where(extended[:, None], np.inf, rel)
    return free, rel


def _fluid_end(work: np.ndarray, busy: np.ndarray, stop: np.ndarray, speed: np.ndarray, extend: bool = True):
    """(t_b, extended): when the fleet's fluid capacity reaches ``work`` (per replicate).
    A replicate whose work exceeds everything the fleet offers before its releases keeps
    every slot on past them (``extended``)."""
    def capacity(t):
        return (speed * np.clip(np.minimum(t[:, None], stop) - busy, 0.0, None)).sum(axis=1)

    finite_stop = np.where(np.isfinite(stop), stop, -np.inf).max(axis=1)
    horizon = np.maximum(finite_stop, busy.max(axis=1))  # every finite window closed by then
    unbounded = ~np.isfinite(stop).any(axis=1)  # private nodes only: nothing to extend
    full = capacity(horizon)
    # More work than the fleet offers by its releases: the controller keeps it on (re-plans
    # extend or buy), not the private nodes alone.
    extended = (work > full) & ~unbounded & extend
    lo = busy.min(axis=1)
    hi = horizon + np.maximum(work - full, 0.0) / np.maximum(speed.min(axis=1), 1e-12) + 1.0
    for _ in range(40):  # the bracket is at most days wide: 40 halvings leave microseconds
        mid = (lo + hi) / 2
        short = capacity(mid) < work
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    t_b = np.where(extended, horizon + (work - full) / speed.sum(axis=1), hi)
    if not extend:  # paid slots close at their stops; without a private one the run stops there
        t_b = np.where((work > full) & np.isfinite(stop).all(axis=1), horizon, t_b)
    return t_b, extended


def _list_schedule(free: np.ndarray, rel: np.ndarray, speed: np.ndarray, x: np.ndarray, fit: np.ndarray,
                   extend: bool = True):
    """List scheduling of the tail tasks in order, vectorised over the replicates: each goes
    to the slot free first among those where it fits before the release (``fit`` its
    assumed size), else to the slot free first (an extension; without ``extend``, a budget,
    to a private slot, or nowhere: the task stays undone). Returns each slot's last end,
    the start and reference size of its last task, and the tasks left undone per replicate.

    Incremental: ``avail`` (a slot's free time where the task fits, else inf) is rebuilt
    only when the assumed size changes (tasks without an estimate all share one); between,
    a task changes one slot per replicate, and only that entry is recomputed (the same
    float operations on the same operands as the whole-array rule, so the same schedule).
    The arrays are walked flat (``rows * m + slot``)."""
    R, m = free.shape
    free = free.ravel().copy()
    rel, speed = rel.ravel(), speed.ravel()
    base = np.arange(R) * m
    last_start = np.full(R * m, -np.inf)
    last_ref = np.zeros(R * m)
    undone = np.zeros(R, dtype=int)
    private = np.isposinf(rel)  # only private slots have no release (a closed slot's is -inf)
    xt = np.ascontiguousarray(x.T)
    avail, size = None, None
    for k in range(xt.shape[0]):
        if avail is None or not fit[k] == size:
            size = fit[k]
            avail = np.where(free + size / speed <= rel, free, np.inf)
        at = base + np.argmin(avail.reshape(R, m), axis=1)
        start = avail[at]  # the slot's free time where the task fits
        xk = xt[k]
        if not np.isfinite(start).all():  # some replicate has no slot where it fits
            at, start, xk, ok = _no_fit(at, start, free, private, xk, R, m, extend)
            undone += ~ok
        sp = speed[at]
        end = start + xk / sp
        last_start[at] = start
        last_ref[at] = xk
        free[at] = end
        avail[at] = np.where(end + size / sp <= rel[at], end, np.inf)
    shape = (R, m)
    return free.reshape(shape), last_start.reshape(shape), last_ref.reshape(shape), undone


def _no_fit(at, start, free, private, xk, R: int, m: int, extend: bool):
    """The slots of the replicates where a task fits nowhere: the slot free first (without
    ``extend``: the private slot free first; none, the task stays undone). Returns the
    (flat slot, start, size) of the replicates that run it, and which do."""
    none = ~np.isfinite(start)
    r = np.flatnonzero(none)
    f = free.reshape(R, m)[r]
    at = at.copy()
    at[r] = r * m + np.argmin(f if extend else np.where(private.reshape(R, m)[r], f, np.inf), axis=1)
    start = free[at]
    ok = np.isfinite(start) & (extend | ~none | private[at])
    return at[ok], start[ok], xk[ok], ok


def _replicate_last(free, last_start, last_ref, speed, overdue_ref: float, rounds: int = 3) -> np.ndarray:
    """The controller's tail replication (``dispatch.replicate``): a task still running past
    its expected size is copied to an idle slot more than twice as fast, and the first
    result wins. Applied to the ``rounds`` tasks that end last: the copy starts when the
    task is overdue (``overdue_ref`` reference seconds in) and the fast slot is free."""
    free = free.copy()
    rows = np.arange(free.shape[0])
    finite = np.isfinite(free)
    for _ in range(rounds):
        j = np.argmax(np.where(finite, free, -np.inf), axis=1)
        s_j = speed[rows, j]
        start = np.maximum(free, (last_start[rows, j] + overdue_ref / s_j)[:, None])
        copy_end = start + last_ref[rows, j][:, None] / speed
        ok = finite & (speed > 2.0 * s_j[:, None]) & np.isfinite(last_start[rows, j])[:, None]
        copy_end = np.where(ok, copy_end, np.inf)
        f = np.argmin(copy_end, axis=1)
        best = copy_end[rows, f]
        win = best < free[rows, j]
        free[rows, j] = np.where(win, best, free[rows, j])
        free[rows, f] = np.where(win, best, free[rows, f])
    return free


def _charges(machines, slots, ends: np.ndarray, makespan: np.ndarray, rel: np.ndarray,
             started_at_s: float, idle_release_s: float = IDLE_RELEASE_S) -> np.ndarray:
    """(R,) what every machine costs: instances from launch to max(last end, min(release,
    end of bag, last end + ``idle_release_s``)), billed by their model; private nodes at their
    hourly rate over the run."""
    R = ends.shape[0]
    total = np.zeros(R)
    finite_ends = np.where(np.isfinite(ends), ends, -np.inf)
    first = slots["first"].tolist()
    for i, mc in enumerate(machines):
        if mc.is_private:
            total += mc.price_per_hour * (makespan - started_at_s) / 3600.0
            continue
        lo, hi = first[i], first[i + 1]
        last = finite_ends[:, lo:hi].max(axis=1)
        release = rel[:, lo]
        # a machine whose slots all worked to their stop (no finite end) is kept to its release
        idle_until = np.where(np.isfinite(last), last + idle_release_s, np.inf)
        until = np.maximum(last, np.minimum(np.minimum(release, makespan), idle_until))
        total += _billed_s(mc.billing, until - mc.launched_at_s) / 3600.0 * mc.price_per_hour
    return total


def _billed_s(b: Billing, elapsed: np.ndarray) -> np.ndarray:
    """``Billing.billed_s`` over an array."""
    e = np.maximum(elapsed, 0.0)
    started = b.unit_s * np.ceil(e / b.unit_s - 1e-6 / b.unit_s)
    return np.maximum(np.maximum(started, b.minimum_s), b.unit_s)


def machines_of_plan(types, private, plan, margin_s: float = 120.0) -> list[Machine]:
    """A fresh plan's fleet from now (0): the private nodes and every new instance, ready
    after its boot delay and released a margin before its last paid quantum."""
    by_name = {t.name: t for t in types}
    out = [Machine(p.slots, p.speed, 0.0, math.inf, p.cost_per_hour) for p in private]
    for g in plan.new:
        t = by_name[g.type_name]
        out += [Machine(t.slots, t.speed, t.boot_s, max(g.release_after_s - margin_s, t.boot_s), t.price_per_hour,
                        0.0, t.billing, (), t.name) for _ in range(g.count)]
    return out
