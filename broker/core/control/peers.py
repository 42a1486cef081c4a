"""Peers' autoscaling policies as baselines (issue 15; ALGORITHMS.md 9).

Each rule sizes the fleet the way its authors document it, with their published defaults
(``PeerOptions``), and sees the same snapshot as the broker: the same pending tasks, the same
estimates, no prior the broker lacks. Tasks are dispatched by the shared dispatch pass
(largest estimate first: the peers themselves run tasks in submission order, so this is a
kindness to them, not a handicap). Rules are called on every decision, so their own time
scales (Dask's 1 s interval, Ray's 5 min idle timeout) are kept up to the moment a decision is
made: the simulator decides on every monitoring tick (60 s) and on every task end.

- ``autoscale-idle``: **Ray autoscaler** (v2) and **Parsl's "simple" strategy**. Launch for the
  pending demand not covered by free slots (ready or booting), up to each type's limit; at most
  ``max(5, upscaling_speed x ready instances)`` launches pending at once (Ray's
  ``upscaling_speed``, default 1.0, "will always scale up to 5 nodes at a minimum"); an instance
  idle for ``idle_timeout_s`` is terminated at once, billing boundary or not. Ray's
  ``idle_timeout_minutes`` defaults to 5 (docs.ray.io, "Configuring Autoscaling"); Parsl's
  ``Config.max_idletime`` defaults to 120.0 s (``parsl/config.py``). Ray picks the node type that
  fits the demand and knows no prices: we let it fill the most cost-efficient type first.
- ``adaptive``: **Dask** ``Adaptive`` (``distributed/deploy/adaptive.py``, ``adaptive_core.py``):
  target workers = ceil(queued work seconds / ``target_duration``), at most one per queued or
  running task, within the limits; scale up to the target at once; a worker is closed only
  after it was proposed for closing on ``wait_count`` consecutive checks, ``interval`` apart.
  Defaults ``target_duration`` "5s", ``wait_count`` 3, ``interval`` "1000 ms". Work seconds are
  the remaining work on the most cost-efficient type's slots; workers are added most
  cost-efficient type first, idle ones proposed for closing.
- ``batch``: **AWS Batch** managed compute environment, ``BEST_FIT_PROGRESSIVE`` (the default
  for on-demand): desired vCPUs follow the runnable jobs (one slot each); capacity is filled
  with the type of lowest cost per vCPU (slot) first, spilling to the next when its limit is
  reached; an instance no job needs (idle, nothing runnable) is terminated. Batch knows vCPUs
  and prices, not speeds: per vCPU m1.small is the cheapest thesis type and the least
  cost-efficient per unit of work.
- ``static``: **condor_annex**: a fixed fleet (``static_fleet``; default every machine of the
  most cost-efficient types, ties pooled) leased for ``lease_s`` (``-duration``, default 50
  minutes, htcondor ``docs/man-pages/condor_annex.rst``); all instances terminate at the lease
  end regardless of idleness, so while work remains (pending or running) the lease is renewed
  a tick before it ends, for another ``lease_s`` from then (``condor_annex -annex-name N
  -duration``); an instance idle for ``annex_idle_s`` (``-idle``, default 15 minutes)
  terminates itself and is not replaced.

Each rule is a pure function ``rule(snap, now, s, state, opts) -> state``: it appends actions to
``s.actions``, records releases in ``s.release`` (read back through ``s.release_of``), and
returns its new state (a dict the controller keeps in ``Memory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..model import MachineType
from .actions import Launch, ScheduleRelease
from .causes import LaunchCause, ReleaseCause
from .snapshot import NodeView, Snapshot


@dataclass(frozen=True, slots=True)
class PeerOptions:
    """The peers' published defaults (see the module docstring for the sources)."""

    idle_timeout_s: float = 300.0  # Ray: idle_timeout_minutes = 5 (Parsl's max_idletime: 120 s)
    upscaling_speed: float = 1.0  # Ray v2
    min_pending_launches: int = 5  # Ray: "will always scale up to 5 nodes at a minimum"
    target_duration_s: float = 5.0  # Dask Adaptive
    wait_count: int = 3  # Dask Adaptive
    interval_s: float = 1.0  # Dask Adaptive
    lease_s: float = 3000.0  # condor_annex -duration: 50 minutes
    annex_idle_s: float = 900.0  # condor_annex -idle: 15 minutes
    static_fleet: tuple[tuple[str, int], ...] | None = None  # condor_annex's fixed fleet

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "target_duration_s", "interval_s", "lease_s", "annex_idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PeerOptions.{name} must be > 0, got {getattr(self, name)!r}")
        if self.wait_count < 1:
            raise ValueError(f"PeerOptions.wait_count must be >= 1, got {self.wait_count!r}")


PARSL_IDLE_S = 120.0  # parsl Config.max_idletime default


# -- shared pieces -----------------------------------------------------------------------------
def live_instances(snap: Snapshot, now: float, s) -> list[NodeView]:
    """Instances not lost and not released by now (booting ones included)."""
    out = []
    for n in snap.nodes:
        if n.is_private or n.lost:
            continue
        rel = s.release_of(n)
        if rel is None or rel > now + 1e-9:
            out.append(n)
    return out


def free_slots(snap: Snapshot, live: Iterable[NodeView]) -> int:
    """Slots that can take a task now or once booted: live instances and private nodes."""
    nodes = list(live) + [n for n in snap.nodes if n.is_private and not n.lost]
    return sum(max(0, n.slots - len(n.running)) for n in nodes)


def by_efficiency(types: Iterable[MachineType]) -> list[MachineType]:
    """Most work per dollar first; ties faster first, then by name."""
    return sorted((t for t in types if t.limit > 0 and t.slots > 0),
                  key=lambda t: (-t.efficiency, -t.capacity_per_s, t.name))


def by_price_per_slot(types: Iterable[MachineType]) -> list[MachineType]:
    """AWS Batch's BEST_FIT_PROGRESSIVE order: lowest cost per vCPU (slot) first, then by name."""
    return sorted((t for t in types if t.limit > 0 and t.slots > 0),
                  key=lambda t: (t.price_per_hour / t.slots, t.name))


def fill(slots_wanted: int, order: list[MachineType], live: list[NodeView], max_instances: float,
         cause: str, s) -> int:
    """Launch instances for ``slots_wanted`` slots, type by type in ``order`` up to each limit,
    at most ``max_instances`` of them; kept until a rule releases them. Returns instances launched."""
    have: dict[str, int] = {}
    for n in live:
        have[n.type_name] = have.get(n.type_name, 0) + 1
    launched = 0
    for t in order:
        if slots_wanted <= 0 or launched >= max_instances:
            break
        room = t.limit - have.get(t.name, 0)
        count = min(room, math.ceil(slots_wanted / t.slots))
        if math.isfinite(max_instances):
            count = min(count, int(max_instances - launched))
        if count > 0:
            s.actions.append(Launch(t.name, count, cause, math.inf))
            slots_wanted -= count * t.slots
            launched += count
    return launched


def release_now(n: NodeView, now: float, cause: str, s) -> None:
    s.actions.append(ScheduleRelease(n.id, now, cause))
    s.release[n.id] = now


def _idle_since(snap: Snapshot, now: float, live: list[NodeView], before: dict[str, float]) -> dict[str, float]:
    """When each live, ready instance without running tasks became idle (as first seen idle)."""
    out = {}
    for n in live:
        if not n.running and n.ready(now):
            out[n.id] = before.get(n.id, now)
    return out


# -- the rules -----------------------------------------------------------------------------------
def autoscale_idle(snap: Snapshot, now: float, s, state: dict, opts: PeerOptions) -> dict:
    """Ray autoscaler / Parsl simple strategy (module docstring)."""
    live = live_instances(snap, now, s)
    idle = _idle_since(snap, now, live, state.get("idle_since", {}))
    gone = set()
    for n in live:
        if n.id in idle and now - idle[n.id] >= opts.idle_timeout_s - 1e-9:
            release_now(n, now, ReleaseCause.IDLE_TIMEOUT, s)
            gone.add(n.id)
    live = [n for n in live if n.id not in gone]
    demand = len(snap.pending) - free_slots(snap, live)
    if demand > 0:
        ready = sum(1 for n in live if n.ready(now))
        booting = len(live) - ready
        room = max(opts.min_pending_launches, math.ceil(opts.upscaling_speed * ready)) - booting
        fill(demand, by_efficiency(snap.types.values()), live, max(room, 0), LaunchCause.PENDING_DEMAND, s)
    return {"idle_since": {k: v for k, v in idle.items() if k not in gone}}


def adaptive(snap: Snapshot, now: float, s, state: dict, opts: PeerOptions, work_ref_s: float) -> dict:
    """Dask Adaptive (module docstring). ``work_ref_s``: the remaining work (point value)."""
    live = live_instances(snap, now, s)
    order = by_efficiency(snap.types.values())
    private_slots = sum(n.slots for n in snap.nodes if n.is_private and not n.lost)
    current = private_slots + sum(n.slots for n in live)
    if not order:
        return {}
    speed = order[0].speed
    tasks = len(snap.pending) + snap.count_running()
    maximum = private_slots + sum(t.limit * t.slots for t in order)
    target = min(math.ceil(work_ref_s / speed / opts.target_duration_s), tasks, maximum)
    if target > current:
        fill(target - current, order, live, math.inf, LaunchCause.ADAPTIVE_TARGET, s)
        return {}
    proposed: dict[str, tuple[int, float]] = {}
    if target < current:
        surplus = current - target
        idle = sorted((n for n in live if not n.running and n.ready(now)), key=lambda n: n.id)
        before = state.get("close_counts", {})
        for n in idle:
            if surplus < n.slots:
                break
            count, first = before.get(n.id, (0, now))
            count += 1
            if count >= opts.wait_count and now - first >= (opts.wait_count - 1) * opts.interval_s - 1e-9:
                release_now(n, now, ReleaseCause.ADAPTIVE_SCALE_DOWN, s)
            else:
                proposed[n.id] = (count, first)
            surplus -= n.slots
    return {"close_counts": proposed}


def batch(snap: Snapshot, now: float, s, state: dict, opts: PeerOptions) -> dict:
    """AWS Batch managed compute environment, BEST_FIT_PROGRESSIVE (module docstring)."""
    live = live_instances(snap, now, s)
    if len(snap.pending) == 0:
        for n in live:
            if not n.running and n.ready(now):
                release_now(n, now, ReleaseCause.NO_RUNNABLE_JOBS, s)
        return {}
    demand = len(snap.pending) - free_slots(snap, live)
    if demand > 0:
        fill(demand, by_price_per_slot(snap.types.values()), live, math.inf, LaunchCause.RUNNABLE_VCPUS, s)
    return {}


def annex_fleet(snap: Snapshot, opts: PeerOptions) -> dict[str, int]:
    """``static_fleet``, or every machine of the most cost-efficient types (ties pooled)."""
    if opts.static_fleet is not None:
        return {name: count for name, count in opts.static_fleet if count > 0 and name in snap.types}
    order = by_efficiency(snap.types.values())
    if not order:
        return {}
    best = order[0].efficiency
    return {t.name: t.limit for t in order if t.efficiency >= best * (1 - 1e-9)}


def static(snap: Snapshot, now: float, s, state: dict, opts: PeerOptions, tick_s: float) -> dict:
    """condor_annex: a fixed fleet on a renewed lease (module docstring)."""
    lease_end = state.get("lease_end")
    if lease_end is None:
        for name, count in annex_fleet(snap, opts).items():
            s.actions.append(Launch(name, min(count, snap.types[name].limit), LaunchCause.ANNEX_LEASE, opts.lease_s))
        return {"lease_end": now + opts.lease_s, "idle_since": {}}
    live = live_instances(snap, now, s)
    idle = _idle_since(snap, now, live, state.get("idle_since", {}))
    for n in live:
        if n.id in idle and now - idle[n.id] >= opts.annex_idle_s - 1e-9:
            release_now(n, now, ReleaseCause.ANNEX_IDLE, s)
    work_left = len(snap.pending) + snap.count_running() > 0
    if work_left and lease_end - now <= tick_s + 1e-9:
        lease_end = now + opts.lease_s
        for n in live:
            if not (n.id in idle and now - idle[n.id] >= opts.annex_idle_s - 1e-9):
                s.actions.append(ScheduleRelease(n.id, lease_end, ReleaseCause.ANNEX_LEASE_RENEWED))
                s.release[n.id] = lease_end
    return {"lease_end": lease_end, "idle_since": idle}
