"""List scheduling baselines: ``list_schedule`` on all machines and ``List_eta`` (thesis 5.8.4).

List scheduling takes the tasks in a fixed order and gives each to the slot that becomes free
first; task j on a slot of speed ``s`` runs ``p_j / s`` seconds. Slots free at the same moment
are taken in cost-efficiency order (most efficient machine first, then slot number), so the
schedule is deterministic. The order is the caller's, or longest first (LPT) on request.

``List_eta`` is the thesis's budget-aware extension: sort the m machines by cost efficiency
``s_i / c_i`` descending and list-schedule on the first ``eta`` only (``1 <= eta <= m``).

On ``q`` identical slots of speed 1, any list schedule has makespan at most
``sum_j p_j / q + (1 - 1/q) max_j p_j`` (Graham 1966), the bound the tests check.

Unlike the fluid busy time of :mod:`.evaluate`, ``finish_s`` here is the real slot-level end
of each machine's last task; pass it as ``busy_override_s`` to score the schedule's cost.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .bins import UNASSIGNED, Assignment, Bin, as_task_sizes, efficiency_order


@dataclass(frozen=True, slots=True, eq=False)
class ListSchedule:
    """Which machine runs each task, when it starts, and when each machine finishes."""

    assignment: Assignment
    start_s: np.ndarray   # per task: wall time its run begins (0 = when the schedule starts)
    finish_s: np.ndarray  # per bin: end of its last task; 0 for a bin that got none

    @property
    def makespan_s(self) -> float:
        return float(self.finish_s.max()) if self.finish_s.size else 0.0


def _schedule_on(sizes: np.ndarray, bins: tuple[Bin, ...], chosen: np.ndarray,
                 longest_first: bool) -> ListSchedule:
    """List-schedule ``sizes`` on the bins ``chosen`` (indices, most efficient first)."""
    if sizes.size and not chosen.size:
        raise ValueError("list scheduling needs at least one machine for a non-empty bag")
    # Heap of (free at, rank in efficiency order, slot): the earliest-free slot on top.
    free_slots = [(0.0, rank, slot) for rank, i in enumerate(chosen.tolist())
                  for slot in range(bins[i].slots)]
    heapq.heapify(free_slots)
    speeds = [bins[i].speed for i in chosen.tolist()]
    order = np.argsort(-sizes, kind="stable") if longest_first else np.arange(sizes.size)
    rank_of_task = np.empty(sizes.size, dtype=np.int64)
    start_s = np.empty(sizes.size, dtype=float)
    finish_by_rank = [0.0] * chosen.size
    for j, size in zip(order.tolist(), sizes[order].tolist()):
        free_at_s, rank, slot = free_slots[0]
        end_s = free_at_s + size / speeds[rank]
        heapq.heapreplace(free_slots, (end_s, rank, slot))
        rank_of_task[j] = rank
        start_s[j] = free_at_s
        if end_s > finish_by_rank[rank]:
            finish_by_rank[rank] = end_s
    bin_of_task = chosen[rank_of_task] if sizes.size else np.full(0, UNASSIGNED, dtype=np.int64)
    finish_s = np.zeros(len(bins), dtype=float)
    finish_s[chosen] = finish_by_rank
    start_s.flags.writeable = False
    finish_s.flags.writeable = False
    return ListSchedule(Assignment(bins, sizes, bin_of_task.astype(np.int64)), start_s, finish_s)


def list_schedule(task_sizes_ref_s: Sequence[float] | np.ndarray, bins: Sequence[Bin],
                  *, longest_first: bool = False) -> ListSchedule:
    """List scheduling on every machine (the budget-oblivious baseline)."""
    bins = tuple(bins)
    return _schedule_on(as_task_sizes(task_sizes_ref_s), bins, efficiency_order(bins), longest_first)


def list_eta(task_sizes_ref_s: Sequence[float] | np.ndarray, bins: Sequence[Bin], eta: int,
             *, longest_first: bool = False) -> ListSchedule:
    """``List_eta``: list scheduling on the ``eta`` most cost-efficient machines only."""
    bins = tuple(bins)
    if not 1 <= eta <= len(bins):
        raise ValueError(f"eta must be between 1 and the number of machines ({len(bins)}), got {eta!r}")
    return _schedule_on(as_task_sizes(task_sizes_ref_s), bins, efficiency_order(bins)[:eta], longest_first)
