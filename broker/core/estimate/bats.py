"""BaTS's fixed sample size (BaTS 003, Sec. 2.1; ALGORITHMS.md 2.2).

For a bag of ``N`` tasks, error level ``Delta`` and the normal quantile ``z`` of the
confidence, BaTS samples

    n = ceil(N z^2 / (z^2 + 2 (N - 1) Delta^2)),     raised to at least 30,

tasks and takes their mean. Here ``Delta = eps`` and ``z = Phi^-1(1 - delta/2)`` (two-sided:
delta 0.10, 0.05, 0.01 give BaTS's 1.65, 1.96, 2.58). The formula comes from sampling with
replacement, which a bag approximates only while ``n <= 0.05 N``; beyond that a warning is
attached to the estimate. It is a normal-approximation rule, not a guarantee: on
heavy-tailed runtimes its coverage falls well short of ``1 - delta``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from .contract import Need, StoppingRule

MIN_SAMPLES = 30
MAX_SHARE_OF_BAG = 0.05


def bats_sample_size(n_tasks: int, eps: float, delta: float) -> int:
    """``max(30, ceil(N z^2 / (z^2 + 2 (N - 1) eps^2)))`` with ``z = Phi^-1(1 - delta/2)``."""
    if n_tasks < 1:
        raise ValueError(f"the bag must hold at least one task, got {n_tasks}")
    z = NormalDist().inv_cdf(1.0 - delta / 2.0)
    n = math.ceil(n_tasks * z**2 / (z**2 + 2.0 * (n_tasks - 1) * eps**2))
    return max(MIN_SAMPLES, n)


class BatsRule(StoppingRule):
    """Mean of a fixed number of samples, sized by BaTS's formula."""

    name = "bats"

    def __init__(self, eps: float, delta: float, r_max_s: float, n_tasks: int):
        super().__init__(eps, delta, r_max_s)
        self.n_tasks = int(n_tasks)
        self.target = bats_sample_size(self.n_tasks, eps, delta)
        self._sum = 0.0

    @property
    def guarantee(self) -> str:
        return (
            f"normal approximation only (BaTS): about {1 - self.delta:g} confidence of "
            f"relative error {self.eps:g} when runtimes are close to normal; no guarantee"
        )

    @property
    def too_large_for_bag(self) -> bool:
        """``n > 0.05 N``: the with-replacement formula no longer describes the bag."""
        return self.target > MAX_SHARE_OF_BAG * self.n_tasks

    def wants_more(self) -> bool:
        return self.samples < self.target

    def needed(self) -> Need:
        rest = self.target - self.samples
        return Need(rest, rest)

    def _consume(self, zs: np.ndarray) -> int:
        take = min(zs.size, self.target - self.samples)
        self._sum += float(np.sum(zs[:take]))
        return take

    def _mean_z(self) -> float:
        return self._sum / self.samples

    def _warnings(self) -> tuple[str, ...]:
        if self.too_large_for_bag:
            return (
                f"sample of {self.target} is more than {MAX_SHARE_OF_BAG:.0%} of the bag's "
                f"{self.n_tasks} tasks: BaTS's formula assumes a much larger bag",
            )
        return ()
