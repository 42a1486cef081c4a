"""The tail of a runtime law past what Kaplan-Meier can place (``law.py``).

While the long tasks of a bag still run, the law learned from it is the body of the
distribution with its tail cut: past the last runtime ``TAIL_AT_RISK`` tasks reached (the
cut), the product-limit mass is a guess (all of it at the longest runtime seen, or at the
cap). It goes where a lognormal fitted to the law's upper part puts it: ``TAIL_ATOMS``
equal-mass quantiles of the lognormal conditioned on ``X > cut``, never past the cap.

The fit is least squares on the probability plot: ``log q(p)`` against ``z(p)`` at
``GRID`` probabilities from the median to the law's CDF at the cut. It is made once for the
law and once per replicate of the forecast, on that replicate's re-weighed law: the tail
is most of what is uncertain about a heavy-tailed mean (on lognormal(sigma 1.5) runtimes
with 300 seen, a third of it), and the fit of a resample spreads it as the data allow.

Pure numpy; the normal's tail is read off a table of ``log S(z)`` (``math.erfc``), exact
far into the tail where ``1 - Phi`` loses its digits.
"""

from __future__ import annotations

import math

import numpy as np

TAIL_AT_RISK = 10  # Kaplan-Meier is kept up to the last runtime this many tasks reached
TAIL_FIT_EVENTS = 200  # runtimes seen before a tail is fitted at all
TAIL_ATOMS = 32  # atoms the mass past the cut is spread over
FIT_FROM = 0.5  # the lognormal is fitted to the law's upper part: from this quantile ...
FIT_SKIP = 0.5  # ... moved this share of the way to the cut's, to the cut
GRID = 24  # probabilities of the fit

_Z = np.linspace(-3.0, 12.0, 6001)
_LOG_S = np.array([math.log(0.5 * math.erfc(z / math.sqrt(2.0))) for z in _Z])  # decreasing


def _z_of_log_survival(log_s: np.ndarray) -> np.ndarray:
    return np.interp(log_s, _LOG_S[::-1], _Z[::-1])


def fitted_tails(values: np.ndarray, cum: np.ndarray, cut: float, cap: float) -> np.ndarray:
    """(R, TAIL_ATOMS) tail atoms, one row per law; NaN rows where no lognormal fits.

    ``values`` (H,): the law's ascending atoms up to the cut; ``cum`` (R, H): each law's CDF
    at them (its last column is the law's CDF at the cut, 1 less the tail's mass)."""
    R, H = cum.shape
    F = cum[:, -1]
    frac = (np.arange(GRID) + 0.5) / GRID
    start = FIT_FROM + FIT_SKIP * (F - FIT_FROM)
    p = start[:, None] + (F - start)[:, None] * frac[None, :]
    offset = 2.0 * np.arange(R, dtype=float)[:, None]
    idx = np.searchsorted((cum + offset).ravel(), (p + offset).ravel(), side="left").reshape(R, GRID)
    idx = np.clip(idx - (np.arange(R) * H)[:, None], 0, H - 1)
    y = np.log(np.maximum(values[idx], 1e-12))
    z = _z_of_log_survival(np.log(np.maximum(1.0 - p, 1e-300)))
    zc, yc = z - z.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    szz = (zc * zc).sum(axis=1)
    sigma = (zc * yc).sum(axis=1) / np.maximum(szz, 1e-300)
    ok = (F > FIT_FROM + 1e-9) & (sigma > 0) & (szz > 0) & (values[0] > 0)
    sigma = np.where(ok, sigma, 1.0)
    mu = y.mean(axis=1) - sigma * z.mean(axis=1)
    log_s0 = np.interp((math.log(cut) - mu) / sigma, _Z, _LOG_S)
    k = np.log1p(-(np.arange(TAIL_ATOMS) + 0.5) / TAIL_ATOMS)
    log_tail = mu[:, None] + sigma[:, None] * _z_of_log_survival(log_s0[:, None] + k[None, :])
    tail = np.exp(np.minimum(log_tail, math.log(cap) + 1.0))
    return np.where(ok[:, None], np.clip(tail, cut, cap), np.nan)
