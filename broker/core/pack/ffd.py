"""First-fit decreasing with workload targets (thesis Algorithm 7; Algorithms 2, 3 of Ch. 4).

Tasks are taken by size descending; each goes to the first bin, in cost-efficiency order,
whose load plus the task stays within the bin's target:

    for j in tasks by p_j descending:
        i = min { i in efficiency order : rho_i + p_j <= w_i }
        rho_i += p_j

A task no bin can take is reported in ``Assignment.unassigned`` rather than forced onto the
least-loaded bin: overfilling a bin would silently break the horizon the targets encode,
whereas the caller can see the shortfall and extend the plan, or leave those tasks to
pull dispatch. Ties between equal sizes keep the input order; ties between equally efficient
bins keep the bin order, so the result is deterministic.

With every bin of one size ``C`` (equal targets), this is classical FFD bin packing, for which
the number of bins used satisfies ``FFD(I) <= 11/9 OPT(I) + 6/9`` (Dosa 2007; Johnson's
``11/9 OPT + 4`` of 1973 is the bound the thesis cites).

Finding "the first bin that fits" is a descent in a max segment tree over the bins' residual
targets (left child first when it can hold the task), so each task costs O(log m) and the
whole packing O(n log n + n log m) instead of the O(n m) of the printed double loop.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .bins import UNASSIGNED, Assignment, Bin, as_targets, as_task_sizes, efficiency_order

# A task fits when it exceeds the residual target by at most this much work: absorbs the
# rounding of repeated subtraction, so a task that fits exactly is never refused.
FIT_SLACK_REF_S = 1e-9


def ffd_with_targets(task_sizes_ref_s: Sequence[float] | np.ndarray, bins: Sequence[Bin],
                     targets_ref_s: Sequence[float] | np.ndarray) -> Assignment:
    """Pack tasks into ``bins`` first-fit decreasing, never past a bin's target."""
    bins = tuple(bins)
    sizes = as_task_sizes(task_sizes_ref_s)
    targets = as_targets(targets_ref_s, bins)
    bin_of_task = np.full(sizes.shape, UNASSIGNED, dtype=np.int64)
    if not bins or sizes.size == 0:
        return Assignment(bins, sizes, bin_of_task)

    bin_at_leaf = efficiency_order(bins)
    leaves = 1 << (len(bins) - 1).bit_length()
    residual = [-np.inf] * (2 * leaves)  # max of the residual targets below each node
    residual[leaves:leaves + len(bins)] = targets[bin_at_leaf].tolist()
    for node in range(leaves - 1, 0, -1):
        residual[node] = max(residual[2 * node], residual[2 * node + 1])

    task_order = np.argsort(-sizes, kind="stable")
    leaf_of_task = [UNASSIGNED] * sizes.size
    for rank, size in enumerate(sizes[task_order].tolist()):
        need = size - FIT_SLACK_REF_S
        if residual[1] < need:
            continue  # no bin can take it, nor any later (smaller tasks still might: go on)
        node = 1
        while node < leaves:
            node = 2 * node if residual[2 * node] >= need else 2 * node + 1
        leaf_of_task[rank] = node - leaves
        residual[node] -= size
        node >>= 1
        while node:
            best = max(residual[2 * node], residual[2 * node + 1])
            if residual[node] == best:
                break
            residual[node] = best
            node >>= 1

    leaf = np.array(leaf_of_task, dtype=np.int64)
    placed = leaf != UNASSIGNED
    bin_of_task[task_order[placed]] = bin_at_leaf[leaf[placed]]
    return Assignment(bins, sizes, bin_of_task)
