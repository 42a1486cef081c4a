"""The ledger's money and its snapshot: billing refreshed from a heap of paid-until times,
committed spend as a running sum, and the frozen view ``decide()`` reads, rebuilt only for
the nodes an event touched, with the free nodes also kept by speed and release
(:class:`~broker.core.control.free_index.FreeIndex`, so a dispatch visits only those that
can take a task) (part of :class:`~.ledger.Ledger`; its state is the ledger's)."""

from __future__ import annotations

import heapq
import math
from typing import Mapping

from ...model import MachineType
from ..snapshot import NodeView, RunningTask, Snapshot
from ..free_index import FreeIndex
from .records import LATE_READY_S, Attempt, NodeRecord


class SnapshotMixin:
    # -- money -------------------------------------------------------------------------------
    def _refresh_billing(self, node: NodeRecord, now: float) -> None:
        if node.type is not None and node.terminated_at_s is None and now > node.paid_until_s + 1e-6:
            b = node.type.billing
            node.paid_until_s = b.paid_until(node.launched_at_s, max(now, node.launched_at_s))
            charged = b.cost_usd(max(0.0, now - node.launched_at_s), node.type.price_per_hour)
            self._live_usd += charged - node.charged_usd
            node.charged_usd = charged
            self._touch(node)
            heapq.heappush(self._billing, (node.paid_until_s, node.id))

    def _advance_billing(self, now: float) -> None:
        """Charge the next unit of every instance whose paid time the clock has passed."""
        h = self._billing
        while h and h[0][0] + 1e-6 < now:
            _, node_id = heapq.heappop(h)
            node = self.nodes.get(node_id)  # None: a launch in flight's placeholder, voided (inflight.py)
            if node is not None:
                self._refresh_billing(node, now)

    def committed_usd(self, now: float) -> float:
        """Cloud spend charged so far: every instance's billing units up to ``now``."""
        self._advance_billing(now)
        return self._closed_usd + self._live_usd


    # -- the snapshot ------------------------------------------------------------------------
    def _init_views(self) -> None:
        # Dicts used as ordered sets: the snapshot's node order must not depend on string
        # hashing (a replay in another process must see the same order).
        self._late: dict[str, None] = {}  # not ready past their boot delay (view depends on now)
        self._dirty: dict[str, None] = {}
        self._views = _Views()  # every live node's view, in the order nodes first appeared
        self._free: dict[str, NodeView] = {}
        self._free_index = FreeIndex()  # the same free views, by speed and release (free_index.py)
        self.free_index_on = True  # False: the snapshot carries no index, dispatch scans every free node
        self._running_speeds: dict[float, int] = {}  # speed -> attempts running on nodes of it
        self.latest_start_s = -math.inf  # the latest start of an attempt (running or not)

    def _count_running(self, node: NodeRecord, a: Attempt, step: int) -> None:
        """An attempt started (``step`` 1) or ended (-1) on ``node``: the snapshot's
        ``slowest_running_speed`` and ``latest_start_s`` follow in O(1), and the attempt's
        :class:`RunningTask` is made once, not at every rebuild of its node's view."""
        if step > 0:
            node.running_views[a.slot] = RunningTask(a.task_id, a.attempt, a.slot, a.started_at_s,
                                                     self.estimates.get(a.task_id), a.slot >= node.slots)
        else:
            del node.running_views[a.slot]
        left = self._running_speeds.get(node.speed, 0) + step
        if left:
            self._running_speeds[node.speed] = left
        else:
            del self._running_speeds[node.speed]
        if step > 0 and a.started_at_s > self.latest_start_s:
            self.latest_start_s = a.started_at_s

    def _touch(self, node: NodeRecord) -> None:
        node.view = None
        self._dirty[node.id] = None

    def _view(self, node: NodeRecord, now: float) -> NodeView:
        if node.view is not None:
            return node.view
        views = node.running_views
        running = tuple(views[slot] for slot in sorted(views)) if len(views) > 1 else tuple(views.values())
        if node.ready_at_s is not None:
            ready = None if node.type is None else node.ready_at_s
        elif node.expected_ready_s is not None and node.expected_ready_s > now:
            ready = node.expected_ready_s
        else:
            ready = now + LATE_READY_S  # overdue: nothing is dispatched to it yet
        # Positional, in NodeView's field order: a frozen dataclass takes keywords at about
        # 1.5x the cost, and a 1,000-agent turn rebuilds hundreds of views.
        private = node.type is None
        view = NodeView(node.id, node.slots, node.speed, running, None if private else node.type.name,
                        node.launched_at_s, ready, None if private else node.paid_until_s, node.release_at_s,
                        node.lost or node.down)
        if node.id not in self._late:
            node.view = view
        return view

    def snapshot(self, now: float, *, stopping: bool = False) -> Snapshot:
        """The frozen view ``decide()`` reads (the pool is shared, not copied: the controller
        only reads it)."""
        self._advance_billing(now)
        while self._booting and self._booting[0][0] <= now:
            _, node_id = heapq.heappop(self._booting)
            node = self.nodes.get(node_id)
            if node is not None and node.ready_at_s is None and node.terminated_at_s is None:
                self._late[node_id] = None
                node.view = None
        if self._late:
            self._dirty.update(self._late)
        for node_id in self._dirty:
            node = self.nodes[node_id]
            if node.terminated_at_s is not None:
                self._views.pop(node_id, None)
                self._free.pop(node_id, None)
                self._free_index.drop(node_id)
                continue
            view = self._view(node, now)
            self._views[node_id] = view
            if len(node.running) < node.slots:
                self._free[node_id] = view
                self._free_index.put(view)
            else:
                self._free.pop(node_id, None)
                self._free_index.drop(node_id)
        self._dirty.clear()
        types: Mapping[str, MachineType] = self.types
        if self.cooldown.until_s:
            types = self.cooldown.restrict(self.types, self._live_by_type, now)
        return Snapshot(
            now_s=now, types=types, nodes=self._views.as_tuple(), pending=self.pool,
            free_nodes=tuple(self._free.values()), running_count=self._running,
            slowest_running_speed=min(self._running_speeds, default=math.inf), latest_start_s=self.latest_start_s,
            tasks_total=self.tasks_total, tasks_done=len(self.done), observations=self.obs,
            committed_usd=self.committed_usd(now), started_at_s=0.0,
            prior_mean_ref_s=self.prior_mean_ref_s, prior_sd_ref_s=self.prior_sd_ref_s,
            budget_usd=self.budget_usd, tasks_failed=len(self.quarantined), stopping=stopping,
            finished_ref_s=self.finished_ref_s, timeout_ref_s=self.timeout_ref_s, spot_barred=self.spot_barred,
            free_index=self._free_index if self.free_index_on else None, free_index_version=self._free_index.version,
            spot_seen=self.spot_seen,
        )


class _Views:
    """Node views keyed by node id, in the order their nodes first appeared (a dict's
    order), held in a list: the snapshot's ``nodes`` tuple, made at every event, is then a
    copy of a list (about 1 us at 1,000 nodes) rather than a walk of a dict's values (about
    4 us). A node removed (released, voided) shifts the positions after it: rare."""

    __slots__ = ("_pos", "_list")

    def __init__(self) -> None:
        self._pos: dict[str, int] = {}
        self._list: list[NodeView] = []

    def __setitem__(self, node_id: str, view: NodeView) -> None:
        i = self._pos.get(node_id)
        if i is None:
            self._pos[node_id] = len(self._list)
            self._list.append(view)
        else:
            self._list[i] = view

    def pop(self, node_id: str, default=None):
        i = self._pos.pop(node_id, None)
        if i is None:
            return default
        view = self._list.pop(i)
        for later in self._list[i:]:
            self._pos[later.id] -= 1
        return view

    def as_tuple(self) -> tuple[NodeView, ...]:
        return tuple(self._list)
