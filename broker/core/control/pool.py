"""The pending tasks, ordered for the dispatch rules of ALGORITHMS.md 4.

Tasks either carry an estimate (reference seconds, from the bag's estimation tools) or do
not (non-clairvoyant: they are all "mean-sized" until they run). Two dispatch questions are
asked of the pool, both in O(log n):

- *largest that fits*: the pending task with the largest estimate not above a limit (the
  work a slot can still do before its instance's release);
- *uniform draw*: a task chosen uniformly at random (sampling phase).

The pool is owned and mutated by a shell (simulator or live daemon); the controller only
reads it and keeps the tasks it has already picked in the current decision aside (the
``taken`` set, which only grows during a decision). A decision that hands out k tasks would
scan past the ones it took before at every pick (k^2 / 2 steps: 500 picks in one turn at
1,000 nodes, 125,000 steps); the pool remembers, for the ``taken`` set it was last asked
with, jumps over the runs of taken tasks it has already seen (path-compressed), so each pick
costs about O(log n). A mutation of the pool, or another ``taken`` set, forgets them.
"""

from __future__ import annotations

import bisect
import math
from typing import Iterable


class TaskPool:
    def __init__(self) -> None:
        self._known: list[tuple[float, str]] = []  # sorted by (estimate, id)
        self._known_est: dict[str, float] = {}
        self._unknown: list[str] = []  # stack; order fixed by the shell (shuffled for fairness)
        self._unknown_pos: dict[str, int] = {}
        self._known_total = 0.0
        self._forget()

    def _forget(self) -> None:
        """Drop the jumps over taken tasks (the pool changed, or another ``taken`` set came)."""
        self._memo_taken: object = None
        self._down_known: dict[int, int] = {}  # i -> j < i: every known task in (j, i] is taken
        self._up_known: dict[int, int] = {}  # i -> j > i: every known task in [i, j) is taken
        self._down_unknown: dict[int, int] = {}  # the same over the stack of tasks without one

    def _jumps(self, taken) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:  # noqa: ANN001
        if self._memo_taken is not taken:
            self._forget()
            self._memo_taken = taken  # held: its id cannot be reused while the jumps are kept
        return self._down_known, self._up_known, self._down_unknown

    # -- mutation (shells only) ------------------------------------------------------------
    def add(self, task_id: str, estimate_ref_s: float | None = None, *, last: bool = False) -> None:
        """Add a pending task. ``last``: a retry, to be taken after the tasks already waiting
        (only for tasks without an estimate; the ones with an estimate keep their size order).
        Otherwise the slot a task just failed on would take it straight back."""
        if task_id in self:
            raise ValueError(f"task {task_id} is already pending")
        self._forget()
        if estimate_ref_s is None:
            if last and self._unknown:
                # the stack is taken from its end: the retry goes to the bottom, in O(1), by
                # moving the task that was there to the top
                bottom = self._unknown[0]
                self._unknown_pos[bottom] = len(self._unknown)
                self._unknown.append(bottom)
                self._unknown[0] = task_id
                self._unknown_pos[task_id] = 0
                return
            self._unknown_pos[task_id] = len(self._unknown)
            self._unknown.append(task_id)
        else:
            est = float(estimate_ref_s)
            bisect.insort(self._known, (est, task_id))
            self._known_est[task_id] = est
            self._known_total += est

    def extend(self, items: Iterable[tuple[str, float | None]]) -> None:
        items = list(items)
        self._forget()
        known = [(float(e), t) for t, e in items if e is not None]
        if known and not self._known and len(known) == len(items):
            known.sort()
            self._known = known
            self._known_est = {t: e for e, t in known}
            self._known_total = sum(e for e, _ in known)
            return
        for task_id, est in items:
            self.add(task_id, est)

    def remove(self, task_id: str) -> None:
        self._forget()
        est = self._known_est.pop(task_id, None)
        if est is not None:
            i = bisect.bisect_left(self._known, (est, task_id))
            del self._known[i]
            self._known_total -= est
            if not self._known_est:
                self._known_total = 0.0
            return
        pos = self._unknown_pos.pop(task_id)  # KeyError: not pending
        last = self._unknown.pop()
        if last != task_id:
            self._unknown[pos] = last
            self._unknown_pos[last] = pos

    # -- queries (controller) -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._known) + len(self._unknown)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._known_est or task_id in self._unknown_pos

    @property
    def unknown_count(self) -> int:
        return len(self._unknown)

    @property
    def known_total_ref_s(self) -> float:
        return self._known_total

    def task_ids(self):
        """Every pending task id (read-only): those with estimates by estimate ascending, then
        the others in the order they would be taken."""
        for _, tid in self._known:
            yield tid
        yield from reversed(self._unknown)

    def smallest_estimates_ref_s(self, k: int) -> list[float]:
        """The ``k`` smallest estimates of pending tasks (fewer when fewer have one)."""
        return [e for e, _ in self._known[:max(k, 0)]]
    def known_estimates_ref_s(self) -> list[float]:
        """The estimates of the pending tasks that have one, ascending."""
        return [est for est, _ in self._known]

    def estimate(self, task_id: str) -> float | None:
        return self._known_est.get(task_id)

    def smallest_size(self, mean_ref_s: float) -> float:
        """A lower bound on any pending task's size (tasks without an estimate count as
        ``mean_ref_s``; inf when none is pending): a slot whose limit is below it takes none."""
        least = self._known[0][0] if self._known else math.inf
        return min(least, mean_ref_s) if self._unknown else least

    def largest_fitting(
        self, limit_ref_s: float, mean_ref_s: float, taken: set[str] | frozenset[str] = frozenset()
    ) -> tuple[str, float] | None:
        """The largest-estimate pending task whose estimate is <= ``limit_ref_s``.

        Tasks without an estimate count as ``mean_ref_s``. Returns (task id, estimate).
        """
        if self._memo_taken is not taken:
            self._jumps(taken)
        best: tuple[str, float] | None = None
        if self._known:
            i = bisect.bisect_right(self._known, (limit_ref_s, "\U0010ffff")) - 1
            i = _free_below(self._known, i, taken, self._down_known, True)
            if i >= 0:
                est, tid = self._known[i]
                best = (tid, est)
        if self._unknown and mean_ref_s <= limit_ref_s and (best is None or mean_ref_s >= best[1]):
            j = len(self._unknown) - 1
            if self._unknown[j] in taken or j in self._down_unknown:
                j = _free_below(self._unknown, j, taken, self._down_unknown, False)
            if j >= 0:
                return (self._unknown[j], mean_ref_s)
        return best

    def take_largest(self, limit_ref_s: float, mean_ref_s: float, taken: set[str], k: int) -> list[tuple[str, float]]:
        """Up to ``k`` picks, each the one :meth:`largest_fitting` would return with the picks
        before it added to ``taken`` (this adds them): one call for a node's free slots, which
        share one limit, instead of one a slot (a 500-task decision makes 500 picks)."""
        if self._memo_taken is not taken:
            self._jumps(taken)
        known, unknown, out = self._known, self._unknown, []
        i = bisect.bisect_right(known, (limit_ref_s, "\U0010ffff")) - 1 if known else -1
        j = len(unknown) - 1 if unknown and mean_ref_s <= limit_ref_s else -1
        while len(out) < k:
            if i >= 0:
                i = _free_below(known, i, taken, self._down_known, True)
            if j >= 0 and (unknown[j] in taken or j in self._down_unknown):
                j = _free_below(unknown, j, taken, self._down_unknown, False)
            if j >= 0 and (i < 0 or mean_ref_s >= known[i][0]):
                tid, est, j = unknown[j], mean_ref_s, j - 1
            elif i >= 0:
                (est, tid), i = known[i], i - 1
            else:
                break
            taken.add(tid)
            out.append((tid, est))
        return out

    def smallest(self, mean_ref_s: float, taken: set[str] | frozenset[str] = frozenset()) -> tuple[str, float] | None:
        _, up_known, down_unknown = self._jumps(taken)
        i = _free_above(self._known, 0, taken, up_known)
        if i < len(self._known):
            est, tid = self._known[i]
            if not (self._unknown and mean_ref_s < est):
                return (tid, est)
        j = _free_below(self._unknown, len(self._unknown) - 1, taken, down_unknown, False)
        return None if j < 0 else (self._unknown[j], mean_ref_s)

    def draw(self, rng, taken: set[str] | frozenset[str] = frozenset()) -> str | None:
        """A pending task chosen uniformly at random (``rng``: numpy Generator or random.Random)."""
        n = len(self)
        if n <= len(taken):
            return None
        for _ in range(64):
            k = int(rng.integers(n)) if hasattr(rng, "integers") else rng.randrange(n)
            tid = self._known[k][1] if k < len(self._known) else self._unknown[k - len(self._known)]
            if tid not in taken:
                return tid
        for _, tid in self._known:
            if tid not in taken:
                return tid
        for tid in self._unknown:
            if tid not in taken:
                return tid
        return None


def _free_below(items: list, i: int, taken, jumps: dict[int, int], keyed: bool) -> int:  # noqa: ANN001
    """The highest index <= ``i`` whose task is not in ``taken`` (-1: none), following and
    recording ``jumps`` over taken runs (``keyed``: items are (estimate, id) pairs). Sound
    because ``taken`` only grows while the jumps are kept: a run taken once stays taken."""
    path = []
    while i >= 0:
        j = jumps.get(i)
        if j is not None:
            path.append(i)
            i = j
            continue
        if (items[i][1] if keyed else items[i]) not in taken:
            break
        path.append(i)
        i -= 1
    for p in path:
        jumps[p] = i
    return i


def _free_above(items: list, i: int, taken, jumps: dict[int, int]) -> int:  # noqa: ANN001
    """The lowest index >= ``i`` of an (estimate, id) whose id is not in ``taken``
    (``len(items)``: none); see :func:`_free_below`."""
    n = len(items)
    path = []
    while i < n:
        j = jumps.get(i)
        if j is not None:
            path.append(i)
            i = j
            continue
        if items[i][1] not in taken:
            break
        path.append(i)
        i += 1
    for p in path:
        jumps[p] = i
    return i
