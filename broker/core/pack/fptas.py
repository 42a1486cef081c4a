"""Approximate task assignment by subset sums (thesis Algorithm 6, with Algorithms 4 and 5).

Input: task sizes ``pi = {p_1 .. p_n}`` (reference seconds), bins with workload targets
``x*_i`` (from :func:`~broker.core.pack.targets.workload_targets`, the thesis's Eq. 5.4) and an
accuracy ``eps`` in (0, 1). For the targets in descending order (ties: most cost-efficient
bin first), with ``pi'`` the tasks not yet placed:

    pi_i = approx_subset_sum(pi', x*_i, eps)     # sum(pi_i) <= x*_i, >= (1 - eps) max sum <= x*_i
    pi'  = pi' - pi_i

Each part is the subset of the tasks left at its turn whose sum is within ``1 - eps`` of the
best achievable without exceeding the target (:mod:`.subset_sum`). What no part took is then
offered first-fit decreasing to the room the parts left below their targets
(``place_leftovers``); tasks that fit nowhere are returned as unassigned, as in
:func:`~broker.core.pack.ffd.ffd_with_targets`. Finally tasks are rearranged between bins
(Algorithm 5, :mod:`.rearrange`) to shed billing units, never beyond a target.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..billing import Billing
from .bins import UNASSIGNED, Assignment, Bin, as_targets, as_task_sizes, efficiency_order
from .ffd import ffd_with_targets
from .rearrange import rearrange
from .subset_sum import approx_subset_sum


def subset_order(bins: Sequence[Bin], targets_ref_s: np.ndarray) -> np.ndarray:
    """The order bins receive their subsets: target descending, then efficiency descending."""
    by_efficiency = efficiency_order(bins)
    return by_efficiency[np.argsort(-targets_ref_s[by_efficiency], kind="stable")]


def fptas_assign(task_sizes_ref_s: Sequence[float] | np.ndarray, bins: Sequence[Bin],
                 targets_ref_s: Sequence[float] | np.ndarray, eps: float, *,
                 billing: Billing | None = Billing.hourly(),
                 place_leftovers: bool = True) -> Assignment:
    """Partition the tasks into per-bin subsets approximating the targets (Algorithm 6).

    ``billing`` is how the bins are charged, used to rearrange tasks afterwards (Algorithm 5);
    ``None`` skips the rearrangement. ``place_leftovers=False`` leaves the tasks no subset took
    unassigned instead of packing them first-fit into the room left below the targets.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    bins = tuple(bins)
    sizes = as_task_sizes(task_sizes_ref_s)
    targets = as_targets(targets_ref_s, bins)
    bin_of_task = np.full(sizes.shape, UNASSIGNED, dtype=np.int64)

    for i in subset_order(bins, targets).tolist():
        if targets[i] <= 0:
            break
        left = np.flatnonzero(bin_of_task == UNASSIGNED)
        _, chosen = approx_subset_sum(sizes[left], float(targets[i]), eps)
        bin_of_task[left[chosen]] = i

    if place_leftovers:
        left = np.flatnonzero(bin_of_task == UNASSIGNED)
        if left.size:
            placed_ref_s = Assignment(bins, sizes, bin_of_task.copy()).loads_ref_s
            room = np.maximum(targets - placed_ref_s, 0.0)
            extra = ffd_with_targets(sizes[left], bins, room).bin_of_task
            bin_of_task[left] = extra

    assignment = Assignment(bins, sizes, bin_of_task)
    if billing is not None:
        assignment = rearrange(assignment, billing, targets)
    return assignment
