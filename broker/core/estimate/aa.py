"""The AA algorithm of Dagum, Karp, Luby and Ross (SIAM J. Comput. 2000), and the thesis's
simplified variant (thesis 002, Ch. 4.4.3, Algorithm 1). ALGORITHMS.md 2.1.

Notation: samples ``Z in [0, 1]`` with unknown mean ``mu``; goal
``Pr[mu (1 - eps) <= mu_hat <= mu (1 + eps)] >= 1 - delta``.

    lambda = e - 2,   Y(eps, delta) = 4 lambda ln(2/delta) / eps^2,
    Y1(eps, delta) = 1 + (1 + eps) Y(eps, delta)

    SRA(eps, delta):  N = S = 0;  while S < Y1: N += 1; S += Z_N;  return Y1 / N

    AA(eps, delta):
      1. mu1 = SRA(min(1/2, sqrt(eps)), delta/3)
         Y2 = 2 (1 + sqrt(eps)) (1 + 2 sqrt(eps)) (1 + ln(3/2) / ln(2/delta)) Y(eps, delta)
      2. N2 = ceil(Y2 eps / mu1) fresh pairs;  S = sum_i (Z'_{2i-1} - Z'_{2i})^2 / 2;
         rho = max(S / N2, eps mu1)
      3. N3 = ceil(Y2 rho / mu1^2) fresh samples;  mu_hat = their mean

All three phases consume fresh samples. The expected total is about
``Y1/mu + 2 Y2 eps/mu + Y2 max(sigma^2, eps mu)/mu^2``: it grows like ``1/mu``, which is
why a loose ``R_max`` (small ``mu`` of ``Z``) is expensive.

The thesis variant (rule ``aa-thesis``) keeps the three phases but uses the printed
constants: ``eps' = min(1/2, sqrt(eps))``, ``delta' = delta/3`` in every phase,

    Y1' = 1 + (1 + eps') 2.87 ln(2/delta') / eps'^2,   mu1 = S / c  (not Y1 / N),
    N2 = ceil(5.75 ln(2/delta') / (eps mu1)),   N3 = ceil(5.75 ln(2/delta') rho / (eps^2 mu1^2)),

that is, the factors ``(1 + sqrt(eps)) (1 + 2 sqrt(eps))`` are dropped. The print has
``eps'`` where phases 2 and 3 need ``eps`` (and ``mu1^2`` in ``N2``); taken literally the
last phase would only reach relative accuracy ``sqrt(eps)``, so ``eps`` is used there, as
in the published algorithm. The variant carries no proof of its own.
"""

from __future__ import annotations

import math

import numpy as np

from .contract import Need, StoppingRule

LAMBDA = math.e - 2.0


def upsilon(eps: float, delta: float) -> float:
    """``Y(eps, delta) = 4 (e - 2) ln(2/delta) / eps^2``."""
    return 4.0 * LAMBDA * math.log(2.0 / delta) / eps**2


def upsilon1(eps: float, delta: float) -> float:
    """``Y1(eps, delta) = 1 + (1 + eps) Y(eps, delta)``: the SRA stopping threshold."""
    return 1.0 + (1.0 + eps) * upsilon(eps, delta)


def upsilon2(eps: float, delta: float) -> float:
    """``Y2 = 2 (1 + sqrt eps)(1 + 2 sqrt eps)(1 + ln(3/2)/ln(2/delta)) Y(eps, delta)``."""
    root = math.sqrt(eps)
    return 2.0 * (1 + root) * (1 + 2 * root) * (1 + math.log(1.5) / math.log(2.0 / delta)) * upsilon(eps, delta)


class AARule(StoppingRule):
    """The published AA: an (eps, delta) relative estimate for any variable in [0, 1]."""

    name = "aa"

    def __init__(self, eps: float, delta: float, r_max_s: float):
        super().__init__(eps, delta, r_max_s)
        self._phase = "sra"
        self._sra_sum = 0.0
        self._sra_count = 0
        self._mu1 = math.nan
        self._pairs_target = 0
        self._pairs_sum_sq = 0.0
        self._pairs_seen = 0  # samples of the pair phase consumed (2 per pair)
        self._pending: float | None = None  # first half of an unfinished pair
        self._rho = math.nan
        self._final_target = 0
        self._final_sum = 0.0
        self._final_count = 0

    # -- the constants that differ between the published algorithm and the thesis print ----
    # (public so that expected sample counts are computed from the very same formulas)
    def sra_threshold(self) -> float:
        """The SRA phase stops once the sum of its samples reaches this."""
        return upsilon1(min(0.5, math.sqrt(self.eps)), self.delta / 3.0)

    def _sra_mean(self, total: float, count: int) -> float:
        return self.sra_threshold() / count

    def pair_count(self, mu1: float) -> int:
        """Fresh pairs in phase 2, given the SRA estimate ``mu1``."""
        return math.ceil(upsilon2(self.eps, self.delta) * self.eps / mu1)

    def final_count(self, rho: float, mu1: float) -> int:
        """Fresh samples in phase 3, given ``rho`` (phase 2) and ``mu1``."""
        return math.ceil(upsilon2(self.eps, self.delta) * rho / mu1**2)

    @property
    def guarantee(self) -> str:
        return (
            f"Pr[|mu_hat - mu| <= {self.eps:g} mu] >= {1 - self.delta:g} for the mean of the "
            "runtimes capped at R_max (Dagum-Karp-Luby-Ross AA, worst-case optimal)"
        )

    # -- state ------------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        """``sra``, ``pairs``, ``final`` or ``done``."""
        return self._phase

    def wants_more(self) -> bool:
        return self._phase != "done"

    def needed(self) -> Need:
        if self._phase == "sra":
            # Each Z is at most 1, so at least ceil(Y1 - S) more SRA samples; afterwards
            # phases 2 and 3 need at least 2 + 1 more. Nothing bounds the SRA from above.
            return Need(max(1, math.ceil(self.sra_threshold() - self._sra_sum)) + 3, None)
        if self._phase == "pairs":
            rest_pairs = 2 * self._pairs_target - self._pairs_seen
            return Need(rest_pairs + 1, None)  # phase 3's size is not known yet
        if self._phase == "final":
            rest = self._final_target - self._final_count
            return Need(rest, rest)
        return Need(0, 0)

    # -- the three phases ----------------------------------------------------------------
    def _consume(self, zs: np.ndarray) -> int:
        used = 0
        while used < zs.size and self._phase != "done":
            rest = zs[used:]
            if self._phase == "sra":
                used += self._consume_sra(rest)
            elif self._phase == "pairs":
                used += self._consume_pairs(rest)
            else:
                used += self._consume_final(rest)
        return used

    def _consume_sra(self, zs: np.ndarray) -> int:
        threshold = self.sra_threshold()
        running = self._sra_sum + np.cumsum(zs)
        hit = int(np.searchsorted(running, threshold, side="left"))
        if hit == zs.size:  # not there yet
            self._sra_sum = float(running[-1])
            self._sra_count += zs.size
            return zs.size
        self._sra_sum = float(running[hit])
        self._sra_count += hit + 1
        self._mu1 = self._sra_mean(self._sra_sum, self._sra_count)
        self._pairs_target = self.pair_count(self._mu1)
        self._phase = "pairs"
        return hit + 1

    def _consume_pairs(self, zs: np.ndarray) -> int:
        take = min(zs.size, 2 * self._pairs_target - self._pairs_seen)
        chunk = zs[:take]
        if self._pending is not None:
            chunk = np.concatenate(([self._pending], chunk))
            self._pending = None
        whole = chunk.size - chunk.size % 2
        if whole < chunk.size:
            self._pending = float(chunk[-1])
        firsts, seconds = chunk[0:whole:2], chunk[1:whole:2]
        self._pairs_sum_sq += float(np.sum((firsts - seconds) ** 2) / 2.0)
        self._pairs_seen += take
        if self._pairs_seen == 2 * self._pairs_target:
            self._rho = max(self._pairs_sum_sq / self._pairs_target, self.eps * self._mu1)
            self._final_target = self.final_count(self._rho, self._mu1)
            self._phase = "final"
        return take

    def _consume_final(self, zs: np.ndarray) -> int:
        take = min(zs.size, self._final_target - self._final_count)
        self._final_sum += float(np.sum(zs[:take]))
        self._final_count += take
        if self._final_count == self._final_target:
            self._phase = "done"
        return take

    def _mean_z(self) -> float:
        return self._final_sum / self._final_count


class ThesisAARule(AARule):
    """AA with the thesis's simplified constants (see the module docstring); no proof."""

    name = "aa-thesis"

    def sra_threshold(self) -> float:
        eps1 = min(0.5, math.sqrt(self.eps))
        return 1.0 + (1.0 + eps1) * 2.87 * math.log(2.0 / (self.delta / 3.0)) / eps1**2

    def _sra_mean(self, total: float, count: int) -> float:
        return total / count

    def pair_count(self, mu1: float) -> int:
        return math.ceil(5.75 * math.log(2.0 / (self.delta / 3.0)) / (self.eps * mu1))

    def final_count(self, rho: float, mu1: float) -> int:
        return math.ceil(5.75 * math.log(2.0 / (self.delta / 3.0)) * rho / (self.eps**2 * mu1**2))

    @property
    def guarantee(self) -> str:
        return (
            "none proven: the thesis's simplified AA constants (Algorithm 1); "
            f"aims at Pr[|mu_hat - mu| <= {self.eps:g} mu] >= {1 - self.delta:g}"
        )
