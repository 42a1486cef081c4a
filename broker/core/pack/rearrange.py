"""Rearranging tasks between machines to shed billing units (thesis Algorithm 5).

A packing that follows workload targets leaves each machine's last billing unit partly
used. For a public bin ``i`` with load ``rho_i``, capacity ``a_i``, busy time
``b_i = rho_i / a_i`` and billed time ``B_i = max(m, beta ceil(b_i / beta))``:

* ``u_i = min(limit_i, a_i B_i) - rho_i`` is work it can still take without a new unit
  (the thesis's ``u_i``), capped by its limit (its target, so the plan's horizon holds);
* ``l_i = rho_i - a_i (B_i - beta)`` is work it must give away to drop one unit (the thesis's
  ``l_i``); when ``B_i - beta`` is below the minimum billed time, it must give away all of it.

Each round looks at every donor ``j`` still in play, moves tasks of ``j`` (largest first,
each to the first bin in efficiency order with room ``u_i``) until ``l_j`` has left, and
prices the result; the move that lowers the total cost most is applied, and ``j`` leaves
play, neither giving nor taking work again (the thesis's exclusion set ``S``, Lemma 5.1).
Rounds stop when no move lowers the cost, so there is at most one round per bin.

Invariants, by construction: a receiving public bin stays within its billed time, so no bin
ever gains a billing unit; every applied move strictly lowers the total cost; every task
stays on exactly one bin. Private bins (prorated, no units) may receive work within their
limit when the unit saved elsewhere is worth more than their prorated cost.

This is Algorithm 5 at the level of individual tasks: the thesis moves counts of unit-length
tasks between machine types; here real tasks move between real machines.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..billing import Billing
from .bins import Assignment, Bin, efficiency_order


def _bin_cost_usd(b: Bin, load_ref_s: float, billing: Billing) -> float:
    if load_ref_s <= 0:
        return 0.0
    busy_s = load_ref_s / b.capacity_per_s
    if b.private:
        return busy_s / 3600.0 * b.price_per_hour
    return billing.cost_usd(busy_s, b.price_per_hour)


def _room_ref_s(b: Bin, load_ref_s: float, limit_ref_s: float, billing: Billing) -> float:
    """Work bin ``b`` can take without a new billing unit and within its limit."""
    if b.private:
        return max(0.0, limit_ref_s - load_ref_s)
    if load_ref_s <= 0:
        return 0.0  # renting an idle machine would start a unit
    paid_ref_s = billing.billed_s(load_ref_s / b.capacity_per_s) * b.capacity_per_s
    return max(0.0, min(limit_ref_s, paid_ref_s) - load_ref_s)


def _shed_ref_s(b: Bin, load_ref_s: float, billing: Billing) -> float:
    """Work public bin ``b`` must give away to be charged one unit less (all of it at the minimum)."""
    billed_s = billing.billed_s(load_ref_s / b.capacity_per_s)
    keep_s = billed_s - billing.unit_s
    if keep_s < max(billing.minimum_s, billing.unit_s) - 1e-9:
        return load_ref_s
    return load_ref_s - keep_s * b.capacity_per_s


def rearrange(assignment: Assignment, billing: Billing,
              limits_ref_s: Sequence[float] | np.ndarray | None = None) -> Assignment:
    """Move tasks between bins so the total cost drops and no bin gains a billing unit.

    ``limits_ref_s`` caps each bin's load (default: ``horizon_s * capacity_per_s``); a bin
    already above its limit never receives. Unassigned tasks stay unassigned.
    """
    bins = assignment.bins
    if limits_ref_s is None:
        limits = [b.horizon_s * b.capacity_per_s for b in bins]
    else:
        limits = np.array(limits_ref_s, dtype=float).reshape(-1).tolist()
        if len(limits) != len(bins):
            raise ValueError(f"{len(limits)} limits given for {len(bins)} bins: give one per bin")
    sizes = assignment.sizes_ref_s
    bin_of_task = assignment.bin_of_task.copy()
    parts = assignment.parts()
    loads = assignment.loads_ref_s.tolist()
    in_play = [True] * len(bins)
    by_efficiency = efficiency_order(bins).tolist()

    while True:
        room = [_room_ref_s(b, load, limit, billing) if playing else 0.0
                for b, load, limit, playing in zip(bins, loads, limits, in_play)]
        total_room_ref_s = math.fsum(room)
        best_saving_usd, best_moves, best_donor = 0.0, [], -1
        for donor in by_efficiency:
            if not in_play[donor] or bins[donor].private or loads[donor] <= 0:
                continue
            need_ref_s = _shed_ref_s(bins[donor], loads[donor], billing)
            if total_room_ref_s - room[donor] < need_ref_s:
                continue
            moves, saving_usd = _plan_shedding(donor, need_ref_s, parts[donor], sizes, bins,
                                               loads, room, by_efficiency, billing)
            if saving_usd > best_saving_usd + 1e-12:
                best_saving_usd, best_moves, best_donor = saving_usd, moves, donor
        if best_donor < 0:
            break
        moved = np.array([task for task, _ in best_moves], dtype=np.int64)
        for task, receiver in best_moves:
            bin_of_task[task] = receiver
            loads[receiver] += sizes[task]
            parts[receiver] = np.append(parts[receiver], task)
        parts[best_donor] = np.setdiff1d(parts[best_donor], moved, assume_unique=True)
        loads[best_donor] = float(sizes[parts[best_donor]].sum())
        in_play[best_donor] = False
    return Assignment(bins, sizes, bin_of_task)


def _plan_shedding(donor: int, need_ref_s: float, donor_tasks: np.ndarray, sizes: np.ndarray,
                   bins: tuple[Bin, ...], loads: list[float], room: list[float],
                   by_efficiency: list[int], billing: Billing) -> tuple[list[tuple[int, int]], float]:
    """Tasks of ``donor`` to move, as (task, receiver), so it sheds ``need_ref_s``; and the USD saved."""
    receivers = [i for i in by_efficiency if i != donor and room[i] > 0]
    room_left = {i: room[i] for i in receivers}
    added = dict.fromkeys(receivers, 0.0)
    tasks = donor_tasks[np.argsort(-sizes[donor_tasks], kind="stable")]
    task_sizes = sizes[tasks].tolist()
    left_to_try_ref_s = math.fsum(task_sizes)
    moves: list[tuple[int, int]] = []
    moved_ref_s = 0.0
    for task, size in zip(tasks.tolist(), task_sizes):
        if moved_ref_s >= need_ref_s or moved_ref_s + left_to_try_ref_s < need_ref_s:
            break
        left_to_try_ref_s -= size
        for i in receivers:
            if room_left[i] >= size:
                room_left[i] -= size
                added[i] += size
                moves.append((task, i))
                moved_ref_s += size
                break
    if moved_ref_s < need_ref_s:
        return [], 0.0
    touched = [i for i in receivers if added[i] > 0]
    before_usd = _bin_cost_usd(bins[donor], loads[donor], billing) + math.fsum(
        _bin_cost_usd(bins[i], loads[i], billing) for i in touched)
    donor_left_ref_s = 0.0 if len(moves) == len(tasks) else loads[donor] - moved_ref_s
    after_usd = _bin_cost_usd(bins[donor], donor_left_ref_s, billing) + math.fsum(
        _bin_cost_usd(bins[i], loads[i] + added[i], billing) for i in touched)
    return moves, before_usd - after_usd
