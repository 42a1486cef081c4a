"""Runtime distributions of the sources, for tests, benchmarks and the simulator
(ALGORITHMS.md 7). Runtimes are in reference seconds; each workload names the timeout
(``R_max``) that fits it.

Where a source's distribution has an unbounded tail the cut is a parameter, stated here:

* thesis Table 4.2, minutes: ``short`` U(0, 8); ``long`` N(36, 6); ``mixture`` N(12, 3);
  BaTS: ``bats`` N(15, sqrt 5). Normals are truncated (by rejection: the conditional
  distribution, not clipping) to ``mean +/- cut_sd * sd`` and at 0; default ``cut_sd = 4``.
  Timeout: the upper end of the support.
* thesis Tables 5.6, 6.3: ``2^x`` minutes with ``ls`` x ~ U(0, 3), ``lm`` x ~ N(1.8, 3),
  ``ll`` x ~ N(3.5, 3). For ``lm`` and ``ll`` x is truncated (rejection) to
  ``x_range = (0, 8)`` by default, i.e. 1 minute to 4 h 16 min. Timeout: ``2^x_max`` minutes.
* ``lognormal``: median 10 minutes, log-sd 1, untruncated; timeout at its 99th percentile,
  so about 1 % of samples are capped (the estimators then estimate the capped mean).
* ``bimodal``: 70 % N(10, 1) and 30 % N(60, 5) minutes, each truncated at 4 sd; timeout
  80 minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np

MINUTE_S = 60.0

Sampler = Callable[[np.random.Generator, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class Workload:
    """A named runtime distribution: ``draw(rng, n)`` gives ``n`` runtimes in seconds."""

    name: str
    description: str
    timeout_s: float
    draw: Sampler

    def sample_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.draw(rng, n)


def truncated_normal(rng: np.random.Generator, n: int, mean: float, sd: float, low: float, high: float) -> np.ndarray:
    """``n`` draws of N(mean, sd) conditioned on ``[low, high]`` (rejection sampling)."""
    if not low < high:
        raise ValueError(f"empty truncation interval [{low}, {high}]")
    out = np.empty(0)
    while out.size < n:
        draw = rng.normal(mean, sd, size=2 * (n - out.size) + 16)
        out = np.concatenate((out, draw[(draw >= low) & (draw <= high)]))
    return out[:n]


def normal_minutes(name: str, mean_min: float, sd_min: float, cut_sd: float = 4.0) -> Workload:
    low, high = max(0.0, mean_min - cut_sd * sd_min), mean_min + cut_sd * sd_min
    return Workload(
        name,
        f"N({mean_min:g}, {sd_min:.3g}) min truncated to [{low:.3g}, {high:.3g}]",
        high * MINUTE_S,
        lambda rng, n: MINUTE_S * truncated_normal(rng, n, mean_min, sd_min, low, high),
    )


def uniform_minutes(name: str, low_min: float, high_min: float) -> Workload:
    return Workload(
        name,
        f"U({low_min:g}, {high_min:g}) min",
        high_min * MINUTE_S,
        lambda rng, n: MINUTE_S * rng.uniform(low_min, high_min, size=n),
    )


def power_of_two_uniform(name: str, x_low: float, x_high: float) -> Workload:
    """``2^x`` minutes with x ~ U(x_low, x_high)."""
    return Workload(
        name,
        f"2^x min, x ~ U({x_low:g}, {x_high:g})",
        2.0**x_high * MINUTE_S,
        lambda rng, n: MINUTE_S * 2.0 ** rng.uniform(x_low, x_high, size=n),
    )


def power_of_two_normal(name: str, x_mean: float, x_sd: float, x_range: tuple[float, float] = (0.0, 8.0)) -> Workload:
    """``2^x`` minutes with x ~ N(x_mean, x_sd) truncated to ``x_range``."""
    low, high = x_range
    return Workload(
        name,
        f"2^x min, x ~ N({x_mean:g}, {x_sd:g}) truncated to [{low:g}, {high:g}]",
        2.0**high * MINUTE_S,
        lambda rng, n: MINUTE_S * 2.0 ** truncated_normal(rng, n, x_mean, x_sd, low, high),
    )


def lognormal_minutes(name: str, median_min: float, log_sd: float, timeout_quantile: float = 0.99) -> Workload:
    mu = math.log(median_min)
    timeout_min = math.exp(mu + log_sd * NormalDist().inv_cdf(timeout_quantile))
    return Workload(
        name,
        f"lognormal, median {median_min:g} min, log-sd {log_sd:g}; timeout at its "
        f"{timeout_quantile:.0%} quantile ({timeout_min:.1f} min)",
        timeout_min * MINUTE_S,
        lambda rng, n: MINUTE_S * rng.lognormal(mu, log_sd, size=n),
    )


def bimodal_minutes(
    name: str, share_short: float, short: tuple[float, float], long: tuple[float, float], timeout_min: float
) -> Workload:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        is_short = rng.random(n) < share_short
        out = np.empty(n)
        k = int(is_short.sum())
        (m1, s1), (m2, s2) = short, long
        out[is_short] = truncated_normal(rng, k, m1, s1, max(0.0, m1 - 4 * s1), m1 + 4 * s1)
        out[~is_short] = truncated_normal(rng, n - k, m2, s2, max(0.0, m2 - 4 * s2), m2 + 4 * s2)
        return MINUTE_S * out

    return Workload(
        name,
        f"{share_short:.0%} N{short} + {1 - share_short:.0%} N{long} min, each cut at 4 sd",
        timeout_min * MINUTE_S,
        draw,
    )


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        uniform_minutes("short", 0.0, 8.0),
        normal_minutes("long", 36.0, 6.0),
        normal_minutes("mixture", 12.0, 3.0),
        normal_minutes("bats", 15.0, math.sqrt(5.0)),
        power_of_two_uniform("ls", 0.0, 3.0),
        power_of_two_normal("lm", 1.8, 3.0),
        power_of_two_normal("ll", 3.5, 3.0),
        lognormal_minutes("lognormal", 10.0, 1.0),
        bimodal_minutes("bimodal", 0.7, (10.0, 1.0), (60.0, 5.0), 80.0),
    )
}


def workload(name: str) -> Workload:
    """The workload called ``name`` (one of :data:`WORKLOADS`)."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}") from None
