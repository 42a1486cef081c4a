"""The end of a bag under a deadline: stragglers moved to faster slots (issues 15/16).

Two rules, each saying what it buys (``bench/straggler.py`` prints, per seed, the task that
ended last: where and when it started, how long it ran):

- :func:`move_stragglers`: with nothing left to hand out, a task whose high quantile, given
  how long it has already run, ends past the deadline on its slow slot is copied onto an
  idle faster slot where the same quantile ends sooner (first to finish wins, the other is
  cancelled by the ledger). Without estimates nothing says which task is the long one
  until it has run a while; by then the pending queue is often empty and the task runs on
  alone on the private node, at speed 1. On the heavy-tailed 3,000-task bag of
  ``tests/test_control_deadline_tail.py`` (9 h deadline), 8 of the 14 misses of 30 seeds
  were a 4.6-6 reference-hour task started at 3.3-4.9 h on a speed-1 slot while xlarge
  slots (speed 2.5) stood idle and paid for.
- :func:`keepers`: a task with copies on several machines keeps (at its machine's release)
  the copy expected to end first, not the one on the machine kept longest. The old rule
  kept the private node's copy (a private node is never released) and let the instance
  holding the fast copy go at its billing boundary, so a copy made by ``replicate`` on an
  xlarge was killed an hour later and the original ran on for 5 more hours (seed 1: the
  copy made at 4.93 h of a 6 h task would have ended at 7.3 h; it ended at 10.7 h). Under
  a deadline only: elsewhere time is not what is bought, and keeping an instance costs a
  unit.

The high quantile is the runtime law's (``promising.runtime_law``, Kaplan-Meier over the
runtimes seen, the timeout as its cap) above the task's age, at ``1 - TAIL_RISK_SHARE x
delta`` (99% at 90% confidence): the share of the risk one task may take.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .actions import Replicate, SlotRef
from .causes import Policy, WorkCause
from .promising import CAP_WITHOUT_TIMEOUT, TAIL_RISK_SHARE, runtime_law
from .scratch import Scratch
from .snapshot import Snapshot
from .spotfallback import is_spot_node

if TYPE_CHECKING:
    from ..plan.law import RuntimeLaw
    from .controller import Controller


def keepers(ctl: Controller, snap: Snapshot, now: float, size_ref_s: float | None,
            s: Scratch) -> dict[str, tuple[float, str]]:
    """For each running task, ``(kept until, node id)`` of the copy that ``keep_running_work``
    protects: the machine kept longest (a private node: forever); under a deadline, for a
    task with several copies, the copy expected to end first (its size the larger of its
    estimate, or ``size_ref_s``, and twice the most work any copy has done: a heavy tail's
    task keeps going the longer it has gone)."""
    keeper: dict[str, tuple[float, str]] = {}
    copies: dict[str, list] = {}
    for n in snap.nodes:
        until = math.inf if n.is_private else (s.release_of(n) if s.release_of(n) is not None else math.inf)
        for r in n.running:
            if r.task_id not in keeper or (until, n.id) > keeper[r.task_id]:
                keeper[r.task_id] = (until, n.id)
            copies.setdefault(r.task_id, []).append((until, n, r))
    if ctl.goal.kind != "deadline":
        return keeper
    for tid, mine in copies.items():
        if len(mine) < 2:
            continue
        done = max(max(0.0, now - r.started_at_s) * n.speed for _, n, r in mine)
        size = max(mine[0][2].estimate_ref_s or size_ref_s or 0.0, 2.0 * done)
        until, n, _ = min(mine, key=lambda x: (x[2].started_at_s + size / x[1].speed, x[1].id))
        keeper[tid] = (until, n.id)
    return keeper


def quantile_beyond(law: RuntimeLaw, age_ref_s: float, q: float) -> float:
    """The ``q`` quantile of a runtime ``X`` given ``X > age_ref_s``, never past the cap. Past
    every runtime seen, the law's own guess (``RuntimeLaw.draw_beyond``): an exponential
    remainder of mean half the age, or the tail's mean excess if more."""
    v, w = law.values_ref_s, law.weights
    above = v > age_ref_s
    if law.tail_from_ref_s is not None:
        seen = above & (v <= law.tail_from_ref_s)
    else:
        seen = above
    if not seen.any():
        mean = max(law.tail_excess_ref_s, 0.5 * age_ref_s, 1e-9)
        return min(age_ref_s - mean * math.log1p(-q), law.cap_ref_s)
    vals, wts = v[above], w[above]
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(wts[order])
    i = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(min(vals[order][min(i, vals.size - 1)], law.cap_ref_s))


def move_stragglers(ctl: Controller, snap: Snapshot, now: float, idle_slots, s: Scratch) -> None:
    """Copy each running task that may end past the deadline onto an idle faster slot; see
    the module docstring. Latest high-quantile end first, each onto the fastest idle slot
    left (a paid one with the most paid time among equals: ``keep_running_work`` then keeps
    it to the copy's end, a tick before its release). A task with two copies is left alone.
    Looked at on tick decisions only (``s.remaining`` set): a minute late is soon enough."""
    if (ctl.goal.kind != "deadline" or not ctl.config.replicate or ctl.config.policy != Policy.BROKER
            or len(snap.pending) - len(s.taken) > 0 or not idle_slots):
        return
    deadline_at = snap.started_at_s + float(ctl.goal.value)
    used = {(a.slot.node, a.slot.index) for a in s.actions if isinstance(a, Replicate)}
    copied = {a.task_id for a in s.actions if isinstance(a, Replicate)}
    soon = now + ctl.config.tick_s + ctl.config.margin_s
    free = [(node, slot) for node, slot, _ in idle_slots if (node.id, slot) not in used
            and (node.is_private or s.release_of(node) is None or s.release_of(node) > soon)]
    if not free:
        return
    fastest = max(node.speed for node, _ in free)
    # the longest a task may run (the law's cap, ``promising.runtime_law``), known without the law
    cap = snap.timeout_ref_s or CAP_WITHOUT_TIMEOUT * max(snap.observations.max_ref_s, 1e-9)
    count: dict[str, int] = {}
    for n in snap.nodes:
        for r in n.running:
            count[r.task_id] = count.get(r.task_id, 0) + 1
    # who could end past the deadline at all (the timeout as its size), on a slower node
    cands = [(n, r) for n in snap.nodes if not n.lost and n.speed < fastest for r in n.running
             if count[r.task_id] == 1 and r.task_id not in copied and r.started_at_s <= now
             and r.started_at_s + min(cap, math.inf if r.estimate_ref_s is None else r.estimate_ref_s) / n.speed
             > deadline_at]
    if not cands:
        return
    rem = s.remaining
    if rem is None:
        return  # not a tick: the law is read once a tick (a Kaplan-Meier law of 100,000 runtimes costs ~10 ms)
    law = runtime_law(snap, rem)
    q = 1.0 - TAIL_RISK_SHARE * (1.0 - ctl.config.confidence)
    late = []
    for n, r in cands:
        age = (now - r.started_at_s) * n.speed
        x = max(r.estimate_ref_s, age) if r.estimate_ref_s is not None else quantile_beyond(law, age, q)
        end = r.started_at_s + x / n.speed
        if end > deadline_at:
            late.append((-end, r.task_id, x, n, r))
    late.sort(key=lambda t: (t[0], t[1]))
    free.sort(key=lambda x: (-x[0].speed, -(math.inf if x[0].is_private or s.release_of(x[0]) is None
                                            else s.release_of(x[0])), x[0].id, x[1]))
    barred = snap.spot_barred
    for neg_end, _, x, n, r in late:
        # the fastest slot left this task may take (never a spot slot for a task barred from spot)
        k = next((i for i, (node, _) in enumerate(free) if r.task_id not in barred or not is_spot_node(snap, node)),
                 None)
        if k is None or free[k][0].speed <= n.speed or now + x / free[k][0].speed >= -neg_end:
            continue
        node, slot = free.pop(k)
        s.actions.append(Replicate(r.task_id, SlotRef(node.id, slot), r.attempt + 1, WorkCause.TAIL_REPLICATION))

