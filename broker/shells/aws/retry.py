"""Bounded retries with jittered exponential backoff, on an injected clock and sleep.

Before retry ``k`` (k = 1, 2, ...) the caller sleeps

    b_k = min(cap, base * 2^(k-1)),    delay_k = b_k / 2 + U(0, b_k / 2)

("equal jitter": at least half the exponential step, so a burst of clients backs off
together, plus a uniform half that spreads them apart). Retrying stops after
``max_attempts`` attempts, or earlier when the next sleep would take the total time since
the first attempt past ``max_total_s``. Time only passes through the injected ``sleep``
and is read through the injected ``clock``, so tests neither wait nor depend on timing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    max_total_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not (0 < self.base_delay_s <= self.max_delay_s):
            raise ValueError("need 0 < base_delay_s <= max_delay_s")
        if self.max_total_s < 0:
            raise ValueError("max_total_s must be >= 0")

    def step_s(self, retry: int) -> float:
        """The exponential step b_k before retry ``retry`` (1-based), capped."""
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry - 1))

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """A jittered delay in [b_k / 2, b_k]."""
        step = self.step_s(retry)
        return step / 2.0 + rng.uniform(0.0, step / 2.0)
