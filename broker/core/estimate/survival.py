"""Online estimation of the work left while the bag runs (ALGORITHMS.md 2.3; BaTS 003
Sec. 2.1-2.2; thesis Ch. 6.4.1).

All times are reference seconds (wall seconds times the slot's speed). Finished tasks are
*events* (their runtime ``x``); a running task of age ``a`` is *censored*: we only know
``P > a``.

Kaplan-Meier product-limit estimate over the distinct event times ``u_1 < ... < u_k``,
with ``d_j`` events at ``u_j`` and ``n_j`` observations (events or censored) ``>= u_j``:

    S(t) = prod_{u_j <= t} (1 - d_j / n_j).

It defines a distribution with mass ``S(u_{j-1}) - S(u_j)`` at each ``u_j``. If the largest
observation is censored, ``S`` never reaches 0 and the data say nothing about the tail:
the leftover mass ``S(u_k)`` is put at the cap ``R`` (the timeout in reference seconds, or
the largest observation if that is larger), the longest any task can run: conservative.

Expected remaining work of a running task of age ``a``:

    r(a) = E[P - a | P > a] = integral_a^inf S(t) dt / S(a)
         = sum_{u > a} f(u) (u - a) / sum_{u > a} f(u),

and its variance the same way. When no finished task ran longer than ``a`` (the task is
older than every observed runtime, so ``S(a)`` is 0 or only the censored tail at the cap)
the data give no answer; the fallback is the conservative ``r(a) = max(R - a, 0)`` (it
cannot run past its timeout), variance 0, and the task is flagged so the caller logs it.
Nothing divides by zero.

BaTS's variant (``tau_e``): the mean of the sample runtimes longer than ``a``, so
``r(a) = mean{x : x > a} - a``; same fallback when no sample is longer than ``a``.

Remaining work and its upper confidence value (:func:`remaining_work`):

    W = sum_{unstarted} e_j + sum_{running} r(a_i),
    Var W = n_u s^2 + n_u^2 s^2 / max(m, 1) + sum_{running} Var(P - a_i | P > a_i),
    W_upper = W + z_{1 - delta} sqrt(Var W),

with ``n_u`` unstarted tasks, ``m`` finished ones and ``s^2`` the variance of the KM
distribution. The first term is the spread of the unstarted tasks' own runtimes, the
second the error of the mean they share (known from ``m`` runtimes only), the third the
spread of the running tasks' ends; ``z`` is the one-sided normal quantile (central limit
theorem). The plan uses ``W_upper`` so a deadline or budget holds with probability about
``1 - delta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

# Below this the survival probability is taken as zero (no task can be expected to go on).
_NO_MASS = 1e-12


@dataclass(frozen=True, slots=True)
class Residual:
    """Expected remaining work of a running task, its variance, and whether the
    conservative fallback was used (the data could not answer)."""

    expected_ref_s: float
    variance_ref_s2: float
    fallback: bool = False


@dataclass(frozen=True, slots=True)
class RemainingWork:
    """Remaining work of the bag: point value, upper confidence value at ``1 - delta``, and
    the positions (in the ``running`` list given) of tasks whose residual fell back."""

    point_ref_s: float
    upper_ref_s: float
    fallbacks: tuple[int, ...] = ()


def _check_cap(cap_ref_s: float) -> float:
    if not (cap_ref_s > 0 and math.isfinite(cap_ref_s)):
        raise ValueError(f"the cap (timeout in reference seconds) must be positive, got {cap_ref_s!r}")
    return float(cap_ref_s)


def _fallback(age_ref_s: float, cap_ref_s: float) -> Residual:
    return Residual(max(cap_ref_s - age_ref_s, 0.0), 0.0, fallback=True)


class KaplanMeier:
    """The product-limit distribution of runtimes from finished and running tasks."""

    def __init__(self, events_ref_s: Sequence[float], censored_ref_s: Sequence[float], cap_ref_s: float):
        events = np.asarray(events_ref_s, dtype=float)
        censored = np.asarray(censored_ref_s, dtype=float)
        if (events.size and events.min() < 0) or (censored.size and censored.min() < 0):
            raise ValueError("runtimes and ages must be >= 0")
        self.events = events.size
        largest = max(events.max(initial=0.0), censored.max(initial=0.0))
        self.cap_ref_s = max(_check_cap(cap_ref_s), float(largest))
        times, deaths = np.unique(events, return_counts=True)
        everything = np.sort(np.concatenate((events, censored)))
        at_risk = everything.size - np.searchsorted(everything, times, side="left")
        surviving = np.cumprod(1.0 - deaths / at_risk)
        before = np.concatenate(([1.0], surviving[:-1]))
        tail = float(surviving[-1]) if surviving.size else 1.0
        self._times = np.concatenate((times, [self.cap_ref_s]))
        self._mass = np.concatenate((before - surviving, [tail]))

    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        """The distribution as (times, probabilities): the distinct event times and the cap."""
        return self._times.copy(), self._mass.copy()

    def survival(self, t_ref_s: float) -> float:
        """``S(t) = Pr[P > t]`` (the tail mass counts as ending at the cap)."""
        return float(self._mass[self._times > t_ref_s].sum())

    @property
    def mean_ref_s(self) -> float:
        return float(self._mass @ self._times)

    @property
    def variance_ref_s2(self) -> float:
        return float(self._mass @ (self._times - self.mean_ref_s) ** 2)

    def residual(self, age_ref_s: float) -> Residual:
        """``E[P - a | P > a]`` and its variance; the flagged fallback when no finished
        task ran longer than ``a`` (then only the cap speaks for the tail)."""
        above = self._times > age_ref_s
        mass = self._mass[above]
        observed_beyond = float(mass[:-1].sum()) if above[-1] else float(mass.sum())
        if observed_beyond <= _NO_MASS:
            return _fallback(age_ref_s, self.cap_ref_s)
        total = float(mass.sum())
        left = self._times[above] - age_ref_s
        expected = float(mass @ left) / total
        variance = max(float(mass @ left**2) / total - expected**2, 0.0)
        return Residual(expected, variance)


def tau_e_residual(samples_ref_s: Sequence[float], age_ref_s: float, cap_ref_s: float) -> Residual:
    """BaTS's ``tau_e``: remaining work = mean of the samples longer than ``a``, minus ``a``."""
    cap = _check_cap(cap_ref_s)
    samples = np.asarray(samples_ref_s, dtype=float)
    longer = samples[samples > age_ref_s]
    if longer.size == 0:
        return _fallback(age_ref_s, max(cap, float(samples.max(initial=0.0))))
    return Residual(float(longer.mean()) - age_ref_s, float(longer.var()))


def remaining_work(
    unstarted_estimates_ref_s: Sequence[float],
    running_ref_s: Sequence[float],
    finished_ref_s: Sequence[float],
    delta: float,
    cap_ref_s: float,
) -> RemainingWork:
    """Point and upper (``1 - delta``) values of the work left; see the module docstring.

    ``running_ref_s`` are the ages of the running tasks (elapsed times speed),
    ``finished_ref_s`` the runtimes of finished ones, ``cap_ref_s`` the timeout.
    """
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    unstarted = np.asarray(unstarted_estimates_ref_s, dtype=float)
    km = KaplanMeier(finished_ref_s, running_ref_s, cap_ref_s)
    residuals = [km.residual(a) for a in running_ref_s]
    point = float(unstarted.sum()) + sum(r.expected_ref_s for r in residuals)
    spread = km.variance_ref_s2
    n_unstarted = unstarted.size
    variance = (
        n_unstarted * spread
        + n_unstarted**2 * spread / max(km.events, 1)
        + sum(r.variance_ref_s2 for r in residuals)
    )
    z = NormalDist().inv_cdf(1.0 - delta)
    return RemainingWork(
        point_ref_s=point,
        upper_ref_s=point + z * math.sqrt(variance),
        fallbacks=tuple(i for i, r in enumerate(residuals) if r.fallback),
    )
