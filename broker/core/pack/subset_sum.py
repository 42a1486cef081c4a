"""Approximate subset sum with trimming, keeping the subset (thesis Algorithms 4 and 6, inner loop).

Problem: given sizes ``p_1 .. p_n >= 0`` and a target ``t``, find ``S`` maximising
``sum_{j in S} p_j`` subject to ``sum_{j in S} p_j <= t``; write ``y*`` for the optimum.

Algorithm (Cormen et al. 35.5; the thesis's Algorithm 6 inner loop): keep a sorted list
``L_j`` of reachable sums of the first ``j`` items, ``L_0 = <0>``,

    L_j = Trim(Merge(L_(j-1), L_(j-1) + p_j), delta) without the sums above t,
    delta = eps / (2 n)

and return the largest element of ``L_n``. Trimming by ``delta`` drops elements that a kept
element approximates from below: every dropped ``y`` has a kept ``z`` with
``(1 - delta) y <= z <= y``. Each merge-and-trim loses at most a factor ``1 - delta``, so the
answer ``z*`` satisfies ``z* >= (1 - delta)^n y* >= (1 - eps/2) y* >= (1 - eps) y*``, while each
list holds at most ``ln(t / p_min) / delta + 2`` elements: polynomial in ``n`` and ``1/eps``.

Choices made here, each keeping that guarantee:

* The thesis's Algorithm 4 walks the list keeping ``z_i`` when ``z_i > last / (1 - delta)``. We
  keep the smallest element of each geometric cell ``[g^k, g^(k+1))``, ``g = 1 / (1 - delta)``:
  two elements of one cell are within the factor, so the trimming property above holds; the
  list is at most twice as long as Algorithm 4's; and the trim is one vectorised pass.
* Sums above ``t`` are dropped (the thesis keeps up to ``t / (1 - delta)``): a target is a
  machine's capacity up to a deadline, so it is never overshot.
* Any subset with sum ``>= (1 - eps/2) t`` already meets the bound the full run proves,
  since ``y* <= t``. So first try largest-first fit (take each item, largest first, if it
  still fits): it reaches that whenever the items are small next to ``t``, which is when the
  lists would be longest. Otherwise the lists run with items largest first, and stop as soon
  as they hold a sum ``>= (1 - delta) t``, as close to ``t`` as the trimming can tell apart.
  On 3,000 LM-like tasks a target whose subset needs hundreds of tasks took 5-15 s with the
  lists alone and ~100 s without stopping early; with both shortcuts the whole assignment of
  100 targets takes about 0.1 s. The full run, still polynomial, remains the worst case.
* Items larger than ``t`` cannot be in any feasible subset and are left out, so ``n`` counts
  only the items ``<= t``.

Every list element remembers its parent in the previous list and whether item ``j`` was
added, so the chosen subset is recovered by walking back from the best sum.
"""

from __future__ import annotations

import math

import numpy as np


def trim(sorted_sums: np.ndarray, delta: float) -> np.ndarray:
    """Indices of the elements to keep from an ascending list, trimmed by ``delta``.

    Keeps the first element of every geometric cell ``[g^k, g^(k+1))``, ``g = 1/(1-delta)``,
    and the zero sum if present: each dropped ``y`` has a kept ``z`` with
    ``(1 - delta) y <= z <= y``.
    """
    if not 0 < delta < 1:
        raise ValueError(f"trimming factor must lie in (0, 1), got {delta!r}")
    if sorted_sums.size == 0:
        return np.zeros(0, dtype=np.int64)
    cell_width = -math.log1p(-delta)  # log g
    with np.errstate(divide="ignore"):
        cells = np.floor(np.log(sorted_sums) / cell_width)  # -inf for the zero sum
    first_of_cell = np.empty(sorted_sums.size, dtype=bool)
    first_of_cell[0] = True
    np.not_equal(cells[1:], cells[:-1], out=first_of_cell[1:])
    return np.flatnonzero(first_of_cell)


def _largest_first_fit(descending_sizes: np.ndarray, target: float) -> tuple[float, np.ndarray]:
    """Take items largest first whenever they still fit: the sum and the positions taken."""
    ascending = descending_sizes[::-1]
    n = ascending.size
    taken = []
    total = 0.0
    upper = n  # items at ascending positions >= upper were already taken or skipped
    while upper > 0:
        fit = int(np.searchsorted(ascending[:upper], target - total, side="right"))
        if fit == 0:
            break
        taken.append(n - fit)  # the largest item left that fits, as a descending position
        total += float(ascending[fit - 1])
        upper = fit - 1
    return total, np.array(taken, dtype=np.int64)


def approx_subset_sum(sizes: np.ndarray, target: float, eps: float) -> tuple[float, np.ndarray]:
    """A subset of ``sizes`` whose sum is ``<= target`` and ``>= (1 - eps)`` of the best such sum.

    Returns ``(sum, indices)``, the indices into ``sizes`` in increasing order.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    sizes = np.asarray(sizes, dtype=float)
    candidates = np.flatnonzero(sizes <= target)
    candidates = candidates[np.argsort(-sizes[candidates], kind="stable")]
    if target <= 0 or candidates.size == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    delta = eps / (2 * candidates.size)
    greedy_sum, greedy_steps = _largest_first_fit(sizes[candidates], target)
    if greedy_sum >= (1 - eps / 2) * target:
        return greedy_sum, np.sort(candidates[greedy_steps])
    good_enough = (1 - delta) * target

    sums = np.zeros(1)
    origins: list[np.ndarray] = []  # per step: 2 * parent index + (1 if the item was added)
    for size in sizes[candidates].tolist():
        merged = np.concatenate((sums, sums + size))
        parents = np.arange(sums.size, dtype=np.int64)
        codes = np.concatenate((2 * parents, 2 * parents + 1))
        order = np.argsort(merged, kind="stable")  # two sorted runs: a linear merge
        order = order[:np.searchsorted(merged[order], target, side="right")]
        kept = order[trim(merged[order], delta)]
        sums = merged[kept]
        origins.append(codes[kept])
        if sums[-1] >= good_enough:
            break

    chosen = []
    position = sums.size - 1  # the largest kept sum: all are <= target
    for step in range(len(origins) - 1, -1, -1):
        code = int(origins[step][position])
        if code & 1:
            chosen.append(candidates[step])
        position = code >> 1
    indices = np.sort(np.array(chosen, dtype=np.int64))
    return float(sums[-1]), indices
