"""PANDA, the thesis's own non-clairvoyant scheduler, as a baseline (002 Ch. 6.4, Algorithms 7, 8).

Algorithm 8 as we run it, at the start of each interval h (the horizon [0, T_r] cut into equal
intervals of ``interval_s``; the thesis leaves their number H open, we take the controller's
re-plan interval, 15 min):

1. **Estimates** p^_j (Eq. 6.1, 6.2; ``broker.core.estimate.tools``). The simulated bags carry
   one estimation tool (the bag's estimate column), or none: with one tool Eq. 6.1 gives it
   weight 1 whatever its breakpoints say, so p^_j is the bag's estimate; a bag without one is
   estimated by the mean runtime seen so far (the only "tool" there is). PANDA applies no
   correction for a tool that is biased as a whole (that is the broker's actual/estimate ratio).
2. **Machines** ``<M_1 .. M_m>``: every private node and every instance the limits allow (type
   i contributes L_i machines), sorted by s_i / c_i descending (ties faster first).
3. **Targets** (Eq. 6.3 as corrected in ALGORITHMS.md Errata: T_r x s_i, filled in efficiency
   order until the estimated work is covered; ``broker.core.pack.targets``), with T_r the time
   left to the chosen point, at least one interval.
4. **Algorithm 7** (``broker.core.pack.ffd``): the tasks not yet run, by p^_j descending, each to
   the first machine whose load rho_i (the estimated work left of what runs there) plus p^_j
   stays within its target.
5. Machines with work assigned are rented (launched if not running); an instance with nothing
   assigned and nothing running is released at the end of its paid billing unit.
6. **Dispatch**: a free slot of machine i runs the largest estimated task assigned to i
   (Algorithm 8's "dispatch largest estimated task j" with x_ij = 1).

Where the print is silent, our reading: a task Algorithm 7 could not place (larger than every
residual target) waits for the next interval, but a machine whose own list is empty takes the
largest such task rather than idle (the thesis never leaves a rented machine idle with work
waiting). The chosen point T_r is the user's deadline, else the front row the goal names, else
T_upper: the work over the capacity of "the most cost effective resources" (Sec. 6.4.2), read
as those within 5% of the best s_i / c_i (on the thesis catalogue the xeon at 31.25 reference
hours per dollar and both c1 types at 30.30; the thesis's best-cost rows, 81.4 h for LM20, are
only reachable with all three). Live instances are matched to machines of their type in
launch order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..pack.bins import UNASSIGNED, Bin
from ..pack.ffd import ffd_with_targets
from ..pack.targets import workload_targets
from .actions import Launch, ScheduleRelease
from .causes import LaunchCause, ReleaseCause
from .snapshot import NodeView, Snapshot

EFFICIENT_WITHIN = 0.05  # "the most cost effective resources": within 5% of the best s_i / c_i


@dataclass(frozen=True)
class PandaState:
    """The last interval's assignment: machine id -> its tasks, by estimate descending."""

    at_s: float
    queues: dict  # bin id -> tuple of task ids
    unplaced: tuple  # tasks Algorithm 7 could not place, by estimate descending
    cursor: dict  # bin id -> position of the next task to try in its queue


def machines(snap: Snapshot) -> list[Bin]:
    """Every private node and every instance the limits allow, as packer bins."""
    bins = [Bin.of_private(_private_of(n)) for n in snap.nodes if n.is_private and not n.lost]
    for t in snap.types.values():
        bins += [Bin.of_type(t, f"{t.name}#{k}") for k in range(t.limit)]
    return bins


def _private_of(n: NodeView):
    from ..model import PrivateNode

    return PrivateNode(n.id, n.slots, n.speed, 0.0)


def t_upper_s(snap: Snapshot, private_costs: dict[str, float], work_ref_s: float) -> float:
    """Sec. 6.4.2: the work over the capacity of the most cost-efficient resources."""
    offers = [(t.efficiency, t.capacity_per_s * t.limit) for t in snap.types.values() if t.limit > 0]
    for n in snap.nodes:
        if n.is_private and not n.lost:
            cost = private_costs.get(n.id, 0.0)
            offers.append((math.inf if cost <= 0 else n.slots * n.speed * 3600 / cost, n.slots * n.speed))
    if not offers:
        return math.inf
    best = max(e for e, _ in offers)
    rate = sum(c for e, c in offers if e >= best * (1 - EFFICIENT_WITHIN) or math.isinf(best) and math.isinf(e))
    return work_ref_s / rate if rate > 0 else math.inf


def node_of_bin(snap: Snapshot, now: float, release_of) -> dict[str, NodeView]:
    """Live nodes by machine id: private nodes by name, instances of a type in launch order."""
    out: dict[str, NodeView] = {}
    ranks: dict[str, int] = {}
    instances = sorted((n for n in snap.nodes if not n.is_private and not n.lost
                        and (release_of(n) is None or release_of(n) > now)),
                       key=lambda n: (n.launched_at_s or 0.0, n.id))
    for n in snap.nodes:
        if n.is_private and not n.lost:
            out[n.id] = n
    for n in instances:
        k = ranks.get(n.type_name, 0)
        ranks[n.type_name] = k + 1
        out[f"{n.type_name}#{k}"] = n
    return out


def _estimate(snap: Snapshot, task_id: str, mean_ref_s: float) -> float:
    est = snap.pending.estimate(task_id)
    return mean_ref_s if est is None else est


def plan_interval(snap: Snapshot, now: float, horizon_s: float, mean_ref_s: float, release_of) -> PandaState:
    """Steps 1-4 of Algorithm 8 (module docstring): targets and Algorithm 7 on the pending tasks."""
    bins = machines(snap)
    nodes = node_of_bin(snap, now, release_of)
    load = np.zeros(len(bins))
    for k, b in enumerate(bins):
        n = nodes.get(b.id)
        if n is None:
            continue
        for r in n.running:
            size = r.estimate_ref_s if r.estimate_ref_s is not None else mean_ref_s
            load[k] += max(0.0, size - (now - r.started_at_s) * n.speed)
    tasks = pending_tasks(snap)
    sizes = np.array([_estimate(snap, t, mean_ref_s) for t in tasks], dtype=float)
    total = float(sizes.sum() + load.sum())
    targets = np.asarray(workload_targets(bins, total, max(horizon_s, 1.0)), dtype=float)
    assignment = ffd_with_targets(sizes, bins, np.maximum(targets - load, 0.0))
    order = np.argsort(-sizes, kind="stable")
    queues: dict[str, list[str]] = {}
    unplaced = []
    for j in order:
        k = int(assignment.bin_of_task[j])
        if k == UNASSIGNED:
            unplaced.append(tasks[j])
        else:
            queues.setdefault(bins[k].id, []).append(tasks[j])
    return PandaState(now, {b: tuple(q) for b, q in queues.items()}, tuple(unplaced), {})


def pending_tasks(snap: Snapshot) -> list[str]:
    return list(snap.pending.task_ids())


def fleet(snap: Snapshot, now: float, s, state: PandaState, margin_s: float) -> None:
    """Step 5: launch the machines with work assigned that do not run; release instances with
    nothing assigned and nothing running at the end of their paid unit."""
    nodes = node_of_bin(snap, now, s.release_of)
    wanted: dict[str, int] = {}
    for bin_id, queue in state.queues.items():
        if queue and bin_id not in nodes and "#" in bin_id:
            name = bin_id.rsplit("#", 1)[0]
            wanted[name] = wanted.get(name, 0) + 1
    for name, count in sorted(wanted.items()):
        s.actions.append(Launch(name, count, LaunchCause.PANDA_TARGETS, math.inf))
    for bin_id, n in nodes.items():
        if n.is_private or n.running or state.queues.get(bin_id) or state.unplaced:
            continue
        t = snap.types[n.type_name]
        at = max(now, t.billing.paid_until(n.launched_at_s, now) - margin_s)
        rel = s.release_of(n)
        if rel is None or rel > at + 1e-6:
            s.actions.append(ScheduleRelease(n.id, at, ReleaseCause.PANDA_NO_WORK_ASSIGNED))
            s.release[n.id] = at


def pick(snap: Snapshot, state: PandaState, bin_id: str | None, taken: set[str]) -> str | None:
    """Step 6: the largest task assigned to the machine still pending, else the largest unplaced
    one. The machine's cursor in ``state.cursor`` moves past the tasks it returns and the ones
    no longer pending or taken in this decision (the only state dispatch changes: a task
    behind it that comes back to the pool waits for the next interval's lists)."""
    queue = state.queues.get(bin_id, ()) if bin_id is not None else ()
    k = state.cursor.get(bin_id, 0)
    while k < len(queue):
        tid = queue[k]
        k += 1
        if tid in snap.pending and tid not in taken:
            state.cursor[bin_id] = k
            return tid
    if bin_id is not None:
        state.cursor[bin_id] = k
    u = state.cursor.get("", 0)
    while u < len(state.unplaced):
        tid = state.unplaced[u]
        u += 1
        if tid in snap.pending and tid not in taken:
            state.cursor[""] = u
            return tid
    state.cursor[""] = u
    return None
