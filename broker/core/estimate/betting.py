"""A confidence sequence for the mean of ``[0, 1]`` samples by betting: the hedged capital
process with predictable plug-in bets of Waudby-Smith and Ramdas, "Estimating means of
bounded random variables by betting" (JRSS-B 2023), and for a finite bag their
"Confidence sequences for sampling without replacement" (NeurIPS 2020).

Notation. Samples ``X_1, X_2, ...`` in ``[0, 1]``; ``alpha`` the error level. For a candidate
mean ``m`` two gamblers bet, one that the mean is above ``m``, one that it is below:

    K_t^+(m) = prod_{i <= t} (1 + l_i^+(m) (X_i - nu_i(m))),
    K_t^-(m) = prod_{i <= t} (1 - l_i^-(m) (X_i - nu_i(m))),

where ``nu_i(m)`` is what ``E[X_i | X_1 .. X_(i-1)]`` would be if the mean were ``m``:
``nu_i(m) = m`` for independent samples, and for a bag of ``N`` tasks drawn without
replacement whose mean is ``m``

    nu_i(m) = (N m - S_(i-1)) / (N - i + 1),     S_(i-1) = X_1 + ... + X_(i-1)

(the mean of the tasks not drawn yet). If ``nu_i(m)`` leaves ``[0, 1]`` no bag of
``[0, 1]`` values with mean ``m`` could have produced the draws so far, and ``m`` is
rejected outright. The bets are *predictable* (they use ``X_1 .. X_(i-1)`` only):

    mu_t = (1/2 + sum_{i<=t} X_i) / (t + 1),   s2_t = (1/4 + sum_{i<=t} (X_i - mu_i)^2) / (t + 1),
    l_t = sqrt(2 log(2/alpha) / (s2_(t-1) t log(1 + t))),
    l_t^+(m) = min(l_t, c / nu_t(m)),           l_t^-(m) = min(l_t, c / (1 - nu_t(m))),

with the truncation ``c = 1/2`` (a default the paper suggests), so every factor is at least
``1 - c > 0``. If the mean is ``m``, both capitals are non-negative martingales from 1, so
is ``(K^+ + K^-) / 2``, and by Ville's inequality it ever reaches ``1/alpha`` with
probability at most ``alpha``. Hence

    C_t = { m : max(K_t^+(m), K_t^-(m)) < 2 / alpha }

holds the true mean for every ``t`` at once with probability at least ``1 - alpha``, and
so does the running intersection of the ``C_t``: the bounds below are valid at any
stopping time.

Each factor of ``K^+`` is non-increasing in ``nu_t(m)`` (for ``X >= nu``, bet and gain both
shrink; for ``X < nu``, either ``1 + l (X - nu)`` or ``1 - c + c X / nu``), and ``nu_t(m)``
increases with ``m``: so ``K_t^+`` is non-increasing in ``m`` and ``K_t^-`` non-decreasing.
The points rejected by ``K^+`` therefore form an interval ``[0, a]`` and those rejected by
``K^-`` an interval ``[b, 1]``. The capitals are tracked on a geometric grid of candidate
means ``g_j = floor (1 + h)^j`` (relative step ``h``, ``floor = 1e-6``, topped by 1): the
lower bound is the largest grid point of the leading run rejected by ``K^+``, the upper
bound the smallest of the trailing run rejected by ``K^-``. By monotonicity the true mean
lies strictly between them whenever it is in ``C_t``; the grid only widens the interval,
by at most a factor ``1 + h`` on each side. Candidates outside the running interval are
never looked at again, so the work per sample is the number of grid points still inside.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_TRUNCATION = 0.5
GRID_FLOOR = 1e-6


def candidate_means(resolution: float) -> np.ndarray:
    """The grid ``GRID_FLOOR (1 + resolution)^j`` below 1, then 1 itself."""
    if not 0.0 < resolution < 1.0:
        raise ValueError(f"the grid's relative step must lie in (0, 1), got {resolution!r}")
    steps = math.ceil(-math.log(GRID_FLOOR) / math.log1p(resolution))
    grid = GRID_FLOOR * np.exp(np.arange(steps) * math.log1p(resolution))
    return np.append(grid[grid < 1.0], 1.0)


def _variances_before(sum_dev_sq: float, t: np.ndarray, dev_sq: np.ndarray) -> np.ndarray:
    """``s2_(t-1)`` for each ``t`` of a run, ``s2_t = (1/4 + sum_{i<=t} (X_i - mu_i)^2) / (t + 1)``.

    ``sum_dev_sq`` is the sum before the run, ``dev_sq`` the running sums over it.
    """
    first = (0.25 + sum_dev_sq) / t[0]
    return np.concatenate(([first], (0.25 + dev_sq[:-1]) / (t[:-1] + 1.0)))


def _plug_in_bets(log_level: float, t: np.ndarray, var_before: np.ndarray) -> np.ndarray:
    """``l_t = sqrt(2 log(2/alpha) / (s2_(t-1) t log(1 + t)))``, ``log_level = log(2/alpha)``."""
    return np.sqrt(2.0 * log_level / (var_before * t * np.log1p(t)))


def _truncated(bets: np.ndarray, room: np.ndarray, truncation: float) -> np.ndarray:
    """``min(l, c / room)`` row by row, ``c = truncation`` (``room = 0`` leaves ``l``)."""
    with np.errstate(over="ignore"):  # a subnormal room: no cap, like room = 0
        cap = np.divide(truncation, room, out=np.full(room.shape, np.inf), where=room > 0.0)
    return np.minimum(bets[:, None], cap)


class _GridCapital:
    """Log-capitals of both gamblers at the candidate means still inside the running interval.

    ``lo`` is the grid index of the lower bound (``-1``: the bound is 0) and ``hi`` that of
    the upper bound (``grid.size``: the bound is 1); the candidates still tracked are
    ``grid[lo + 1 : hi]`` (none once ``lo + 1 >= hi``).
    """

    def __init__(self, alpha: float, resolution: float):
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
        self.grid = candidate_means(resolution)
        self.log_level = math.log(2.0 / alpha)
        self.lo, self.hi = -1, int(self.grid.size)
        self._log_up = np.zeros(self.grid.size)
        self._log_down = np.zeros(self.grid.size)
        self._scanned: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def active(self) -> np.ndarray:
        return self.grid[self.lo + 1 : self.hi]

    @property
    def bounds(self) -> tuple[float, float]:
        return float(self._lower(np.array(self.lo))), float(self._upper(np.array(self.hi)))

    def _lower(self, lo: np.ndarray) -> np.ndarray:
        return np.where(lo >= 0, self.grid[np.maximum(lo, 0)], 0.0)

    def _upper(self, hi: np.ndarray) -> np.ndarray:
        return np.where(hi < self.grid.size, self.grid[np.minimum(hi, self.grid.size - 1)], 1.0)

    def scan(self, gain_up: np.ndarray, gain_down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Running bounds after each row of log-gains (rows: samples; columns: ``active``)."""
        log_up = self._log_up + np.cumsum(gain_up, axis=0)
        log_down = self._log_down + np.cumsum(gain_down, axis=0)
        # leading run rejected by K^+, trailing run rejected by K^- (monotone in m)
        leading = np.logical_and.accumulate(log_up >= self.log_level, axis=1).sum(axis=1)
        trailing = np.logical_and.accumulate(log_down[:, ::-1] >= self.log_level, axis=1).sum(axis=1)
        lo = np.maximum.accumulate(self.lo + leading)
        hi = np.minimum.accumulate(self.hi - trailing)
        self._scanned = (log_up, log_down, lo, hi)
        return self._lower(lo), self._upper(hi)

    def commit(self, k: int) -> None:
        """Keep the state after the first ``k`` rows of the last scan."""
        if self._scanned is None:
            raise RuntimeError("commit() must follow scan()")
        log_up, log_down, lo, hi = self._scanned
        new_lo, new_hi = int(lo[k - 1]), int(hi[k - 1])
        keep = slice(new_lo - self.lo, new_hi - self.lo - 1)  # empty once new_lo + 1 >= new_hi
        self._log_up, self._log_down = log_up[k - 1, keep], log_down[k - 1, keep]
        self.lo, self.hi = new_lo, new_hi
        self._scanned = None


def log_gains(z: np.ndarray, bets: np.ndarray, centre: np.ndarray, truncation: float) -> tuple[np.ndarray, np.ndarray]:
    """Log-gains ``log(1 + l^+ (X - nu))`` and ``log(1 - l^- (X - nu))`` of both gamblers, for
    samples ``z`` (rows), their bets ``bets`` before truncation (one per row) and the centres
    ``nu`` of the candidates (rows x columns). A centre outside ``[0, 1]`` is impossible:
    ``+inf`` for the gambler it refutes.
    """
    inside = np.clip(centre, 0.0, 1.0)
    excess = z[:, None] - inside
    gain_up = np.log1p(_truncated(bets, inside, truncation) * excess)
    gain_down = np.log1p(-_truncated(bets, 1.0 - inside, truncation) * excess)
    gain_up[centre < 0.0] = np.inf
    gain_down[centre > 1.0] = np.inf
    return gain_up, gain_down


class BettingConfidenceSequence:
    """Running bounds ``[lower, upper]`` that hold the mean at every sample count at once,
    with probability at least ``1 - alpha``.

    ``population``: the number of tasks in the bag when samples are drawn from it without
    replacement (the bounds are then for the bag's mean); ``None`` for independent samples.
    Use :meth:`scan` on a run of samples to see the bounds after each of them, then
    :meth:`commit` to take in a prefix of that run.
    """

    def __init__(self, alpha: float, resolution: float, population: int | None = None,
                 truncation: float = DEFAULT_TRUNCATION):
        if population is not None and population < 1:
            raise ValueError(f"the population must hold at least one task, got {population!r}")
        if not 0.0 < truncation < 1.0:
            raise ValueError(f"the bet truncation must lie in (0, 1), got {truncation!r}")
        self._capital = _GridCapital(alpha, resolution)
        self.population = population
        self.truncation = float(truncation)
        self.t = 0
        self._sum = 0.0
        self._sum_dev_sq = 0.0
        self._scanned: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def bounds(self) -> tuple[float, float]:
        """``(lower, upper)`` after the samples committed so far."""
        return self._capital.bounds

    def scan(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The running bounds after each sample of ``z`` (the state is not changed)."""
        t = np.arange(self.t + 1, self.t + z.size + 1, dtype=float)
        if self.population is not None and t[-1] > self.population:
            raise ValueError(f"sample {int(t[-1])} from a bag of {self.population} tasks")
        sums = self._sum + np.cumsum(z)
        dev_sq = self._sum_dev_sq + np.cumsum((z - (0.5 + sums) / (t + 1.0)) ** 2)
        var_before = _variances_before(self._sum_dev_sq, t, dev_sq)
        bets = _plug_in_bets(self._capital.log_level, t, var_before)
        m = self._capital.active[None, :]
        if self.population is None:
            centre = np.broadcast_to(m, (z.size, m.size))
        else:
            n = float(self.population)
            centre = (n * m - (sums - z)[:, None]) / (n - t + 1.0)[:, None]
        self._scanned = (sums, dev_sq)
        return self._capital.scan(*log_gains(z, bets, centre, self.truncation))

    def commit(self, k: int) -> None:
        """Take in the first ``k`` samples of the last :meth:`scan`."""
        if self._scanned is None:
            raise RuntimeError("commit() must follow scan()")
        sums, dev_sq = self._scanned
        self._capital.commit(k)
        self._sum, self._sum_dev_sq = float(sums[k - 1]), float(dev_sq[k - 1])
        self.t += k
        self._scanned = None


class TypicalBettingPath:
    """The bounds :class:`BettingConfidenceSequence` would give if every log-gain took its
    expected value, for samples of mean ``mu`` and standard deviation ``sigma``.

    Second order about ``X = mu`` (``f(X) = log(1 + l (X - m))``, ``f'' = -l^2 / (1 + l (X - m))^2``):

        E log(1 + l (X - m)) ~ log(1 + l (mu - m)) - l^2 sigma^2 / (2 (1 + l (mu - m))^2),

    and the bets follow ``E (X_t - mu_t)^2 ~ sigma^2 + (mu - mu_t)^2`` with
    ``mu_t = (1/2 + t mu) / (t + 1)``. The real path is noisy and the running intersection
    keeps its luckiest excursions, so real runs stop somewhat earlier than this path does.
    """

    def __init__(self, mu: float, sigma: float, alpha: float, resolution: float,
                 truncation: float = DEFAULT_TRUNCATION):
        if not 0.0 <= mu <= 1.0 or sigma < 0.0:
            raise ValueError(f"need 0 <= mu <= 1 and sigma >= 0, got mu={mu!r}, sigma={sigma!r}")
        self._capital = _GridCapital(alpha, resolution)
        self.mu, self.sigma, self.truncation = float(mu), float(sigma), float(truncation)
        self.t = 0
        self._sum_dev_sq = 0.0
        self._scanned: np.ndarray | None = None

    def scan(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The bounds after each of the next ``n`` typical samples."""
        t = np.arange(self.t + 1, self.t + n + 1, dtype=float)
        mean_hat = (0.5 + t * self.mu) / (t + 1.0)
        dev_sq = self._sum_dev_sq + np.cumsum(self.sigma**2 + (self.mu - mean_hat) ** 2)
        var_before = _variances_before(self._sum_dev_sq, t, dev_sq)
        bets = _plug_in_bets(self._capital.log_level, t, var_before)
        m = self._capital.active
        centre = np.broadcast_to(m[None, :], (n, m.size))
        gap = self.mu - centre
        gains = []
        for bet, direction in ((_truncated(bets, centre, self.truncation), 1.0),
                               (_truncated(bets, 1.0 - centre, self.truncation), -1.0)):
            factor = 1.0 + direction * bet * gap  # >= 1 - truncation > 0
            gains.append(np.log(factor) - (bet * self.sigma) ** 2 / (2.0 * factor**2))
        self._scanned = dev_sq
        return self._capital.scan(*gains)

    def commit(self, k: int) -> None:
        if self._scanned is None:
            raise RuntimeError("commit() must follow scan()")
        self._capital.commit(k)
        self._sum_dev_sq = float(self._scanned[k - 1])
        self.t += k
        self._scanned = None
