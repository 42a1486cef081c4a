"""Stopping by confidence bounds for a relative ``(eps, delta)`` estimate (ALGORITHMS.md 2.2).

The relative stop. A rule keeps running bounds ``L_t <= mu <= U_t`` that hold for every
``t`` at once with probability at least ``1 - delta``. An estimate ``mu_hat`` is within
``(1 +/- eps)`` of every ``mu`` in ``[L, U]`` iff ``mu_hat <= (1 + eps) L`` and
``mu_hat >= (1 - eps) U``, which some ``mu_hat`` satisfies iff

    (1 - eps) U_t <= (1 + eps) L_t.

The rule stops at the first such ``t`` and returns

    mu_hat = 2 L U / (L + U),

the point of least worst-case relative error over ``[L, U]`` (it equalises
``mu_hat / L - 1`` and ``1 - mu_hat / U``); it satisfies both inequalities exactly when
the stop condition holds. As the bounds hold at every ``t`` at once they hold at the
data-dependent stopping time, so ``Pr[|mu_hat - mu| <= eps mu] >= 1 - delta``.

Two sources of bounds, in samples ``Z`` in ``[0, 1]``:

* ``ebstop``: the betting confidence sequence of Waudby-Smith and Ramdas (JRSS-B 2023),
  :mod:`.betting`, at ``alpha = delta`` on a grid of relative step ``eps / 20``. When the
  bag size ``N`` is known it is the without-replacement version, for the bag's own mean.
  With bets truncated at ``1/2``, its cost for the range is about ``2 log(2/delta) / t``
  *relative to* ``mu`` below and to ``1 - mu`` above, against the absolute ``3 x_t / t``
  (``x_t`` ~ 12-15) of the bound below, so on runtimes of small spread it needs tens of
  samples where the bound below needs hundreds.
* ``ebstop-msa`` (and ``ebstop-geo``): EBStop of Mnih, Szepesvari and Audibert (ICML 2008).
  After ``t`` samples with mean ``Zbar_t`` and (biased) empirical variance ``sigma_t^2``,

      |Zbar_t - mu| <= c_t = sigma_t sqrt(2 x_t / t) + 3 R x_t / t     w.p. >= 1 - d_t,

  with ``R = 1``, ``x_t = -log(d_t / 3)`` and the ``d_t`` summing to at most ``delta``:

  - plain schedule: ``d_t = c / t^p``, ``c = delta (p - 1) / p``;
  - geometric schedule (``beta > 1``, their EBGStop): epochs ``k = 1, 2, ...``; at sample
    ``t``, if ``t > floor(beta^k)`` then ``k += 1`` and ``x = -alpha log(d_k / 3)`` with
    ``alpha = floor(beta^k) / floor(beta^(k-1))``, ``d_k = c / k^p``; ``x_t`` is the
    current ``x``.

  The bounds are ``L_t = max_s (Zbar_s - c_s)``, ``U_t = min_s (Zbar_s + c_s)`` from the
  second sample on. This bound treats samples as independent; drawing a bag's tasks
  without replacement only concentrates a fixed-``t`` mean further (Hoeffding 1963,
  Sec. 6).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from functools import lru_cache

import numpy as np

from .betting import BettingConfidenceSequence, TypicalBettingPath, candidate_means
from .contract import Need, StoppingRule

DEFAULT_P = 1.1
DEFAULT_GEOMETRIC_BETA = 1.1
# grid points of the betting sequence per eps of relative error
GRID_STEPS_PER_EPS = 20


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


def relative_stop(lower: np.ndarray, upper: np.ndarray, eps: float) -> np.ndarray:
    """Where ``(1 - eps) U <= (1 + eps) L``: some point is within ``(1 +/- eps)`` of all of ``[L, U]``."""
    return (1.0 - eps) * upper <= (1.0 + eps) * lower


def relative_point(lower: float, upper: float) -> float:
    """``2 L U / (L + U)``: least worst-case relative error over ``[L, U]`` (0 if ``U = 0``)."""
    return 2.0 * lower * upper / (lower + upper) if upper > 0.0 else 0.0


class RelativeStopRule(StoppingRule):
    """Stops when running bounds ``[lower, upper]`` on the mean of ``Z`` meet the relative
    condition; subclasses give the bounds (:meth:`_scan`) and take in a prefix (:meth:`_commit`)."""

    first_block = 256  # samples looked at together first; doubled on each further block ...
    max_block = 1 << 30  # ... up to this many

    def __init__(self, eps: float, delta: float, r_max_s: float):
        super().__init__(eps, delta, r_max_s)
        self.lower = 0.0
        self.upper = math.inf
        self._stopped = False

    def wants_more(self) -> bool:
        return not self._stopped

    def needed(self) -> Need:
        return Need(0, 0) if self._stopped else Need(1, None)

    @abstractmethod
    def _scan(self, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The running bounds after each sample of ``zs``, without taking them in."""

    @abstractmethod
    def _commit(self, k: int) -> None:
        """Take in the first ``k`` samples of the last :meth:`_scan`."""

    def _consume(self, zs: np.ndarray) -> int:
        used, block = 0, self.first_block
        while used < zs.size and not self._stopped:
            lower, upper = self._scan(zs[used : used + block])
            hits = np.flatnonzero(relative_stop(lower, upper, self.eps))
            take = int(hits[0]) + 1 if hits.size else lower.size
            self._commit(take)
            self.lower, self.upper = float(lower[take - 1]), float(upper[take - 1])
            self._stopped = bool(hits.size)
            used += take
            block = min(2 * block, self.max_block)
        return used

    def _mean_z(self) -> float:
        return relative_point(self.lower, self.upper)


class BettingStopRule(RelativeStopRule):
    """``ebstop``: the relative stop on the betting confidence sequence (:mod:`.betting`).

    ``n_tasks``, the bag size, makes the bounds those of sampling the bag without
    replacement; without it samples are taken as independent draws.
    """

    name = "ebstop"
    max_block = 1024  # samples scanned past the stop are wasted work

    def __init__(self, eps: float, delta: float, r_max_s: float, n_tasks: int | None = None):
        super().__init__(eps, delta, r_max_s)
        self._sequence = BettingConfidenceSequence(delta, eps / GRID_STEPS_PER_EPS, population=n_tasks)
        self.first_block = betting_first_block(eps)

    @property
    def guarantee(self) -> str:
        target = "the bag's mean runtime" if self._sequence.population else "the mean runtime"
        return (
            f"Pr[|mu_hat - mu| <= {self.eps:g} mu] >= {1 - self.delta:g} for {target}, runtimes "
            "capped at R_max (betting confidence sequence, Waudby-Smith and Ramdas 2023)"
        )

    def _scan(self, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._sequence.scan(zs)

    def _commit(self, k: int) -> None:
        self._sequence.commit(k)


def betting_first_block(eps: float) -> int:
    """A block costs samples x candidates, and until the first samples come in every grid
    point is a candidate: at most 16 samples (low-spread runs stop in tens) and about a
    million cells."""
    return max(1, min(16, (1 << 20) // candidate_means(eps / GRID_STEPS_PER_EPS).size))


def betting_expected_samples(eps: float, delta: float, mu: float, sigma: float, limit: int) -> float:
    """Samples ``ebstop`` takes on :class:`.betting.TypicalBettingPath` for ``Z`` of mean ``mu``
    and standard deviation ``sigma`` (``inf`` past ``limit``). Real runs, whose noisy
    paths stop early now and then, take somewhat fewer."""
    path = TypicalBettingPath(mu, sigma, delta, eps / GRID_STEPS_PER_EPS)
    block = betting_first_block(eps)
    while path.t < limit:
        lower, upper = path.scan(block)
        hits = np.flatnonzero(relative_stop(lower, upper, eps))
        if hits.size:
            return float(path.t + hits[0] + 1)
        path.commit(block)
        block = min(2 * block, BettingStopRule.max_block)
    return math.inf


class EBStopRule(RelativeStopRule):
    """``ebstop-msa``: EBStop (``beta = 1``), or ``ebstop-geo``: EBGStop (``beta > 1``)."""

    def __init__(self, eps: float, delta: float, r_max_s: float, p: float = DEFAULT_P, beta: float = 1.0):
        super().__init__(eps, delta, r_max_s)
        if not p > 1.0:
            raise ValueError(f"the exponent p of d_t = c / t^p must exceed 1, got {p!r}")
        if not beta >= 1.0:
            raise ValueError(f"the geometric factor beta must be >= 1 (1 = plain EBStop), got {beta!r}")
        self.p = float(p)
        self.beta = float(beta)
        self.name = "ebstop-msa" if beta == 1.0 else "ebstop-geo"
        self._t = 0  # samples taken into the bounds so far
        self._shift = math.nan  # the first sample: sums are of Z - shift, for accurate variances
        self._sum = 0.0
        self._sum_sq = 0.0
        self._scanned: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def guarantee(self) -> str:
        return (
            f"Pr[|mu_hat - mu| <= {self.eps:g} mu] >= {1 - self.delta:g} for the mean of the "
            "runtimes capped at R_max (empirical-Bernstein stopping, Mnih et al. 2008)"
        )

    def needed(self) -> Need:
        if self._stopped:
            return Need(0, 0)
        return Need(max(1, 2 - self._t), None)  # no bound from a single sample

    def _scan(self, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t0 = self._t
        shift = float(zs[0]) if t0 == 0 else self._shift
        t = np.arange(t0 + 1, t0 + zs.size + 1, dtype=float)
        shifted = zs - shift
        sums = self._sum + np.cumsum(shifted)
        sums_sq = self._sum_sq + np.cumsum(shifted * shifted)
        mean_shifted = sums / t
        mean = shift + mean_shifted
        sigma = np.sqrt(np.maximum(sums_sq / t - mean_shifted * mean_shifted, 0.0))
        x = log_terms(self.delta, self.p, self.beta, int(t[-1]))[t0 + 1 : t0 + zs.size + 1]
        radius = np.full(zs.size, np.inf)  # no bound from a single sample
        ok = t >= 2
        radius[ok] = bernstein_radius(sigma[ok], x[ok], t[ok])
        lower = np.maximum(self.lower, np.maximum.accumulate(mean - radius))
        upper = np.minimum(self.upper, np.minimum.accumulate(mean + radius))
        self._shift = shift
        self._scanned = (sums, sums_sq)
        return lower, upper

    def _commit(self, k: int) -> None:
        if self._scanned is None:
            raise RuntimeError("_commit() must follow _scan()")
        sums, sums_sq = self._scanned
        self._sum, self._sum_sq = float(sums[k - 1]), float(sums_sq[k - 1])
        self._t += k
        self._scanned = None
