"""Billing models: how long an instance is paid for, and what it has cost.

An instance launched at ``t0`` and observed at ``now`` is paid until

    paid_until = t0 + max(m, beta * ceil((now - t0) / beta))

(ALGORITHMS.md 1), with ``beta`` the billing unit and ``m`` the minimum billed time.  A
moment exactly on a unit boundary belongs to the unit that ends there: at ``now - t0 = k
beta`` the instance has been charged ``k`` units, and the next unit begins the instant after.
Prices are USD per hour; the cost of billed seconds is ``billed_s / 3600 * price_per_hour``,
so an hourly unit costs exactly the hourly price and per-second billing prorates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Floating-point slack when deciding whether a moment sits on a unit boundary.
_BOUNDARY_EPS_S = 1e-6


@dataclass(frozen=True, slots=True)
class Billing:
    """A billing model: unit ``unit_s`` (beta) and minimum billed time ``minimum_s`` (m)."""

    unit_s: float
    minimum_s: float
    name: str = "custom"

    def __post_init__(self) -> None:
        if not (self.unit_s > 0 and math.isfinite(self.unit_s)):
            raise ValueError(f"billing unit must be a positive number of seconds, got {self.unit_s!r}")
        if not (self.minimum_s >= 0 and math.isfinite(self.minimum_s)):
            raise ValueError(f"billing minimum must be >= 0 seconds, got {self.minimum_s!r}")

    @classmethod
    def hourly(cls) -> "Billing":
        return cls(3600.0, 3600.0, "hourly")

    @classmethod
    def per_second(cls) -> "Billing":
        return cls(1.0, 60.0, "per-second")

    @classmethod
    def custom(cls, unit_s: float, minimum_s: float) -> "Billing":
        return cls(float(unit_s), float(minimum_s), "custom")

    # -- charged time -------------------------------------------------------------------
    def units(self, elapsed_s: float) -> int:
        """Billing units charged after ``elapsed_s`` seconds of life (the minimum included)."""
        elapsed_s = max(0.0, elapsed_s)
        started = math.ceil(elapsed_s / self.unit_s - _BOUNDARY_EPS_S / self.unit_s)
        min_units = math.ceil(self.minimum_s / self.unit_s - _BOUNDARY_EPS_S / self.unit_s)
        return max(started, min_units, 1)

    def billed_s(self, elapsed_s: float) -> float:
        """Seconds charged after ``elapsed_s`` seconds of life: ``max(m, beta ceil(e/beta))``."""
        elapsed_s = max(0.0, elapsed_s)
        started = self.unit_s * math.ceil(elapsed_s / self.unit_s - _BOUNDARY_EPS_S / self.unit_s)
        return max(self.minimum_s, started, self.unit_s)

    def interrupted_billed_s(self, elapsed_s: float) -> float:
        """Seconds charged for an instance EC2 interrupted (spot) after ``elapsed_s``: only
        what ran, the unit it interrupted free (per-second billing: the seconds run, no
        minimum; hourly: the whole hours before the interruption)."""
        elapsed_s = max(0.0, elapsed_s)
        return self.unit_s * math.floor(elapsed_s / self.unit_s + _BOUNDARY_EPS_S / self.unit_s)

    def paid_until(self, launched_at_s: float, now_s: float) -> float:
        """The moment up to which the instance is already paid for."""
        return launched_at_s + self.billed_s(now_s - launched_at_s)

    def cost_usd(self, elapsed_s: float, price_per_hour: float) -> float:
        """Committed spend of one instance alive for ``elapsed_s`` seconds."""
        return self.billed_s(elapsed_s) / 3600.0 * price_per_hour

    def unit_cost_usd(self, price_per_hour: float) -> float:
        """Price of one billing unit."""
        return self.unit_s / 3600.0 * price_per_hour

    def next_boundary(self, launched_at_s: float, now_s: float) -> float:
        """Alias of :meth:`paid_until`: the next moment a new unit would be charged."""
        return self.paid_until(launched_at_s, now_s)

    def describe(self) -> str:
        if self.name in ("hourly", "per-second"):
            return self.name
        return f"unit {self.unit_s:g}s, minimum {self.minimum_s:g}s"
