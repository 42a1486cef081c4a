"""The fluid lower bound on cost (ALGORITHMS.md 3.6).

Work splits continuously, nothing is rounded to billing units and nothing boots: resource j
offers rate_j x T reference seconds (a type: L_i k_i s_i T; a private node: k_v s_v T) at
price_j / (3600 rate_j) USD per reference second. The cheapest way to do W by T fills the
cheapest capacity first:

    LB(T) = sum over resources by USD per ref-s ascending of  usd_per_ref_s_j x min(cap_j, W left)

and is +inf when all capacity together is less than W. Every plan of ``min_cost`` costs at
least this much; "gap to bound" and farness figures are measured against it.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..model import MachineType, PrivateNode
from .types import Work


def fluid_lower_bound(
    types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work, deadline_s: float
) -> float:
    """Least USD any plan could spend to finish ``work`` within ``deadline_s`` (+inf if impossible)."""
    offers = [(t.price_per_hour / 3600.0 / t.capacity_per_s, t.limit * t.capacity_per_s * deadline_s)
              for t in types if t.capacity_per_s > 0 and t.limit > 0]
    offers += [(v.cost_per_hour / 3600.0 / v.capacity_per_s, v.capacity_per_s * deadline_s)
               for v in private if v.capacity_per_s > 0]
    left = work.total_ref_s
    cost_usd = 0.0
    for usd_per_ref_s, capacity_ref_s in sorted(offers):
        if left <= 0:
            break
        used = min(left, capacity_ref_s)
        cost_usd += used * usd_per_ref_s
        left -= used
    return cost_usd if left <= work.total_ref_s * 1e-12 else math.inf
