"""The sampling pass: before the first plan, tasks drawn uniformly at random onto free slots.

No plan is made on a handful of runtimes. Until ``samples_needed`` runtimes are observed,
every free ready slot takes a random pending task; a minimal instance is launched only if
there is nowhere to sample (no private nodes and no instance yet).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .actions import Assign, Launch, SlotRef
from .baselines import most_efficient
from .budget import affordable, short_life_s
from .causes import LaunchCause, ReleaseCause, WorkCause
from .dispatch import keep_running_work
from .scratch import Scratch
from .snapshot import Memory, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


def samples_needed(ctl: Controller, snap: Snapshot) -> int:
    """Runtimes to see before the first plan: ``min_samples``, but never more than
    ``max_sample_fraction`` of the bag (a bag of 20 tasks is not sampled whole). The
    (eps, delta) stopping rules of ``broker plan --sample`` replace this when used."""
    if snap.prior_mean_ref_s is not None:
        return 0
    cap = max(2, math.ceil(ctl.config.max_sample_fraction * snap.tasks_total))
    return min(ctl.config.min_samples, cap, snap.tasks_total)


def sample(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rng, s: Scratch) -> Memory:
    """Random draws on every free ready slot until enough runtimes are observed."""
    ready = [n for n in snap.nodes_with_free_slots() if n.ready(now) and not (n.is_private and memory.private_stopped)]
    if not ctl.private and not snap.nodes:
        cheapest = most_efficient(snap.types.values())
        if cheapest is not None and cheapest.limit > 0:
            life = short_life_s(ctl, cheapest)
            if affordable(ctl, snap, s, cheapest, 1, life):
                s.actions.append(
                    Launch(cheapest.name, 1, LaunchCause.SAMPLING_WITHOUT_PRIVATE_NODES, life - ctl.config.margin_s)
                )
                s.launched_usd += cheapest.billing.cost_usd(life, cheapest.price_per_hour)
    # Samples are real work and the estimate needs them.
    keep_running_work(ctl, snap, now, None, s, ReleaseCause.SAMPLING_IN_PROGRESS)
    in_flight = samples_in_flight(snap, now)
    wanted = samples_needed(ctl, snap) - snap.observations.count - in_flight
    for node in sorted(ready, key=lambda n: -n.speed):
        for slot in node.free_slots():
            if wanted <= 0:
                return memory
            tid = snap.pending.draw(rng, s.taken) if rng is not None else None
            if tid is None:
                r = snap.pending.largest_fitting(math.inf, 0.0, s.taken)
                tid = r[0] if r else None
            if tid is None:
                return memory
            s.taken.add(tid)
            s.used_slots.add((node.id, slot))
            s.actions.append(Assign(tid, SlotRef(node.id, slot), 1, WorkCause.SAMPLING))
            wanted -= 1
    return memory


STRAGGLING_SAMPLE = 2.0  # x the mean runtime seen: a sample older than that no longer holds a slot's place


def samples_in_flight(snap: Snapshot, now: float) -> int:
    """The running samples the sample still waits for: all of them until a runtime is seen,
    then those no older than ``STRAGGLING_SAMPLE`` times the mean runtime seen (reference
    seconds). Rule "a free slot never waits for a straggling sample": an older one stays
    running (the censored estimates count it at its age, ``estimates.censored_moments``)
    while a free slot draws another task. Counting it, a heavy tail's sample of 30 waited on
    its last runtime with the other slots idle: on the 3,000-task lognormal bag of
    ``tests/test_control_deadline_tail.py`` the first plan came at 6.0 h of a 9 h deadline
    on seed 8 (29 runtimes seen at 1.5 h, the 30th a 6 h task on the private node), the
    bag's last tasks then started at 7.3-8 h and 6 of 30 seeds missed the deadline that way
    (``bench/straggler.py``, the ``plan`` column)."""
    obs = snap.observations
    if obs.count < 1:
        return snap.count_running()
    limit = STRAGGLING_SAMPLE * obs.mean_ref_s
    return sum(1 for n in snap.nodes for r in n.running if (now - r.started_at_s) * n.speed <= limit)


def sd_estimate(snap: Snapshot, mean: float) -> float:
    obs = snap.observations
    if obs.count >= 10:
        return obs.sd_ref_s
    if snap.prior_sd_ref_s is not None:
        return snap.prior_sd_ref_s
    return obs.sd_ref_s if obs.count >= 2 else 0.5 * mean
