"""The peers' fleet rules (broker/core/control/peers.py) and PANDA (panda.py), decided directly:
each does what its authors document, with their defaults."""

from __future__ import annotations

import math

import pytest

from broker.core.billing import Billing
from broker.core.control import panda, peers
from broker.core.control.actions import Launch, ScheduleRelease
from broker.core.control.peers import PeerOptions
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import NodeView, Observations, RunningTask, Snapshot
from broker.core.model import MachineType

SMALL = MachineType("m1.small", 1, 1.0, 0.080, 3, 0.0, Billing.hourly())  # cheapest per vCPU
XL = MachineType("c1.xlarge", 1, 20.0, 0.660, 3, 0.0, Billing.hourly())  # most work per dollar
TYPES = {"m1.small": SMALL, "c1.xlarge": XL}


class Scratch:
    def __init__(self):
        self.actions, self.release = [], {}

    def release_of(self, node):
        return self.release.get(node.id, node.release_at_s)


def snap(nodes=(), pending=(), now=0.0, types=TYPES) -> Snapshot:
    pool = TaskPool()
    pool.extend(pending)
    return Snapshot(now_s=now, types=types, nodes=tuple(nodes), pending=pool, tasks_total=100, tasks_done=0,
                    observations=Observations(), committed_usd=0.0)


def instance(name, t, launched=0.0, running=(), release=None, ready=None) -> NodeView:
    return NodeView(name, t.slots, t.speed, tuple(running), t.name, launched,
                    launched if ready is None else ready, launched + 3600.0, release)


def launches(s):
    return {(a.type_name, a.count) for a in s.actions if isinstance(a, Launch)}


def releases(s):
    return {(a.instance_id, a.at_s, a.cause) for a in s.actions if isinstance(a, ScheduleRelease)}


# -- autoscale-idle (Ray / Parsl) ------------------------------------------------------------------
def test_autoscale_launches_for_pending_demand_most_efficient_type_first_then_spills():
    s = Scratch()
    peers.autoscale_idle(snap(pending=[(f"t{k}", 60.0) for k in range(5)]), 0.0, s, {}, PeerOptions())
    assert launches(s) == {("c1.xlarge", 3), ("m1.small", 2)}


def test_autoscale_pending_launches_are_bounded_by_upscaling_speed():
    s = Scratch()
    opts = PeerOptions(min_pending_launches=2)
    peers.autoscale_idle(snap(pending=[(f"t{k}", 60.0) for k in range(6)]), 0.0, s, {}, opts)
    assert sum(c for _, c in launches(s)) == 2


def test_autoscale_terminates_an_instance_idle_for_the_timeout_not_before():
    node = instance("i-1", XL)
    s = Scratch()
    state = peers.autoscale_idle(snap([node], now=100.0), 100.0, s, {}, PeerOptions())
    assert not releases(s) and state["idle_since"] == {"i-1": 100.0}
    s = Scratch()
    state = peers.autoscale_idle(snap([node], now=399.0), 399.0, s, state, PeerOptions())
    assert not releases(s)
    s = Scratch()
    peers.autoscale_idle(snap([node], now=400.0), 400.0, s, state, PeerOptions())
    assert releases(s) == {("i-1", 400.0, "idle_timeout")}  # mid-hour: Ray does not look at billing
    s = Scratch()
    peers.autoscale_idle(snap([node], now=220.0), 220.0, s, state, PeerOptions(idle_timeout_s=peers.PARSL_IDLE_S))
    assert releases(s) == {("i-1", 220.0, "idle_timeout")}


def test_autoscale_a_busy_instance_is_not_idle():
    node = instance("i-1", XL, running=[RunningTask("t1", 1, 0, 0.0, 60.0)])
    s = Scratch()
    state = peers.autoscale_idle(snap([node], now=1000.0), 1000.0, s, {"idle_since": {"i-1": 0.0}}, PeerOptions())
    assert not releases(s) and state["idle_since"] == {}


# -- adaptive (Dask) ---------------------------------------------------------------------------
def test_adaptive_scales_up_at_once_to_the_target():
    s = Scratch()
    # 4 tasks of 60 ref-s on speed 20: 12 s of work, target ceil(12 / 5) = 3 workers
    peers.adaptive(snap(pending=[(f"t{k}", 60.0) for k in range(4)]), 0.0, s, {}, PeerOptions(), 240.0)
    assert launches(s) == {("c1.xlarge", 3)}


def test_adaptive_closes_a_worker_only_after_wait_count_proposals_interval_apart():
    busy = instance("i-1", XL, running=[RunningTask("t1", 1, 0, 0.0, 600.0)])
    idle = instance("i-2", XL)
    nodes = [busy, idle]
    state, now = {}, 10.0
    for k in range(2):
        s = Scratch()
        state = peers.adaptive(snap(nodes, now=now), now, s, state, PeerOptions(), 100.0)
        assert not releases(s), k
        now += 1.0
    s = Scratch()
    peers.adaptive(snap(nodes, now=now), now, s, state, PeerOptions(), 100.0)
    assert releases(s) == {("i-2", now, "adaptive_scale_down")}


# -- batch (AWS Batch) --------------------------------------------------------------------------
def test_batch_fills_the_lowest_price_per_vcpu_first():
    s = Scratch()
    peers.batch(snap(pending=[(f"t{k}", 60.0) for k in range(4)]), 0.0, s, {}, PeerOptions())
    assert launches(s) == {("m1.small", 3), ("c1.xlarge", 1)}


def test_batch_releases_idle_instances_once_nothing_is_runnable():
    s = Scratch()
    peers.batch(snap([instance("i-1", SMALL), instance("i-2", SMALL, running=[RunningTask("t", 1, 0, 0.0, 9.0)])],
                     now=50.0), 50.0, s, {}, PeerOptions())
    assert releases(s) == {("i-1", 50.0, "no_runnable_jobs")}


# -- static (condor_annex) ----------------------------------------------------------------------
def test_annex_leases_the_efficient_fleet_for_fifty_minutes_and_renews_while_work_is_left():
    s = Scratch()
    state = peers.static(snap(pending=[("t1", 60.0)]), 0.0, s, {}, PeerOptions(), 60.0)
    assert launches(s) == {("c1.xlarge", 3)}
    assert [a.release_after_s for a in s.actions] == [3000.0]
    nodes = [instance(f"i-{k}", XL, release=3000.0, running=[RunningTask(f"t{k}", 1, 0, 0.0, 9e3)]) for k in range(3)]
    s = Scratch()
    state = peers.static(snap(nodes, now=2900.0), 2900.0, s, state, PeerOptions(), 60.0)
    assert not releases(s)
    s = Scratch()
    state = peers.static(snap(nodes, now=2940.0), 2940.0, s, state, PeerOptions(), 60.0)
    assert releases(s) == {(f"i-{k}", 5940.0, "annex_lease_renewed") for k in range(3)}
    assert state["lease_end"] == 5940.0


def test_annex_instance_idle_fifteen_minutes_terminates_itself():
    state = {"lease_end": 3000.0, "idle_since": {"i-1": 100.0}}
    s = Scratch()
    peers.static(snap([instance("i-1", XL, release=3000.0)], now=1000.0), 1000.0, s, state, PeerOptions(), 60.0)
    assert releases(s) == {("i-1", 1000.0, "annex_idle")}


def test_peer_options_reject_nonsense():
    with pytest.raises(ValueError):
        PeerOptions(idle_timeout_s=0)
    with pytest.raises(ValueError):
        PeerOptions(wait_count=0)


# -- PANDA (thesis Ch. 6) -------------------------------------------------------------------------
def test_panda_targets_fill_the_most_efficient_machines_first_and_ffd_places_the_largest_first():
    # 3 c1.xlarge (20 ref-s/s) and 3 m1.small; T_r = 100 s: each xlarge takes up to 2,000 ref-s
    tasks = [("a", 1500.0), ("b", 1200.0), ("c", 900.0), ("d", 400.0), ("e", 300.0)]
    state = panda.plan_interval(snap(pending=tasks), 0.0, 100.0, 500.0, lambda n: n.release_at_s)
    assert set(state.queues) <= {"c1.xlarge#0", "c1.xlarge#1", "c1.xlarge#2"}
    assert state.queues["c1.xlarge#0"][0] == "a" and state.queues["c1.xlarge#1"][0] == "b"
    placed = [t for q in state.queues.values() for t in q] + list(state.unplaced)
    assert sorted(placed) == ["a", "b", "c", "d", "e"]
    s = Scratch()
    panda.fleet(snap(pending=tasks), 0.0, s, state, 120.0)
    assert launches(s) == {("c1.xlarge", len(state.queues))}


def test_panda_dispatch_takes_the_largest_task_assigned_to_the_machine():
    tasks = [("a", 1500.0), ("b", 1200.0), ("c", 900.0)]
    sn = snap(pending=tasks)
    state = panda.PandaState(0.0, {"c1.xlarge#0": ("a", "c"), "c1.xlarge#1": ("b",)}, ("z",), {})
    assert panda.pick(sn, state, "c1.xlarge#0", set()) == "a"
    assert panda.pick(sn, state, "c1.xlarge#0", {"c"}) is None  # c taken this decision; z is not pending
    assert panda.pick(sn, state, "c1.xlarge#1", set()) == "b"


def test_panda_t_upper_pools_the_resources_within_five_percent_of_the_best():
    xeon = NodeView("xeon", 1, 10.0)
    types = {"m1.small": SMALL, "c1.xlarge": XL, "c1.medium": MachineType("c1.medium", 1, 5.0, 0.165, 3)}
    t = panda.t_upper_s(snap([xeon], types=types), {"xeon": 0.320}, 1000.0)
    assert t == pytest.approx(1000.0 / (10.0 + 3 * 20.0 + 3 * 5.0))
    assert math.isinf(panda.t_upper_s(snap(types={}), {}, 1.0))
