"""The runtime law behind a promise (ALGORITHMS.md 8; the forecast is ``promise.py``).

A discrete distribution of runtimes in reference seconds: the Kaplan-Meier product-limit
estimate over finished tasks with running ones censored (``broker.core.estimate.survival``),
or a lognormal of a stated mean and sd on quantile atoms. What is uncertain about it, per
replicate of the forecast:

- the mean and shape: a Bayesian bootstrap re-weighs the observed atoms (Dirichlet with
  parameters the runtimes behind each atom, below), each replicate's mean moved to its
  bootstrap-t reading ``mu_r = m - t_r s / sqrt(n)``, ``t_r = (m_r - m) / (s_r / sqrt(n))``;
  for a stated law, a lognormal multiplier of mean 1 and relative sd ``mean_rel_se``;
- the unseen tail: one new task outruns all ``n`` runtimes seen with probability
  ``1 / (n + 1)``; it then lies past the longest by an exponential of the top runtimes'
  mean excess (single tasks only: a sum's mean is unbiased without it);
- the tail Kaplan-Meier cannot place (past the last runtime ``TAIL_AT_RISK`` tasks reached,
  once ``TAIL_FIT_EVENTS`` have ended): a lognormal fitted to the law's upper part,
  conditioned on the cut, refitted on each replicate's weights (``tailfit.py``); with
  fewer runtimes, the mass of the tasks still running past every finished one sits at the
  longest seen plus that mean excess, never past the cap;
- the bootstrap weighs each atom by the runtimes behind it (an event time by the tasks that
  ended there, the tail by the tasks that ran that long), not by ``weights x n``: under
  censoring a long runtime stands for more mass than one n-th, and as sure as one;
- a running task older than every runtime seen needs an exponential remainder of mean
  half its age (or the mean excess, if more), never past the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .tailfit import TAIL_AT_RISK, TAIL_FIT_EVENTS, fitted_tails

_ATOMS = 4096  # quantile atoms of a parametric runtime law (the last at z = 3.7)
_MAX_ATOMS = 1000  # atoms a replicate re-weighs ...
_KEPT_TAIL = 100  # ... of which the longest stay as observed


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
    # The runtimes behind each atom (Kaplan-Meier: the tasks that ended there; the mass past
    # the longest seen: the tasks still running past it), when they are not weights x
    # sample_size: the bootstrap then draws atom k's weight as weights_k Gamma(c_k) / c_k.
    atom_counts: np.ndarray | None = None
    tail_atoms: int = 0  # the last atoms are one fitted tail block: one weight draw moves them all ...
    tail_cut_ref_s: float | None = None  # ... past this runtime, refitted per replicate (``tailfit.py``)
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
                 fit_tail: bool = False, **kw) -> "RuntimeLaw":
        """The Kaplan-Meier law of finished runtimes with running tasks censored at their age.

        ``fit_tail`` False (the controller's law, ``promising.runtime_law``): no fitted tail, each atom weighed ``weights x n`` by the bootstrap, the mass past every runtime
        seen at the longest plus the mean excess; what its deadline hold, hedge and tail
        allowance were tuned on (with the fitted tail they decided worse: ``promising.py``)."""
        from ..estimate.survival import KaplanMeier

        km = KaplanMeier(finished_ref_s, running_ages_ref_s, cap_ref_s)
        values, weights = km.atoms()
        events = np.sort(np.asarray(finished_ref_s, dtype=float))[::-1]
        ages = np.asarray(running_ages_ref_s, dtype=float)
        times, deaths = np.unique(events, return_counts=True)
        everything = np.sort(np.concatenate((events, ages)))
        at_risk = everything.size - np.searchsorted(everything, times, side="left")
        counts = np.concatenate((deaths, [0])).astype(float)
        n = max(km.events, 1)
        seen = max(float(events[0]) if events.size else 0.0, float(ages.max()) if ages.size else 0.0)
        k = min(max(3, int(math.sqrt(events.size))), events.size - 1)
        excess = float(np.mean(events[:k] - events[k])) if k >= 1 else 0.5 * seen
        # Past the last runtime seen by at least TAIL_AT_RISK tasks, Kaplan-Meier's mass is a
        # guess (all of it at the longest runtime seen, or at the cap): it goes where a
        # lognormal fitted to the law's upper part puts it (``tailfit.py``; on lognormal(sigma
        # 1.5) runtimes at 10% done the mean was otherwise 5% low), one block vouched for by
        # the tasks that ran that long, refitted per replicate.
        block, cut_at = 0, None
        cut = np.flatnonzero(at_risk >= TAIL_AT_RISK)
        i = int(cut[-1]) if cut.size else -1
        # only once the body is known well enough to fit (TAIL_FIT_EVENTS runtimes; fitted
        # to the 30 runtimes of a first plan, it made the thesis LL promise 60% high)
        if fit_tail and i >= 0 and km.events >= TAIL_FIT_EVENTS and weights[i + 1:].sum() > 0:
            tail = fitted_tails(values[:i + 1], np.cumsum(weights[:i + 1])[None, :], float(times[i]), km.cap_ref_s)[0]
            if np.isfinite(tail).all():
                left = float(weights[i + 1:].sum())
                values = np.concatenate((values[:i + 1], tail))
                weights = np.concatenate((weights[:i + 1], np.full(tail.size, left / tail.size)))
                beyond = float(everything.size - np.searchsorted(everything, times[i], side="right"))
                counts = np.concatenate((counts[:i + 1], np.full(tail.size, max(beyond, 1.0) / tail.size)))
                block = tail.size
                cut_at = float(times[i])
        if not block and weights[-1] > 0 and values[-1] > seen:
            # else the mass of tasks running past every runtime seen lies beyond the longest
            # seen by the tail's mean excess (never past the cap), vouched for by those tasks
            values[-1] = min(seen + excess, km.cap_ref_s)
            counts[-1] = max(1.0, float(np.sum(ages > (events[0] if events.size else 0.0))))
        keep = weights > 0
        return cls(values[keep], weights[keep], kw.pop("mean_rel_se", 0.0), km.cap_ref_s, sample_size=n,
                   atom_counts=counts[keep] if fit_tail else None, tail_atoms=int(keep[keep.size - block:].sum()) if block else 0,
                   tail_cut_ref_s=cut_at,
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
        mean, never past the cap; the controller copies such an overdue task elsewhere).

        On ascending atoms (every law built here) ``X > a`` is a suffix of them, so a draw
        is a search in the survival function ``S_k`` (the mass from atom ``k`` up, summed
        once per law): the first atom ``k`` past ``a`` with ``S_{k+1} < (1 - u) S(a)``, in
        O(log atoms) per task instead of a pass over every atom (a forecast draws this for
        every running task; an observed law has an atom per finished task)."""
        v, neg = self.values_ref_s, self._neg_survival()
        i0 = int(np.searchsorted(v, age_ref_s, side="right")) if neg is not None else 0
        if neg is None or i0 >= v.size or not -neg[i0] > 0:
            return self._draw_beyond_scan(rng, age_ref_s, count)
        # the atoms past a that are not the cap nor past the tail are those from i0 up to
        # the first one that is: there is one iff atom i0 is
        if not (v[i0] < self.cap_ref_s and (self.tail_from_ref_s is None or v[i0] <= self.tail_from_ref_s)):
            return self._fallback_beyond(rng, age_ref_s, count)
        u = rng.random(count)
        k = np.searchsorted(neg, (1.0 - u) * neg[i0], side="right") - 1
        return v[np.clip(k, i0, v.size - 1)] - age_ref_s, False

    def _neg_survival(self) -> np.ndarray | None:
        """``-S_k`` (ascending), ``S_k`` the mass of atoms ``k`` and up (``S_A = 0``
        appended), when the atoms ascend (None otherwise); computed once per law."""
        neg = self.__dict__.get("_neg_surv", False)
        if neg is False:
            v = self.values_ref_s
            neg = None
            if bool(np.all(v[1:] >= v[:-1])) and not np.isnan(v).any():
                neg = -np.append(np.cumsum(self.weights[::-1])[::-1], 0.0)
            object.__setattr__(self, "_neg_surv", neg)
        return neg

    def _fallback_beyond(self, rng: np.random.Generator, age_ref_s: float, count: int) -> tuple[np.ndarray, bool]:
        mean = max(self.tail_excess_ref_s, 0.5 * age_ref_s, 1e-9)
        return np.minimum(rng.exponential(mean, count), max(self.cap_ref_s - age_ref_s, 0.0)), True

    def _draw_beyond_scan(self, rng: np.random.Generator, age_ref_s: float, count: int) -> tuple[np.ndarray, bool]:
        """:meth:`draw_beyond` by a pass over every atom (atoms in any order)."""
        above = self.values_ref_s > age_ref_s
        real = above & (self.values_ref_s < self.cap_ref_s)
        if self.tail_from_ref_s is not None:
            real &= self.values_ref_s <= self.tail_from_ref_s
        if not real.any():
            return self._fallback_beyond(rng, age_ref_s, count)
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
        if law.atom_counts is None and not law.tail_atoms:
            self._plain(law, R, rng)
            return
        counts = None if law.sample_size is None else (
            law.weights * law.sample_size if law.atom_counts is None else law.atom_counts)
        v, w, c = _pooled(law.values_ref_s, law.weights, counts)
        if law.sample_size is not None:
            c = np.maximum(c, 1e-3)
            g = w[None, :] * rng.standard_gamma(c[None, :], size=(R, v.size)) / c[None, :]
            b = law.tail_atoms
            if b:  # the fitted tail moves as one block (its split is the fit's, not data's)
                cb = float(c[-b:].sum())
                g[:, -b:] = w[None, -b:] * (rng.standard_gamma(cb, size=R) / cb)[:, None]
            w_r = g / g.sum(axis=1, keepdims=True)
            vr = _refitted(v, w_r, b, law.tail_cut_ref_s, law.cap_ref_s)
            scale = _bootstrap_t_scale(v, w, w_r, law.sample_size, vr)
            w = w_r
        else:
            w = np.broadcast_to(w, (R, v.size))
            scale = law.mean_multipliers(rng, R)
            vr = np.broadcast_to(v, (R, v.size))
        self.values = vr  # (R, A): the atoms, the fitted tail's per replicate
        self.scale = scale
        base = (w * vr).sum(axis=1)
        self.mean = scale * base
        self.var = scale**2 * np.maximum((w * vr * vr).sum(axis=1) - base * base, 0.0)
        self.cum = _row_cumsum(w)
        self.cum_biased = _row_cumsum(w * vr)
        self.ratio_to_law = self.mean / max(law.mean_ref_s, 1e-12)

    def _plain(self, law: RuntimeLaw, R: int, rng: np.random.Generator) -> None:
        """The controller's law (no fitted tail, atoms weighed ``weights x n``): shared
        atoms, drawn and summed exactly as its decisions were tuned on."""
        v, w, _c = _pooled(law.values_ref_s, law.weights)
        if law.sample_size is not None:
            g = rng.standard_gamma(np.maximum(w * law.sample_size, 1e-3)[None, :], size=(R, v.size))
            w_r = g / g.sum(axis=1, keepdims=True)
            scale = _bootstrap_t_scale(v, w, w_r, law.sample_size)
            w = w_r
        else:
            w = np.broadcast_to(w, (R, v.size))
            scale = law.mean_multipliers(rng, R)
        self.values = v  # (A,): shared by every replicate
        self.scale = scale
        base = w @ v
        self.mean = scale * base
        self.var = scale**2 * np.maximum(w @ (v * v) - base * base, 0.0)
        self.cum = _row_cumsum(w)
        self.cum_biased = _row_cumsum(w * v[None, :])
        self.ratio_to_law = self.mean / max(law.mean_ref_s, 1e-12)

    def _atoms(self, idx: np.ndarray) -> np.ndarray:
        return self.values[idx] if self.values.ndim == 1 else np.take_along_axis(self.values, idx, 1)

    def draw(self, rng, k: int, unseen: bool = False) -> np.ndarray:
        """(R, k) runtimes; ``unseen``: from the predictive law of one new task (below)."""
        x = np.minimum(self._atoms(_row_search(self.cum, rng.random((self.cum.shape[0], k)))) * self.scale[:, None],
                       self.law.cap_ref_s)
        return self._unseen(rng, x) if unseen else x

    def draw_residual(self, rng, k: int) -> np.ndarray:
        """(R, k): the remaining work of a task caught part-way at a random moment (density
        S(x)/mu: a length-biased draw times a uniform)."""
        x = self._atoms(_row_search(self.cum_biased, rng.random((self.cum.shape[0], k))))
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


def _refitted(v: np.ndarray, w_r: np.ndarray, b: int, cut: float | None, cap: float) -> np.ndarray:
    """(R, A) atoms: the shared ones, the last ``b`` (a fitted tail) refitted on each
    replicate's weights (the law's own where a replicate's fit fails)."""
    R = w_r.shape[0]
    vr = np.broadcast_to(v, (R, v.size))
    if not b or cut is None:
        return vr
    tails = fitted_tails(v[:-b], np.cumsum(w_r[:, :-b], axis=1), cut, cap)
    vr = vr.copy()
    vr[:, -b:] = np.where(np.isfinite(tails), tails, v[None, -b:])
    return vr


def _bootstrap_t_scale(v, w, w_r, n: float, vr: np.ndarray | None = None) -> np.ndarray:
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
    if vr is None:  # shared atoms (the controller's law: summed as it was tuned on)
        m_r = w_r @ v
        s_r = np.sqrt(np.maximum(w_r @ (v * v) - m_r * m_r, 1e-300))
    else:
        m_r = (w_r * vr).sum(axis=1)
        s_r = np.sqrt(np.maximum((w_r * vr * vr).sum(axis=1) - m_r * m_r, 1e-300))
    t = np.clip((m_r - m) / (s_r / math.sqrt(n)), -6.0, 6.0)
    mu = np.clip(m - t * s / math.sqrt(n), m / 5, 5 * m)
    return mu / m_r


def _pooled(values: np.ndarray, weights: np.ndarray, counts: np.ndarray | None = None):
    """(values, weights, counts) with at most ``_MAX_ATOMS`` atoms (counts None: None)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    c = None if counts is None else np.asarray(counts, dtype=float)[order]
    if v.size <= _MAX_ATOMS:
        return v, w, c
    head = v.size - _KEPT_TAIL
    groups = _MAX_ATOMS - _KEPT_TAIL
    edges = np.linspace(0, head, groups + 1).astype(int)
    mass = np.add.reduceat(w[:head], edges[:-1])
    mean = np.add.reduceat(w[:head] * v[:head], edges[:-1]) / np.maximum(mass, 1e-300)
    pooled_c = None if c is None else np.concatenate((np.add.reduceat(c[:head], edges[:-1]), c[head:]))
    return np.concatenate((mean, v[head:])), np.concatenate((mass, w[head:])), pooled_c


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


