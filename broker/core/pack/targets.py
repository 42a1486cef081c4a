"""Workload targets: how much work each machine should receive (thesis Eq. 5.4, 6.3).

Notation: machines i with capacity ``a_i = k_i s_i`` (reference seconds per second, slots
times speed) and price ``c_i`` (USD per hour); total estimated work ``W`` (reference seconds);
horizon ``T`` (seconds, the chosen Pareto point's makespan ``T_r``). Sort the machines by
cost efficiency ``a_i / c_i`` descending (free machines first, ties in input order) and fill
the cheapest work first:

    R_1 = W,    w_i = min(T_i a_i, R_i),    R_(i+1) = R_i - w_i

with ``T_i = min(T, horizon of machine i)``. Every machine before the last one touched gets a
full ``T_i a_i`` (the errata's reading of Eq. 6.3: the target is ``T_r x s_i``, not
``T_r s_i sum p_j``), one gets the remainder, the rest get 0. When ``sum_i w_i < W`` the
horizon cannot hold the work; the targets are still returned and the caller decides
(re-plan with a longer horizon, or report the shortfall).
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np


class RatedMachine(Protocol):
    """Anything with a capacity and a price: a :class:`Bin` or a ``MachineType``."""

    @property
    def capacity_per_s(self) -> float: ...

    @property
    def price_per_hour(self) -> float: ...


def _efficiency(machine: RatedMachine) -> float:
    if machine.price_per_hour <= 0:
        return math.inf
    return machine.capacity_per_s * 3600.0 / machine.price_per_hour


def workload_targets(machines: Sequence[RatedMachine], total_ref_s: float,
                     horizon_s: float | Sequence[float]) -> list[float]:
    """Targets (reference seconds) for ``machines``, in the order the machines were given.

    ``horizon_s`` is one horizon for all machines or one per machine; a machine that carries
    its own ``horizon_s`` (a :class:`Bin`) is also capped by it.
    """
    if not (total_ref_s >= 0 and math.isfinite(total_ref_s)):
        raise ValueError(f"total work must be a finite number >= 0 reference seconds, got {total_ref_s!r}")
    horizons = np.asarray(horizon_s, dtype=float)
    if horizons.ndim and horizons.shape != (len(machines),):
        raise ValueError(f"{horizons.size} horizons given for {len(machines)} machines: "
                         "give one for all or one per machine")
    horizons = np.broadcast_to(horizons, (len(machines),))
    if (horizons < 0).any() or np.isnan(horizons).any():
        raise ValueError(f"horizons must be >= 0 seconds, got {horizon_s!r}")
    order = np.argsort([-_efficiency(m) for m in machines], kind="stable")
    targets = [0.0] * len(machines)
    remaining_ref_s = float(total_ref_s)
    for i in order:
        if remaining_ref_s <= 0:
            break
        machine = machines[i]
        own_horizon_s = getattr(machine, "horizon_s", math.inf)
        reach_ref_s = min(float(horizons[i]), own_horizon_s) * machine.capacity_per_s
        targets[i] = min(reach_ref_s, remaining_ref_s)
        remaining_ref_s -= targets[i]
    return targets
