"""Queue-ahead: a node's agent holds work beyond its slots, so that a slot that ends a short
task starts the next one at once instead of waiting for the master's round trip.

Without it each slot, once its task ends, waits for its result to reach the master's loop, a
decision, and the next Run to come back (tens of ms on a loaded machine): with no-op tasks on
16 local agents, slots stood busy 0.21 of the time in the daemon against 0.66 in the bare agent
path, which keeps two Runs a slot (issue 20, ``bench/bench_daemon.py``).

The rule (:func:`queue_depth`): a node of ``s`` slots may hold ``s x (1 + depth)`` tasks, running
and queued at its agent, where ``depth`` is :data:`QUEUE_DEPTH` (1, as the bare agent path's two
Runs a slot), or :data:`DEEP_QUEUE_DEPTH` (7) for tasks under a tenth of the limit below (a
no-op task lasts 10-30 ms; the round trip on a loaded machine is one of the master's turns,
50-100 ms, most of it waiting for a CPU the tasks hold), when all of these hold, else 0:

- ``config.queue_ahead_below_s > 0``: the live daemon sets it (2 s of real time, on the run's
  clock); the simulator and the core's defaults keep 0, so their decisions are unchanged;
- the broker's policy (a baseline dispatches as its paper says);
- the bag's tasks are short there: the mean task (the estimates' mean, else the observed mean,
  :func:`~.estimates.mean_estimate`) runs under ``queue_ahead_below_s`` at the node's speed,
  so the round trip a queue hides is a real share of a task;
- plenty of work is pending: after this decision's picks, at least :data:`PLENTY` times what
  the fleet's queues hold (its slots x depth). Never in the bag's tail, where a task queued
  behind a slow node's running one would wait while a fast slot idles; a task queued before
  the tail waits at most ``depth`` short tasks.

Spot nodes (whose rules pick tasks per slot) take no queued work. The ledger counts a queued
task as dispatched to its node, at a position ``s .. s x (1 + depth) - 1`` (its view has
``queued``: it has not started, its residual is its whole estimate); when a slot of the node
frees, the ledger moves the earliest queued task there, started then, as the agent does
(``ledger/queue.py``). A lost node gives its queued tasks back with its running ones.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from .actions import Assign, Replicate, SlotRef
from .causes import Policy, WorkCause
from .scratch import Scratch
from .snapshot import NodeView, Snapshot

if TYPE_CHECKING:
    from .controller import Controller

QUEUE_DEPTH = 1  # tasks a slot holds queued beyond the one it runs (the bare agent path keeps 2 Runs a slot)
# ... for tasks under a tenth of ``queue_ahead_below_s``: the round trip is several of them. 7
# rather than 3 (ninth session, `bench/bench_daemon.py --tasks 10000 --repeat 3`, back to back):
# with 3 a slot the 16 queues drained within a turn (70 ms, 85% of it the loop waiting for a
# CPU) and the machine idled 2.5% of the time; with 7 the daemon went from 0.90x to 0.94x the
# bare path once attached (0.92x to 0.95x with the start-up on both clocks), its loop's CPU
# per task 0.124 -> 0.117 ms (more results a turn). A queued task still waits at most 7 tasks
# of under 0.2 s, and never in the bag's tail (PLENTY).
DEEP_QUEUE_DEPTH = 7
SHORT_SHARE = 0.1
PLENTY = 2  # queue only while this many times what the queues take are pending


def queue_positions(node_slots: int) -> int:
    """How many tasks a node of ``node_slots`` slots may hold at most, running and queued."""
    return node_slots * (1 + DEEP_QUEUE_DEPTH)


def queue_depth(ctl: Controller, node: NodeView, mean_ref_s: float, pending_left: int, fleet_slots: int) -> int:
    """The queue depth per slot of ``node`` (module docstring)."""
    below = ctl.config.queue_ahead_below_s
    if below <= 0 or ctl.config.policy != Policy.BROKER or node.speed <= 0:
        return 0
    run_s = mean_ref_s / node.speed
    depth = DEEP_QUEUE_DEPTH if run_s < SHORT_SHARE * below else QUEUE_DEPTH if run_s < below else 0
    return depth if pending_left >= PLENTY * fleet_slots * depth else 0


def queue_ahead(ctl: Controller, snap: Snapshot, now: float, mean_ref_s: float, fit_size: float,
                private_until: float, s: Scratch, spot) -> None:  # noqa: ANN001
    """Hand each ready node whose slots are all busy (after this decision's picks) pending
    tasks for its queue positions, up to :func:`queue_depth`, largest first among those that
    fit the node's paid time less their wait in the queue."""
    if ctl.config.queue_ahead_below_s <= 0 or ctl.config.policy != Policy.BROKER:
        return
    left = len(snap.pending) - len(s.taken)
    fleet_slots = sum(n.slots for n in snap.nodes if not n.lost)
    if left < PLENTY * fleet_slots * QUEUE_DEPTH:
        return
    given = Counter(a.slot.node for a in s.actions if isinstance(a, (Assign, Replicate)))
    # Only nodes with a free position, and whose slots all run something (a node holds queued
    # tasks only then, so that is its running count, capped at its slots): a scan of cheap tests,
    # then the few that take work, fastest first.
    cands = [n for n in snap.nodes
             if n.slots <= min(len(n.running), n.slots) + given[n.id] < queue_positions(n.slots) and not n.lost]
    for node in sorted(cands, key=lambda n: (-n.speed, n.id)):
        depth = queue_depth(ctl, node, mean_ref_s, left, fleet_slots)
        room = node.slots * (1 + depth) - len(node.running) - given[node.id]  # (more held from a deeper queue: none)
        if depth == 0 or room <= 0 or not node.ready(now) or spot.applies(node):
            continue
        held = {r.slot for r in node.running}
        free = [p for p in range(node.slots, queue_positions(node.slots)) if p not in held][:room]
        release = s.release_of(node) if not node.is_private else (None if math.isinf(private_until) else private_until)
        limit = math.inf
        if release is not None:  # a queued task starts up to ``depth`` tasks later
            limit = (release - now) * node.speed / ctl.config.fit_safety - depth * mean_ref_s
        for pos, (task_id, _) in zip(free, snap.pending.take_largest(limit, fit_size, s.taken, len(free))):
            s.actions.append(Assign(task_id, SlotRef(node.id, pos), 1, WorkCause.DISPATCH))
            left -= 1
