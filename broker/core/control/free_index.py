"""The nodes with a free slot, indexed so a dispatch visits only those that can take work.

A free slot of an instance takes a task only if the task ends before the instance's
release: ``(release - now) * speed / fit_safety >= size``. While tasks are pending, most
free slots of a large fleet are ones whose paid time is too short for the smallest of them
(their instance goes at its release); a dispatch that looked at each of them on every
event cost O(free nodes) per event (100,000 tasks on 1,000 machines: half the run).

:class:`FreeIndex` keeps the free nodes' views grouped by speed, each group sorted by
release (latest first), so the nodes whose release is at least ``now + size * fit_safety /
speed`` are a prefix of each group: :meth:`candidates` returns them, plus every node
without a release (private nodes, instances with none scheduled), in O(candidates + speed
groups + log n). The ledger updates it with its free views as events arrive
(:meth:`~broker.core.control.ledger.snapshots.SnapshotMixin.snapshot`); the dispatch
(:func:`~broker.core.control.dispatch.dispatch`) applies its exact rules to the candidates
alone, and a snapshot without an index (or with a stale one) takes the full scan, which
decides the same (``tests/test_incremental.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort

from .snapshot import NodeView

_LAST = "\U0010ffff"  # sorts after every node id: a bisect key past all ids of one release


class FreeIndex:
    """Free nodes' views by speed, latest release first (see the module docstring)."""

    def __init__(self) -> None:
        self.version = 0  # bumped at every change: a snapshot checks it was built on this state
        self._views: dict[str, NodeView] = {}
        self._key: dict[str, tuple[float, float]] = {}  # node -> (speed, -release)
        self._groups: dict[float, list[tuple[float, str]]] = {}  # speed -> sorted (-release, node)
        self._open: dict[str, NodeView] = {}  # no release: always a candidate
        self._speeds: dict[float, int] = {}  # speed -> free nodes of it (fastest())

    def __len__(self) -> int:
        return len(self._views)

    def put(self, view: NodeView) -> None:
        """``view`` is the node's current view, and the node has a free slot."""
        old = self._views.get(view.id)
        if old is not None and old.speed == view.speed and old.release_at_s == view.release_at_s \
                and old.is_private == view.is_private:
            # Same place in the index (most updates: a task started or ended on a node
            # that stays free): only the view changes, not the groups.
            self.version += 1
            self._views[view.id] = view
            if view.id in self._open:
                self._open[view.id] = view
            return
        self.drop(view.id)
        self.version += 1
        self._views[view.id] = view
        self._speeds[view.speed] = self._speeds.get(view.speed, 0) + 1
        if view.release_at_s is None or view.is_private:
            self._open[view.id] = view
            return
        key = (view.speed, -view.release_at_s)
        self._key[view.id] = key
        insort(self._groups.setdefault(view.speed, []), (key[1], view.id))

    def drop(self, node_id: str) -> None:
        """The node has no free slot any more, or is gone."""
        view = self._views.pop(node_id, None)
        if view is None:
            return
        self.version += 1
        left = self._speeds[view.speed] - 1
        if left:
            self._speeds[view.speed] = left
        else:
            del self._speeds[view.speed]
        if self._open.pop(node_id, None) is not None:
            return
        speed, neg = self._key.pop(node_id)
        group = self._groups[speed]
        i = bisect_right(group, (neg, node_id)) - 1
        del group[i]
        if not group:
            del self._groups[speed]

    def fastest(self) -> float | None:
        """The highest speed of a free node, ready or not (None: no node is free)."""
        return max(self._speeds, default=None)

    def view(self, node_id: str) -> NodeView | None:
        return self._views.get(node_id)

    def candidates(self, now: float, size_x_safety: float) -> list[NodeView]:
        """Every free node whose release is at least ``now + size_x_safety / speed`` (up to
        rounding: a superset), and every free node without a release, in no set order."""
        out = list(self._open.values())
        views = self._views
        for speed, group in self._groups.items():
            bound = now + size_x_safety / speed if speed > 0 else math.inf
            bound -= 1e-6 * (1.0 + abs(bound)) if math.isfinite(bound) else 0.0
            k = bisect_right(group, (-bound, _LAST))
            out.extend(views[node_id] for _, node_id in group[:k])
        return out

    def slowest_ready_speed(self, now: float) -> float | None:
        """The lowest speed of a free node ready at ``now`` (None: none is)."""
        best = None
        for view in self._open.values():
            if view.ready(now) and (best is None or view.speed < best):
                best = view.speed
        for speed in sorted(self._groups):
            if best is not None and speed >= best:
                break
            if any(self._views[node_id].ready(now) for _, node_id in self._groups[speed]):
                return speed
        return best
