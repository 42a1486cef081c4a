"""A promise with its real uncertainty: "done in 19.6 h (90%: 18.9-20.0 h), $231 (90%: $219-$246)".

ALGORITHMS.md 8. A plan is a fleet: slots of speed ``s_j`` usable from ``a_j`` (boot done,
or now) until the planned release ``r_j`` (infinite for private nodes). What it delivers
depends on runtimes nobody knows yet, so the promise is read off ``R`` replicates of the
rest of the run, each a cheap simulation of the plan carried out by list scheduling
(the controller's own dispatch: a free slot takes the next task that fits before its
release, largest estimate first, tasks without one in the bag's random order).

Uncertainty in a replicate ``r`` (notation: ``F`` the runtime distribution in reference
seconds, ``n_o`` the runtimes it was estimated from):

- **the mean** (sampling error of F): every runtime of the replicate is scaled by
  ``m_r = exp(e_r sqrt(log(1 + c^2)) - log(1 + c^2) / 2)``, ``e_r ~ N(0, 1)``, with
  ``c = sd(F) / (mean(F) sqrt(n_o))`` the relative standard error of the mean (a lognormal
  multiplier of mean 1, so it never goes negative); for tasks with the bag's estimates
  ``c`` is the standard error of the correction ratio actual/estimate;
- **the spread and the tail** of the tasks' own runtimes: each task's runtime is a draw
  ``X = m_r F^-1(U)`` (``F`` a discrete distribution: the Kaplan-Meier product-limit
  estimate over finished tasks and the running ones as censored, with the mass the data
  leave unresolved put at the cap, ``broker.core.estimate.survival``; or, with a stated
  mean and sd only, a lognormal with those moments on 4,096 quantile atoms); a task with an
  estimate ``e`` runs ``e m_r exp(N(0, s_r^2))`` with ``s_r`` the relative error of the
  estimates;
- **running tasks**: one of age ``a`` still needs ``X - a`` with ``X ~ F`` conditioned on
  ``X > a`` (the conditional atoms); when no observed runtime is longer than ``a`` only the
  cap speaks for it: ``cap - a`` (conservative, flagged in ``Forecast.fallbacks``);
- **boot delays and billing rounding** are carried out exactly: a slot starts at its ready
  time; an instance is charged by its billing model from launch to
  ``max(e_i, min(r_i, M))``, with ``e_i`` its last task's end and ``M`` the end of the bag
  (a task that runs past the planned release keeps its instance, the bag's end releases
  everything);
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
slot free first, as the controller would extend or buy; this replicate then overruns.

Tail replication, as the controller does it: a task still running past its assumed size
(the fit size, F's 90% quantile) is copied to a free slot more than twice as fast and the
first result wins; applied to the three tasks that end last.

A replicate gives makespan ``M_r`` (from the run's start) and cost ``C_r`` = spend already
closed + every live or planned instance's charge + private nodes' hourly cost times
``M_r``. The promise is the median and the central ``1 - delta`` interval
``[q_{delta/2}, q_{1 - delta/2}]`` of each; a deadline ``T`` is held at confidence
``1 - delta`` when ``q_{1 - delta}(M) <= T`` (:func:`hold_deadline`).

Pure: numpy only, a seeded generator passed in, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..billing import Billing

REPLICATES = 200
TAIL_SLOTS_FACTOR = 3  # tasks scheduled one by one at the end: this many per slot
EXACT_BULK_DRAWS = 100_000  # below this many draws the bulk is summed exactly (else the CLT)
_ATOMS = 4096  # quantile atoms of a parametric runtime law (the last at z = 3.7)
_MAX_ATOMS = 1000  # atoms a replicate re-weighs ...
_KEPT_TAIL = 100  # ... of which the longest stay as observed


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

    def to_json(self) -> dict:
        def rng(r, digits):
            return None if r is None else [round(float(r[0]), digits), round(float(r[1]), digits)]

        return {
            "confidence": self.confidence,
            "makespan_s": round(float(self.makespan_s), 1),
            "makespan_s_range": rng(self.makespan_s_range, 1),
            "cost_usd": round(float(self.cost_usd), 4),
            "cost_usd_range": rng(self.cost_usd_range, 4),
        }

    def text(self) -> str:
        """``done in 19.6 h (90%: 18.9-20.0 h), $231 (90%: $219-$246)``."""
        pct = f"{100 * self.confidence:g}%"
        hours = self.makespan_s >= 3600 * 2
        unit, div = ("h", 3600.0) if hours else ("min", 60.0)
        t = f"done in {self.makespan_s / div:.1f} {unit}"
        if self.makespan_s_range is not None:
            lo, hi = self.makespan_s_range
            t += f" ({pct}: {lo / div:.1f}-{hi / div:.1f} {unit})"
        t += f", ${self.cost_usd:,.2f}"
        if self.cost_usd_range is not None:
            lo, hi = self.cost_usd_range
            t += f" ({pct}: ${lo:,.2f}-${hi:,.2f})"
        return t

    def holds(self, makespan_s: float, cost_usd: float) -> tuple[bool, bool]:
        """Whether a delivered makespan and cost lie inside the promised ranges."""
        def inside(x, r, point, tol):
            lo, hi = r if r is not None else (point, point)
            return lo - tol <= x <= hi + tol

        return inside(makespan_s, self.makespan_s_range, self.makespan_s, 1e-6), inside(
            cost_usd, self.cost_usd_range, self.cost_usd, 1e-9)


# -- the runtime law --------------------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeLaw:
    """A discrete runtime distribution (reference seconds) and what is uncertain about it.

    ``sample_size``: the number of observed runtimes behind the weights (None for a stated
    law): each replicate then re-weighs the atoms by a Bayesian bootstrap, Dirichlet with
    parameters ``weights x sample_size``, which carries the error of the mean *and* of the
    shape (a small sample that missed the tail is often low in both its mean and its sd, and
    a plain standard error then misses high); ``mean_rel_se``: for a stated law, the relative
    standard error of its mean (shared by every task of a replicate); ``estimate_rel_sd``: per-task relative error of the bag's estimates, ``ratio_rel_se`` the
    standard error of their correction ratio; ``cap_ref_s``: the longest a task can run.
    """

    values_ref_s: np.ndarray
    weights: np.ndarray
    mean_rel_se: float
    cap_ref_s: float
    estimate_rel_sd: float = 0.15
    ratio_rel_se: float = 0.0
    estimate_ratio: float = 1.0
    sample_size: float | None = None
    tail_from_ref_s: float | None = None  # the longest runtime seen ...
    tail_excess_ref_s: float = 0.0  # ... and the mean excess of the longest ones over the next
    _cum: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=float)
        if w.size == 0 or w.sum() <= 0:
            raise ValueError("a runtime law needs at least one atom of positive weight")
        object.__setattr__(self, "weights", w / w.sum())
        object.__setattr__(self, "values_ref_s", np.asarray(self.values_ref_s, dtype=float))
        object.__setattr__(self, "_cum", np.cumsum(self.weights))

    @classmethod
    def observed(cls, finished_ref_s: Sequence[float], running_ages_ref_s: Sequence[float], cap_ref_s: float,
                 **kw) -> "RuntimeLaw":
        """The Kaplan-Meier law of finished runtimes with running tasks censored at their age."""
        from ..estimate.survival import KaplanMeier

        km = KaplanMeier(finished_ref_s, running_ages_ref_s, cap_ref_s)
        values, weights = km.atoms()
        n = max(km.events, 1)
        events = np.sort(np.asarray(finished_ref_s, dtype=float))[::-1]
        ages = np.asarray(running_ages_ref_s, dtype=float)
        seen = max(float(events[0]) if events.size else 0.0, float(ages.max()) if ages.size else 0.0)
        k = min(max(3, int(math.sqrt(events.size))), events.size - 1)
        excess = float(np.mean(events[:k] - events[k])) if k >= 1 else 0.5 * seen
        # KM leaves the mass of tasks still running past every runtime seen at the cap; it
        # lies beyond the longest seen, by the tail's mean excess (never past the cap).
        if weights[-1] > 0 and values[-1] > seen:
            values[-1] = min(seen + excess, km.cap_ref_s)
        keep = weights > 0
        return cls(values[keep], weights[keep], kw.pop("mean_rel_se", 0.0), km.cap_ref_s, sample_size=n,
                   tail_from_ref_s=seen if events.size else None, tail_excess_ref_s=excess, **kw)

    @classmethod
    def parametric(cls, mean_ref_s: float, sd_ref_s: float, mean_rel_se: float = 0.0,
                   cap_ref_s: float | None = None, **kw) -> "RuntimeLaw":
        """A lognormal with this mean and sd, on ``_ATOMS`` quantile atoms (a stated mean and
        spread; ``mean_rel_se`` says how well the mean is known)."""
        from statistics import NormalDist

        mean = max(float(mean_ref_s), 1e-9)
        cv2 = (max(float(sd_ref_s), 0.0) / mean) ** 2
        s2 = math.log1p(cv2)
        mu = math.log(mean) - s2 / 2
        nd = NormalDist()
        probs = (np.arange(_ATOMS) + 0.5) / _ATOMS
        values = np.exp(mu + math.sqrt(s2) * np.array([nd.inv_cdf(p) for p in probs]))
        values *= mean / values.mean()  # the atoms keep the stated mean exactly
        cap = float(values.max()) if cap_ref_s is None else max(float(cap_ref_s), float(values.max()))
        return cls(values, np.full(_ATOMS, 1.0 / _ATOMS), mean_rel_se, cap, **kw)

    @property
    def mean_ref_s(self) -> float:
        return float(self.weights @ self.values_ref_s)

    def quantile(self, q: float) -> float:
        i = int(np.searchsorted(self._cum, q, side="left"))
        return float(self.values_ref_s[min(i, self.values_ref_s.size - 1)])

    def draw(self, rng: np.random.Generator, shape) -> np.ndarray:
        idx = np.searchsorted(self._cum, rng.random(shape), side="right")
        return self.values_ref_s[np.minimum(idx, self.values_ref_s.size - 1)]

    def draw_residual(self, rng: np.random.Generator, shape) -> np.ndarray:
        """The remaining work of a task caught part-way at a random moment (density S(x)/mu)."""
        biased = self.weights * self.values_ref_s
        if biased.sum() <= 0:
            return np.zeros(shape)
        cum = np.cumsum(biased / biased.sum())
        idx = np.minimum(np.searchsorted(cum, rng.random(shape), side="right"), cum.size - 1)
        return self.values_ref_s[idx] * rng.random(shape)

    def draw_beyond(self, rng: np.random.Generator, age_ref_s: float, count: int) -> tuple[np.ndarray, bool]:
        """``count`` draws of ``X - a`` given ``X > a``, and whether the data could not say:
        when no runtime seen is longer than ``a``, the task is taken to need as long again
        as half its age or the tail's mean excess, whichever is more (an exponential of that
        mean, never past the cap; the controller copies such an overdue task elsewhere)."""
        above = self.values_ref_s > age_ref_s
        real = above & (self.values_ref_s < self.cap_ref_s)
        if self.tail_from_ref_s is not None:
            real &= self.values_ref_s <= self.tail_from_ref_s
        if not real.any():
            mean = max(self.tail_excess_ref_s, 0.5 * age_ref_s, 1e-9)
            return np.minimum(rng.exponential(mean, count), max(self.cap_ref_s - age_ref_s, 0.0)), True
        w = self.weights[above]
        cum = np.cumsum(w / w.sum())
        idx = np.minimum(np.searchsorted(cum, rng.random(count), side="right"), cum.size - 1)
        return self.values_ref_s[above][idx] - age_ref_s, False

    def mean_multipliers(self, rng: np.random.Generator, replicates: int, rel_se: float | None = None) -> np.ndarray:
        c = self.mean_rel_se if rel_se is None else rel_se
        if c <= 0:
            return np.ones(replicates)
        s2 = math.log1p(c * c)
        return np.exp(rng.standard_normal(replicates) * math.sqrt(s2) - s2 / 2)


class _Replicas:
    """The runtime law of each replicate: shared atoms, per-replicate weights (R, A) from the
    Bayesian bootstrap (or the stated weights and a mean multiplier), and the replicate's
    mean, variance and tail-residual law. At most ``_MAX_ATOMS`` atoms: beyond that,
    neighbours are pooled (the longest ``_KEPT_TAIL`` atoms are kept as they are)."""

    def __init__(self, law: RuntimeLaw, R: int, rng: np.random.Generator):
        self.law = law
        v, w = _pooled(law.values_ref_s, law.weights)
        if law.sample_size is not None:
            g = rng.standard_gamma(np.maximum(w * law.sample_size, 1e-3)[None, :], size=(R, v.size))
            w_r = g / g.sum(axis=1, keepdims=True)
            scale = _bootstrap_t_scale(v, w, w_r, law.sample_size)
            w = w_r
        else:
            w = np.broadcast_to(w, (R, v.size))
            scale = law.mean_multipliers(rng, R)
        self.values = v
        self.scale = scale
        base = w @ v
        self.mean = scale * base
        self.var = scale**2 * np.maximum(w @ (v * v) - base * base, 0.0)
        self.cum = _row_cumsum(w)
        self.cum_biased = _row_cumsum(w * v[None, :])
        self.ratio_to_law = self.mean / max(law.mean_ref_s, 1e-12)

    def draw(self, rng, k: int, unseen: bool = False) -> np.ndarray:
        """(R, k) runtimes; ``unseen``: from the predictive law of one new task (below)."""
        x = np.minimum(self.values[_row_search(self.cum, rng.random((self.cum.shape[0], k)))] * self.scale[:, None],
                       self.law.cap_ref_s)
        return self._unseen(rng, x) if unseen else x

    def draw_residual(self, rng, k: int) -> np.ndarray:
        """(R, k): the remaining work of a task caught part-way at a random moment (density
        S(x)/mu: a length-biased draw times a uniform)."""
        x = self.values[_row_search(self.cum_biased, rng.random((self.cum.shape[0], k)))]
        return self._unseen(rng, np.minimum(x * self.scale[:, None], self.law.cap_ref_s)) * rng.random(x.shape)

    def _unseen(self, rng, x: np.ndarray) -> np.ndarray:
        """One new task outruns all ``n`` runtimes seen with probability 1 / (n + 1), which
        the observed atoms never do: that share of the draws goes past the longest, by an
        exponential excess of the tail's mean excess (never past the cap). A sum of many
        tasks does not need this (the sample mean is unbiased), the end of a bag does: its
        last tasks decide the makespan, and on lognormal(sigma 1) runtimes, 200 seen, the
        90% interval of a 2,000-task makespan otherwise missed high 12-13% of the time."""
        law = self.law
        if law.sample_size is None or law.tail_from_ref_s is None:
            return x
        beyond = rng.random(x.shape) < 1.0 / (law.sample_size + 1.0)
        if not beyond.any():
            return x
        far = law.tail_from_ref_s + rng.exponential(max(law.tail_excess_ref_s, 0.0) + 1e-9, int(beyond.sum()))
        x = x.copy()
        x[beyond] = np.minimum(far, law.cap_ref_s)
        return x


def _bootstrap_t_scale(v, w, w_r, n: float) -> np.ndarray:
    """(R,) factors that move each replicate's mean to the bootstrap-t reading of it.

    The bootstrap mean ``m_r`` of a right-skewed sample is too rarely far above ``m``: a
    sample that missed the tail is low in its mean and in its sd alike. The studentized
    ``t_r = (m_r - m) / (s_r / sqrt(n))`` keeps that coupling, and the replicate's mean is
    taken as ``mu_r = m - t_r s / sqrt(n)`` (Efron's bootstrap-t; second-order accurate
    where the plain bootstrap is first-order). ``t_r`` is held within +-6 and ``mu_r``
    within [m / 5, 5 m]. On lognormal(sigma 1) runtimes, 200 observed, the plain bootstrap's
    90% interval of 2,000 tasks' makespan missed high in 12% of repetitions, against 5%."""
    m = float(w @ v)
    s = math.sqrt(max(float(w @ (v * v)) - m * m, 0.0))
    if s <= 0 or m <= 0:
        return np.ones(w_r.shape[0])
    m_r = w_r @ v
    s_r = np.sqrt(np.maximum(w_r @ (v * v) - m_r * m_r, 1e-300))
    t = np.clip((m_r - m) / (s_r / math.sqrt(n)), -6.0, 6.0)
    mu = np.clip(m - t * s / math.sqrt(n), m / 5, 5 * m)
    return mu / m_r


def _pooled(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    if v.size <= _MAX_ATOMS:
        return v, w
    head = v.size - _KEPT_TAIL
    groups = _MAX_ATOMS - _KEPT_TAIL
    edges = np.linspace(0, head, groups + 1).astype(int)
    mass = np.add.reduceat(w[:head], edges[:-1])
    mean = np.add.reduceat(w[:head] * v[:head], edges[:-1]) / np.maximum(mass, 1e-300)
    return np.concatenate((mean, v[head:])), np.concatenate((mass, w[head:]))


def _row_cumsum(w: np.ndarray) -> np.ndarray:
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1:]
    cum = cum / np.where(total > 0, total, 1.0)
    cum[:, -1] = 1.0
    return cum


def _row_search(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row r, ``searchsorted(cum[r], u[r])``, in one call (rows offset by their index)."""
    R, A = cum.shape
    offset = np.arange(R, dtype=float)[:, None]
    flat = (cum + 2.0 * offset).ravel()
    idx = np.searchsorted(flat, (np.minimum(u, 1.0 - 1e-12) + 2.0 * offset).ravel(), side="right")
    return np.minimum(idx.reshape(u.shape) - (np.arange(R) * A)[:, None], A - 1)


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

    def makespan_quantile(self, q: float) -> float:
        return float(np.quantile(self.makespans_s, q))

    def cost_quantile(self, q: float) -> float:
        return float(np.quantile(self.costs_usd, q))

    def promise(self, confidence: float, why: str | None = None) -> Promise:
        lo, hi = (1 - confidence) / 2, 1 - (1 - confidence) / 2
        m, c = self.makespans_s, self.costs_usd
        return Promise(
            confidence=confidence,
            makespan_s=float(np.median(m)), cost_usd=float(np.median(c)),
            makespan_s_range=(float(np.quantile(m, lo)), float(np.quantile(m, hi))),
            cost_usd_range=(float(np.quantile(c, lo)), float(np.quantile(c, hi))),
            why=why,
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
    keep_margin: float = 0.05,
) -> Forecast:
    """Simulate the rest of the run ``replicates`` times; see the module docstring.

    ``spent_usd``: what instances already terminated cost (live ones are charged here from
    their launch). ``fit_ref_s``: the size the dispatcher assumes for a task without an
    estimate when it checks a task fits before a release (default F's 90% quantile).
    ``horizon_at_s``: the controller's planning deadline; when given, each replicate sheds
    the capacity its work does not need by then, less ``keep_margin`` (:func:`_shed`).
    """
    R = int(replicates)
    slots = _slot_table(machines)
    m = slots["speed"].size
    if m == 0:
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
    if horizon_at_s is not None:
        need = (work + x.sum(axis=1) + ((busy - now_s) * speed).sum(axis=1)) * (1.0 + keep_margin)
        rel = _shed(machines, slots, rel, busy, speed, need, horizon_at_s, now_s)
    planned_rel = rel.copy()
    free, rel = _after_bulk(work, bulk.size > 0, rel, laws, speed, busy, rng)
    fit = np.where(np.isnan(tail), fit_u, tail)
    ends, last_start, last_ref = _list_schedule(free, rel, speed, x, fit)
    ends = _replicate_last(ends, last_start, last_ref, speed, fit_u)
    makespan = np.max(np.where(np.isfinite(ends), ends, -np.inf), axis=1)
    makespan = np.maximum(makespan, now_s)
    cost = spent_usd + _charges(machines, slots, ends, makespan, planned_rel, started_at_s)
    return Forecast(makespan - started_at_s, cost, fallbacks)


def _shed(machines, slots, rel, busy, speed, need, horizon_at_s: float, now_s: float) -> np.ndarray:
    """(R, m) releases once the controller has shed what the replicate's work does not need.

    The controller keeps a fleet that finishes the work (with a margin) by its planning
    deadline ``H`` and releases the rest at billing boundaries, the instance due to leave
    first pulled in furthest (``fleet.shed``). Per replicate: the surplus is the fleet's
    capacity by ``H`` less the work needed; each instance in order of release gives up
    whole billing units, never below what is paid nor below its running task, while the
    capacity lost stays within the surplus. Without this a forecast charges every hour of a
    fleet bought for the work's upper value, and a run whose work came in lower costs less."""
    cap = speed * np.clip(np.minimum(horizon_at_s, rel) - busy, 0.0, None)
    surplus = cap.sum(axis=1) - need
    order = sorted((i for i, mc in enumerate(machines) if not mc.is_private and math.isfinite(mc.release_at_s)),
                   key=lambda i: (machines[i].release_at_s, i))
    for i in order:
        mc = machines[i]
        # whole billing units (a 300 s grid under per-second billing, as the planner's);
        # a release sits a margin before its boundary, hence the 0.1-unit slack
        unit = mc.billing.unit_s if mc.billing.unit_s >= 600 else 300.0
        paid = mc.billing.paid_until(mc.launched_at_s, max(now_s, mc.ready_at_s))
        units = min(int((mc.release_at_s - paid) / unit + 0.1), 48)
        if units <= 0:
            continue
        cols = slots["machine"] == i
        b, sp = busy[:, cols], speed[:, cols]
        full = cap[:, cols].sum(axis=1)
        k = np.zeros(rel.shape[0], dtype=int)
        for step in range(1, units + 1):
            at = mc.release_at_s - step * unit
            lost = full - (sp * np.clip(np.minimum(horizon_at_s, at) - b, 0.0, None)).sum(axis=1)
            ok = (lost <= surplus) & (b.max(axis=1) <= at)
            if not ok.any():
                break
            k = np.where(ok, step, k)
        at = mc.release_at_s - k * unit
        lost = full - (sp * np.clip(np.minimum(horizon_at_s, at)[:, None] - b, 0.0, None)).sum(axis=1)
        surplus = surplus - lost
        rel[:, cols] = at[:, None]
    return _lengthen(machines, slots, rel, busy, speed, surplus, horizon_at_s)


def _lengthen(machines, slots, rel, busy, speed, surplus, horizon_at_s: float) -> np.ndarray:
    """The other way: a replicate whose work needs more than the fleet offers by ``H``
    keeps its instances on, unit by unit up to ``H`` (a re-plan extends them), the one due
    to leave first first. What still does not fit runs past the releases (``_fluid_end``)."""
    short = surplus < 0
    if not short.any():
        return rel
    order = sorted((i for i, mc in enumerate(machines) if not mc.is_private and math.isfinite(mc.release_at_s)),
                   key=lambda i: (machines[i].release_at_s, i))
    for i in order:
        mc = machines[i]
        unit = mc.billing.unit_s if mc.billing.unit_s >= 600 else 300.0
        cols = slots["machine"] == i
        at = rel[:, np.argmax(cols)]
        steps = np.floor(np.maximum(horizon_at_s - at, 0.0) / unit)
        per_unit = float(speed[0, cols].sum()) * unit
        want = np.where(surplus < 0, np.ceil(-surplus / max(per_unit, 1e-9)), 0.0)
        k = np.minimum(steps, want)
        rel[:, cols] = (at + k * unit)[:, None]
        surplus = surplus + k * per_unit
        if not (surplus < 0).any():
            break
    return rel


def _slot_table(machines: Sequence[Machine]) -> dict[str, np.ndarray]:
    speed, ready, release, machine = [], [], [], []
    for i, mc in enumerate(machines):
        for _ in range(mc.slots):
            speed.append(mc.speed)
            ready.append(mc.ready_at_s)
            release.append(mc.release_at_s)
            machine.append(i)
    return {"speed": np.asarray(speed, dtype=float), "ready": np.asarray(ready, dtype=float),
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


def _after_bulk(work: np.ndarray, any_bulk: bool, rel: np.ndarray, laws: _Replicas, speed, busy, rng):
    """(free, release), each (R, m): the slots' state when the bulk's work is handed out."""
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
    t_b, extended = _fluid_end(work, busy, stop, speed)
    for _ in range(2):
        active = (busy < t_b[:, None]) & ((t_b[:, None] < stop) | extended[:, None])
        t_b, extended = _fluid_end(np.maximum(work - (residual_ref * active).sum(axis=1), 0.0), busy, stop, speed)
    active = (busy < t_b[:, None]) & ((t_b[:, None] < stop) | extended[:, None])
    free = np.where(busy >= t_b[:, None], busy, np.where(active, t_b[:, None] + residual, np.inf))
    # No slot left in its window (the bulk ended exactly at the last release): as extended.
    extended = extended | ~np.isfinite(free).any(axis=1)
    free = np.where(extended[:, None] & ~np.isfinite(free), t_b[:, None] + residual, free)
    rel = np.where(extended[:, None], np.inf, rel)
    return free, rel


def _fluid_end(work: np.ndarray, busy: np.ndarray, stop: np.ndarray, speed: np.ndarray):
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
    extended = (work > full) & ~unbounded
    lo = busy.min(axis=1)
    hi = horizon + np.maximum(work - full, 0.0) / np.maximum(speed.min(axis=1), 1e-12) + 1.0
    for _ in range(40):  # the bracket is at most days wide: 40 halvings leave microseconds
        mid = (lo + hi) / 2
        short = capacity(mid) < work
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    t_b = np.where(extended, horizon + (work - full) / speed.sum(axis=1), hi)
    return t_b, extended


def _list_schedule(free: np.ndarray, rel: np.ndarray, speed: np.ndarray, x: np.ndarray, fit: np.ndarray):
    """List scheduling of the tail tasks in order, vectorised over the replicates: each goes
    to the slot free first among those where it fits before the release (``fit`` its
    assumed size), else to the slot free first (an extension). Returns each slot's last
    end, and the start and reference size of its last task."""
    free = free.copy()
    rows = np.arange(free.shape[0])
    last_start = np.full(free.shape, -np.inf)
    last_ref = np.zeros(free.shape)
    for k in range(x.shape[1]):
        fits = free + fit[k] / speed <= rel
        avail = np.where(fits, free, np.inf)
        j = np.argmin(avail, axis=1)
        none = ~np.isfinite(avail[rows, j])
        if none.any():
            j = np.where(none, np.argmin(free, axis=1), j)
        last_start[rows, j] = free[rows, j]
        last_ref[rows, j] = x[:, k]
        free[rows, j] = free[rows, j] + x[:, k] / speed[rows, j]
    return free, last_start, last_ref


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
             started_at_s: float) -> np.ndarray:
    """(R,) what every machine costs: instances from launch to max(last end, min(release,
    end of bag)), billed by their model; private nodes at their hourly rate over the run."""
    R = ends.shape[0]
    total = np.zeros(R)
    finite_ends = np.where(np.isfinite(ends), ends, -np.inf)
    for i, mc in enumerate(machines):
        if mc.is_private:
            total += mc.price_per_hour * (makespan - started_at_s) / 3600.0
            continue
        mine = slots["machine"] == i
        last = finite_ends[:, mine].max(axis=1)
        release = rel[:, np.argmax(mine)]
        until = np.maximum(last, np.minimum(release, makespan))
        total += _billed_s(mc.billing, until - mc.launched_at_s) / 3600.0 * mc.price_per_hour
    return total


def _billed_s(b: Billing, elapsed: np.ndarray) -> np.ndarray:
    """``Billing.billed_s`` over an array."""
    e = np.maximum(elapsed, 0.0)
    started = b.unit_s * np.ceil(e / b.unit_s - 1e-6 / b.unit_s)
    return np.maximum(np.maximum(started, b.minimum_s), b.unit_s)


# -- a deadline at a confidence ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HeldDeadline:
    """The plan that holds a deadline at the confidence (or the best found), its forecast,
    the horizon it was solved for, and whether the deadline is held."""

    plan: object
    forecast: Forecast
    horizon_s: float
    held: bool
    rounds: int


def hold_deadline(
    solve: Callable[[float], object | None],
    predict: Callable[[object], Forecast],
    deadline_s: float,
    confidence: float,
    *,
    elapsed_s: float = 0.0,
    first_horizon_s: float | None = None,
    max_rounds: int = 5,
) -> HeldDeadline | None:
    """The cheapest plan whose makespan's ``confidence`` quantile is within the deadline.

    ``solve(h)``: the min-cost plan for horizon ``h`` seconds from now (None when none
    exists); ``predict(plan)``: its forecast (makespans from the run's start, ``elapsed_s``
    ago). The planner covers an amount of work by ``h``; what decides the end is the tail,
    so ``h`` starts at the deadline and is pulled in by the forecast's overshoot
    ``q_conf(M) - T`` (plus 2% of the horizon, so the search does not creep) until the
    quantile fits: more capacity is bought only as far as the risk asks. When no horizon
    holds it, the plan with the smallest quantile is returned with ``held`` False: the
    caller says so and offers what can be promised."""
    h = deadline_s - elapsed_s if first_horizon_s is None else first_horizon_s
    best: HeldDeadline | None = None
    for rounds in range(1, max_rounds + 1):
        if h <= 0:
            break
        plan = solve(h)
        if plan is None:
            break
        f = predict(plan)
        q = f.makespan_quantile(confidence)
        held = q <= deadline_s
        found = HeldDeadline(plan, f, h, held, rounds)
        if held:
            return found
        if best is None or q < best.forecast.makespan_quantile(confidence):
            best = found
        h -= (q - deadline_s) + 0.02 * h
    return best
