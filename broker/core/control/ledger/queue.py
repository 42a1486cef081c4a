"""Queued attempts (``queue_ahead.py``): the positions of a node beyond its slots, held at its
agent until a slot frees (part of :class:`~.ledger.Ledger`; its state is the ledger's).

A queued attempt is dispatched to its node like a running one: it is in ``node.running`` (at a
position ``slots ..``), a lost node gives it back with the others, a cancel reaches it, a crash
resumes it. What differs: its view says ``queued`` (it has not started), and when an attempt
in one of the node's slots ends, the earliest queued one (dispatched first; the agent starts
its queue in the order the Runs came) moves to that slot, started then. Not on a node being
lost or away: its attempts end where they are.
"""

from __future__ import annotations

from operator import attrgetter

from ..queue_ahead import queue_positions
from ..snapshot import RunningTask
from .records import Attempt, NodeRecord

_QUEUE_ORDER = attrgetter("started_at_s", "slot")  # the agent starts its queue in the order the Runs came


class QueueMixin:
    def _position_ok(self, node: NodeRecord, slot: int) -> bool:
        """Whether a new attempt may go to ``slot`` (free): one of the node's slots, or a queue
        position once every slot runs something (a queued task never waits by a free slot)."""
        if 0 <= slot < node.slots:
            return True
        return (node.slots <= slot < queue_positions(node.slots)
                and all(i in node.running for i in range(node.slots)))

    def _free_positions(self, node: NodeRecord) -> list[int]:
        """The node's free slots, then its free queue positions (where a resumed attempt goes)."""
        return [i for i in range(queue_positions(node.slots)) if i not in node.running]

    @staticmethod
    def _stop_order(node: NodeRecord) -> list[Attempt]:
        """The node's attempts, queued first (latest position first): stopped in this order, none
        is moved to a slot the stops free (an instance released, a node's work cancelled)."""
        return sorted(node.running.values(), key=lambda a: -a.slot)

    def _start_queued(self, node: NodeRecord, slot: int, now: float) -> None:
        """``slot`` of ``node`` just freed: the earliest queued attempt starts there."""
        if slot >= node.slots or len(node.running) < node.slots or not node.alive or node.down:
            return
        queued = [a for p, a in node.running.items() if p >= node.slots]
        if not queued:
            return
        a = min(queued, key=_QUEUE_ORDER)
        moved = a.moved(slot, now)
        del node.running[a.slot], node.running_views[a.slot]
        node.running[slot] = moved
        node.running_views[slot] = RunningTask(a.task_id, a.attempt, slot, now, self.estimates.get(a.task_id))
        copies = self._copies[a.task_id]
        del copies[(a.node, a.slot)]
        copies[(a.node, slot)] = moved
        if now > self.latest_start_s:
            self.latest_start_s = now
        self._touch(node)
