"""Scoring a packing: loads, busy times, makespan, billing units and cost.

For bin i with load ``rho_i`` (reference seconds) and capacity ``a_i = k_i s_i``, the fluid
busy time is ``b_i = rho_i / a_i``: the wall time its slots need when the work spreads evenly
over them. The true finish of bin i lies in ``[b_i, b_i + max_j p_j / s_i]`` (list scheduling
on its ``k_i`` slots), so ``makespan = max_i b_i`` is the packer's estimate, and the list
schedulers report the true slot-level finish instead.

Cost, with a billing model (unit ``beta``, minimum ``m``): a public bin that receives work is
rented for its busy time and charged ``max(m, beta ceil(b_i / beta)) c_i / 3600``; a bin with
no work is not rented and costs nothing; a private bin costs its amortized price prorated,
``b_i c_i / 3600``, and has no units.
"""

from __future__ import annotations

import numpy as np

from ..billing import Billing
from .bins import Assignment


def bin_loads_ref_s(assignment: Assignment) -> np.ndarray:
    """Work on each bin (reference seconds)."""
    return assignment.loads_ref_s


def busy_s(assignment: Assignment) -> np.ndarray:
    """Fluid busy time of each bin (seconds): load over capacity."""
    capacity_per_s = np.array([b.capacity_per_s for b in assignment.bins], dtype=float)
    return assignment.loads_ref_s / capacity_per_s


def makespan_s(assignment: Assignment) -> float:
    """Largest fluid busy time over the bins (0 with no bins)."""
    busy = busy_s(assignment)
    return float(busy.max()) if busy.size else 0.0


def billing_units(assignment: Assignment, billing: Billing,
                  busy_override_s: np.ndarray | None = None) -> np.ndarray:
    """Billing units charged per bin: 0 for bins without work and for private bins."""
    busy = busy_s(assignment) if busy_override_s is None else np.asarray(busy_override_s, dtype=float)
    used = assignment.loads_ref_s > 0
    return np.array([billing.units(t) if (u and not b.private) else 0
                     for b, t, u in zip(assignment.bins, busy.tolist(), used.tolist())], dtype=np.int64)


def bin_costs_usd(assignment: Assignment, billing: Billing,
                  busy_override_s: np.ndarray | None = None) -> np.ndarray:
    """Cost of each bin (USD). ``busy_override_s`` replaces the fluid busy times, e.g. by the
    slot-level finish times a list schedule reports."""
    busy = busy_s(assignment) if busy_override_s is None else np.asarray(busy_override_s, dtype=float)
    used = assignment.loads_ref_s > 0
    costs = []
    for b, t, u in zip(assignment.bins, busy.tolist(), used.tolist()):
        if not u:
            costs.append(0.0)
        elif b.private:
            costs.append(t / 3600.0 * b.price_per_hour)
        else:
            costs.append(billing.cost_usd(t, b.price_per_hour))
    return np.array(costs, dtype=float)


def cost_usd(assignment: Assignment, billing: Billing,
             busy_override_s: np.ndarray | None = None) -> float:
    """Total cost of the assignment (USD) under ``billing``; see :func:`bin_costs_usd`."""
    return float(bin_costs_usd(assignment, billing, busy_override_s).sum())
