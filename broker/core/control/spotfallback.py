"""Rule "a task interrupted ``max_spot_attempts`` times runs on on-demand" (issue 21): the
capacity for it.

Dispatch keeps barred tasks (``Snapshot.spot_barred``, ``ledger/spot.py``) off spot slots
only while an on-demand or private node takes work (``dispatch.SpotSlots``): with spot alone
a barred task would otherwise wait forever. The planner counts the barred tasks as ordinary
work, so when it rents spot only nothing ever takes them off spot. This rule closes that
gap, on every decision (not only at a re-plan: a barred task re-queued by an interruption
should not wait for the next one):

when some barred task is pending, and no node that is not spot is alive (private, or an
instance of an on-demand type, booting or ready), and the inventory has on-demand types, the
barred tasks' work (their estimates, the mean of the work left for those without one) is
planned over the on-demand types alone (``FleetPlanner.cheapest_by`` by the deadline; the
fastest plan when there is none), and its new instances are launched now (cause
``spot_fallback``), at least one. Dispatch sees the launch in the same decision and keeps the
barred tasks off spot from then on. The main plan still counts the barred work too: the
fallback is on top of it (a little more capacity than the work needs, never less).

Under a budget the launch is cut to what the budget affords (``budget.affordable``); when
not even one instance is affordable, the barred tasks run on spot once more and the note
says why.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from .actions import Launch
from .budget import affordable
from .causes import LaunchCause
from .estimates import RemainingWork
from .scratch import Scratch
from .snapshot import Memory, NodeView, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


def is_spot_node(snap: Snapshot, n: NodeView) -> bool:
    t = None if n.type_name is None else snap.types.get(n.type_name)
    return t is not None and t.is_spot


def barred_pending(snap: Snapshot) -> list[str]:
    """The barred tasks waiting for a slot."""
    if not snap.spot_barred:
        return []
    pool = snap.pending
    return sorted(t for t in snap.spot_barred if t in pool)


def off_spot_alive(snap: Snapshot) -> bool:
    """A private node or an on-demand instance is there to take barred tasks."""
    return any(not n.lost and not is_spot_node(snap, n) for n in snap.nodes)


def launch_spot_fallback(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                         s: Scratch) -> bool:
    """The rule of the module docstring. True when it launched."""
    barred = barred_pending(snap)
    if not barred or off_spot_alive(snap):
        return False
    od = tuple(t for t in snap.types.values() if not t.is_spot and t.limit > 0)
    if not od or any(isinstance(a, Launch) and a.type_name in {t.name for t in od} for a in s.actions):
        return False
    mean = rem.point_ref_s / max(rem.pending + rem.running, 1) if rem.point_ref_s > 0 else rem.mean_ref_s
    sizes = [snap.pending.estimate(t) for t in barred]
    work = sum(x if x is not None else mean for x in sizes)
    sub = replace(rem, point_ref_s=work, upper_ref_s=work, mean_ref_s=work / len(barred), pending=len(barred),
                  running=0)
    pin = ctl.planner.input(types=od, private=(), nodes=(), rem=sub, now_s=now)
    deadline_s = (memory.deadline_at_s or math.inf) - now
    result = ctl.planner.cheapest_by(pin, deadline_s)
    groups = [(g.type_name, g.count, g.release_after_s) for g in (result.plan.new if result.plan else ()) if g.count]
    if not groups:  # no plan: one instance of the cheapest on-demand type, for the work's length
        t = min(od, key=lambda t: (t.price_per_hour / t.capacity_per_s, t.name))
        groups = [(t.name, 1, t.boot_s + work / t.capacity_per_s)]
    margin = ctl.config.margin_s
    launched = False
    for name, count, life_s in groups:
        t = snap.types[name]
        count = min(count, -(-len(barred) // max(t.slots, 1)))  # no more slots than barred tasks
        while count > 0 and not affordable(ctl, snap, s, t, count, life_s):
            count -= 1
        if count > 0:
            s.actions.append(Launch(name, count, LaunchCause.SPOT_FALLBACK, max(life_s - margin, t.boot_s)))
            s.launched_usd += count * t.billing.cost_usd(life_s, t.price_per_hour)
            launched = True
    if not launched:
        s.notes.append(f"spot fallback: no on-demand instance affordable for {len(barred)} barred tasks")
    return launched
