"""Empirical-Bernstein stopping (Mnih, Szepesvari, Audibert, ICML 2008): EBStop for a
relative error, with their geometric sampling schedule as an option. ALGORITHMS.md 2.2.

Samples ``Z_1, Z_2, ...`` in ``[0, R]`` (here ``R = 1``). After ``t`` samples let
``Zbar_t`` be their mean and ``sigma_t^2 = (1/t) sum_i (Z_i - Zbar_t)^2`` their (biased)
empirical variance. The empirical Bernstein bound used is

    |Zbar_t - mu| <= c_t = sigma_t sqrt(2 x_t / t) + 3 R x_t / t     w.p. >= 1 - d_t,

with ``x_t = -log(d_t / 3)`` and the ``d_t`` summing to at most ``delta`` so that it holds
for every ``t`` at once:

* plain schedule: ``d_t = c / t^p``, ``c = delta (p - 1) / p`` (``sum_t d_t <= delta``);
* geometric schedule (``beta > 1``): epochs ``k = 1, 2, ...``; at sample ``t``, if
  ``t > floor(beta^k)`` then ``k += 1`` and ``x = -alpha log(d_k / 3)`` with
  ``alpha = floor(beta^k) / floor(beta^(k-1))`` and ``d_k = c / k^p``; ``x_t`` is the
  current ``x``. One ``d_k`` per epoch instead of one per sample (the paper's EBGStop).

Starting from ``LB = 0, UB = inf``, from the second sample on

    LB <- max(LB, Zbar_t - c_t),     UB <- min(UB, Zbar_t + c_t),

and the rule stops as soon as ``(1 + eps) LB >= (1 - eps) UB``, returning

    mu_hat = ((1 + eps) LB + (1 - eps) UB) / 2,

which satisfies ``|mu_hat - mu| <= eps mu`` whenever ``LB <= mu <= UB``, hence with
probability at least ``1 - delta``. The bound needs independent samples; drawing a bag's
tasks without replacement only concentrates the mean further (Hoeffding 1963, Sec. 6).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .contract import Need, StoppingRule

DEFAULT_P = 1.1
DEFAULT_GEOMETRIC_BETA = 1.1
_FIRST_BLOCK = 256


@lru_cache(maxsize=64)
def _log_terms(delta: float, p: float, beta: float, size: int) -> np.ndarray:
    """``x_t`` for ``t = 0 .. size`` (entries 0 and 1 are unused and set to +inf)."""
    c = delta * (p - 1.0) / p
    x = np.full(size + 1, np.inf)
    t = np.arange(2, size + 1, dtype=float)
    if beta <= 1.0:
        x[2:] = math.log(3.0 / c) + p * np.log(t)
    else:
        k, current = 0, math.inf
        for step in range(2, size + 1):
            if step > math.floor(beta**k):
                k += 1
                alpha = math.floor(beta**k) / math.floor(beta ** (k - 1))
                current = alpha * (math.log(3.0 / c) + p * math.log(k))
            x[step] = current
    x.setflags(write=False)
    return x


def log_terms(delta: float, p: float, beta: float, t_max: int) -> np.ndarray:
    """``x_t`` for ``t = 0 .. >= t_max`` (cached in power-of-two sizes)."""
    size = 1 << max(8, (t_max - 1).bit_length())
    return _log_terms(float(delta), float(p), float(beta), size)


def bernstein_radius(sigma: np.ndarray, x: np.ndarray, t: np.ndarray, r: float = 1.0) -> np.ndarray:
    """``c_t = sigma sqrt(2 x / t) + 3 r x / t``."""
    return sigma * np.sqrt(2.0 * x / t) + 3.0 * r * x / t


class EBStopRule(StoppingRule):
    """EBStop (``beta = 1``) or EBGStop (``beta > 1``) for a relative ``(eps, delta)`` estimate."""

    def __init__(self, eps: float, delta: float, r_max_s: float, p: float = DEFAULT_P, beta: float = 1.0):
        super().__init__(eps, delta, r_max_s)
        if not p > 1.0:
            raise ValueError(f"the exponent p of d_t = c / t^p must exceed 1, got {p!r}")
        if not beta >= 1.0:
            raise ValueError(f"the geometric factor beta must be >= 1 (1 = plain EBStop), got {beta!r}")
        self.p = float(p)
        self.beta = float(beta)
        self.name = "ebstop" if beta == 1.0 else "ebstop-geo"
        self._t = 0  # samples taken into the bounds so far
        self._shift = math.nan  # the first sample: sums are of Z - shift, for accurate variances
        self._sum = 0.0
        self._sum_sq = 0.0
        self.lower = 0.0
        self.upper = math.inf
        self._stopped = False

    @property
    def guarantee(self) -> str:
        return (
            f"Pr[|mu_hat - mu| <= {self.eps:g} mu] >= {1 - self.delta:g} for the mean of the "
            "runtimes capped at R_max (empirical-Bernstein stopping, Mnih et al. 2008)"
        )

    def wants_more(self) -> bool:
        return not self._stopped

    def needed(self) -> Need:
        if self._stopped:
            return Need(0, 0)
        return Need(max(1, 2 - self._t), None)

    def _consume(self, zs: np.ndarray) -> int:
        used, block = 0, _FIRST_BLOCK
        while used < zs.size:
            took = self._consume_block(zs[used : used + block])
            used += took
            if self._stopped:
                break
            block *= 2
        return used

    def _consume_block(self, zs: np.ndarray) -> int:
        t0 = self._t
        if t0 == 0:
            self._shift = float(zs[0])
        t = np.arange(t0 + 1, t0 + zs.size + 1, dtype=float)
        shifted = zs - self._shift
        sums = self._sum + np.cumsum(shifted)
        sums_sq = self._sum_sq + np.cumsum(shifted * shifted)
        mean_shifted = sums / t
        mean = self._shift + mean_shifted
        sigma = np.sqrt(np.maximum(sums_sq / t - mean_shifted * mean_shifted, 0.0))
        x = log_terms(self.delta, self.p, self.beta, int(t[-1]))[t0 + 1 : t0 + zs.size + 1]
        radius = np.full(zs.size, np.inf)  # no bound from a single sample
        ok = t >= 2
        radius[ok] = bernstein_radius(sigma[ok], x[ok], t[ok])
        lower = np.maximum(self.lower, np.maximum.accumulate(mean - radius))
        upper = np.minimum(self.upper, np.minimum.accumulate(mean + radius))
        stop = (1.0 + self.eps) * lower >= (1.0 - self.eps) * upper
        hits = np.flatnonzero(stop)
        last = int(hits[0]) if hits.size else zs.size - 1
        self._sum, self._sum_sq = float(sums[last]), float(sums_sq[last])
        self.lower, self.upper = float(lower[last]), float(upper[last])
        self._stopped = bool(hits.size)
        self._t += last + 1
        return last + 1

    def _mean_z(self) -> float:
        return ((1.0 + self.eps) * self.lower + (1.0 - self.eps) * self.upper) / 2.0
