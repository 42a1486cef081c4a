"""Packing tasks onto machines (ALGORITHMS.md 4).

* :func:`workload_targets` - how much work each machine should get (thesis Eq. 5.4, 6.3);
* :func:`ffd_with_targets` - first-fit decreasing within the targets (Algorithm 7);
* :func:`fptas_assign` - subset-sum FPTAS per target (Algorithms 4, 6) then
  :func:`rearrange` to shed billing units (Algorithm 5);
* :func:`list_schedule`, :func:`list_eta` - the list-scheduling baselines (thesis 5.8.4);
* :mod:`.evaluate` - loads, busy times, makespan, billing units and cost of a packing.

Tasks are positions in an array of sizes (reference seconds); machines are :class:`Bin`.
"""

from .bins import UNASSIGNED, Assignment, Bin, efficiency_order
from .evaluate import bin_costs_usd, bin_loads_ref_s, billing_units, busy_s, cost_usd, makespan_s
from .ffd import ffd_with_targets
from .fptas import fptas_assign, subset_order
from .list_scheduling import ListSchedule, list_eta, list_schedule
from .rearrange import rearrange
from .subset_sum import approx_subset_sum, trim
from .targets import workload_targets

__all__ = [
    "UNASSIGNED", "Assignment", "Bin", "ListSchedule", "approx_subset_sum", "billing_units",
    "bin_costs_usd", "bin_loads_ref_s", "busy_s", "cost_usd", "efficiency_order",
    "ffd_with_targets", "fptas_assign", "list_eta", "list_schedule", "makespan_s", "rearrange",
    "subset_order", "trim", "workload_targets",
]
