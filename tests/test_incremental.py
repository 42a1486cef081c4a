"""The incremental paths decide exactly what the from-scratch ones decide (issue 20, part 2).

- The dispatch with the ledger's :class:`~broker.core.control.free_index.FreeIndex` (visiting
  only the free nodes that can take a pending task) and ``replicate`` with its dominated-slot
  shortcut give the same decision trace, action for action, as the full scan of every free
  node and main's replicate (kept here verbatim as ``reference_replicate``), over seeded
  simulations of several goals, billings, estimates and faults.
- The index, under any sequence of puts and drops, answers a superset of the nodes that can
  take a task and nothing that is not free (hypothesis); replicate equals the reference on
  generated tails; the ledger's running sums (committed spend, running count, free views, the
  index) equal what a from-scratch recomputation gives after any sequence of events.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import broker.core.control.dispatch as dispatch_mod
from broker.core.billing import Billing
from broker.core.control.actions import Replicate, SlotRef
from broker.core.control.causes import WorkCause
from broker.core.control.controller import ControllerConfig
from broker.core.control.free_index import FreeIndex
from broker.core.control.ledger import Ledger
from broker.core.control.scratch import Scratch
from broker.core.control.snapshot import Goal, NodeView, RunningTask, Snapshot
from broker.core.control.pool import TaskPool
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation
from broker.sim.workloads import BUILTIN, build_workload


def reference_replicate(snap, now, mean, idle_slots, s) -> None:
    """main's replicate before issue 20 (commit 8255094), verbatim: every idle slot scans the
    running tasks from the latest end."""
    copies: dict[str, int] = {}
    running = []
    for n in snap.nodes:
        for r in n.running:
            copies[r.task_id] = copies.get(r.task_id, 0) + 1
            est = r.estimate_ref_s if r.estimate_ref_s is not None else mean
            end = r.started_at_s + est / n.speed
            size = est
            if end <= now:  # overdue
                age_ref = (now - r.started_at_s) * n.speed
                size = max(est, 2.0 * age_ref)
                end = r.started_at_s + size / n.speed
            running.append((end, size, r, n))
    running = [x for x in running if copies[x[2].task_id] < 2]
    running.sort(key=lambda x: (-x[0], x[2].task_id))
    least = min((x[1] for x in running), default=math.inf)
    for node, slot, limit_ref in idle_slots:
        if limit_ref < least:
            continue
        for end, size, r, n in running:
            if end <= now + least / node.speed:
                break
            if n.id == node.id or size > limit_ref or now + size / node.speed >= end:
                continue
            copies[r.task_id] += 1
            s.actions.append(Replicate(r.task_id, SlotRef(node.id, slot), r.attempt + 1, WorkCause.TAIL_REPLICATION))
            if copies[r.task_id] >= 2:
                running = [x for x in running if x[2].task_id != r.task_id]
            break
        if not running:
            return


# -- decision traces: incremental against from scratch ------------------------------------------
THESIS = [("m1.small", 1, 0.080), ("c1.medium", 5, 0.165), ("m1.large", 4, 0.320), ("c1.xlarge", 20, 0.660)]


def _inventory(per_type: int, billing: Billing, slots: int = 1) -> Inventory:
    types = tuple(MachineType(n, slots, s, p, per_type, 60.0, billing) for n, s, p in THESIS)
    return Inventory(private=(PrivateNode("xeon", 2, 10.0, 0.32, local=True),), types=types)


SCENARIOS = {
    # name: (inventory, workload, goal, options)
    "point": (_inventory(15, Billing.hourly()), ("LM", 3000, False), Goal("point", 1), {}),
    "deadline": (_inventory(15, Billing.hourly()), ("LM", 3000, False), Goal("deadline", 3 * 3600), {}),
    "budget": (_inventory(15, Billing.hourly()), ("LM", 1500, False), Goal("budget", 25.0), {}),
    "estimates": (_inventory(15, Billing.hourly()), ("LM", 3000, True), Goal("point", 1), {}),
    "per-second": (_inventory(10, Billing.per_second(), slots=2), ("LS", 3000, False), Goal("theta", 0.5), {}),
    "faults": (_inventory(15, Billing.hourly()), ("LM", 2000, False), Goal("point", 1),
               {"speed_noise": 0.2, "failure_rate": 0.02, "instance_loss_rate": 0.05, "agent_kill_rate": 0.05}),
}


COPY_MAY_WIN = dispatch_mod._copy_may_win


def _trace(name: str, seed: int, incremental: bool, monkeypatch):
    inv, (wl_name, tasks, with_estimates), goal, opts = SCENARIOS[name]
    wl = build_workload(BUILTIN[wl_name], seed, tasks=tasks)
    if with_estimates:
        est = wl.runtimes_ref_s * np.random.default_rng(seed).uniform(0.8, 1.2, tasks)
        wl = SimWorkload(wl.runtimes_ref_s, est, float(est.mean()), name="estimated")
    monkeypatch.setattr(dispatch_mod, "replicate", dispatch_mod.replicate if incremental else reference_replicate)
    monkeypatch.setattr(dispatch_mod, "_copy_may_win", COPY_MAY_WIN if incremental else lambda snap, now: True)
    sim = Simulation(inv, wl, goal, ControllerConfig(), SimOptions(seed=seed, **opts))
    sim.ledger.free_index_on = incremental
    trace = []
    decide = sim.controller.decide

    def recording(snap, memory, now=None, rng=None, tick=True):
        d = decide(snap, memory, now, rng, tick)
        trace.append((now, tick, d.actions))
        return d

    sim.controller.decide = recording
    r = sim.run()
    return trace, (r.makespan_s, r.cost_usd, r.tasks_done, r.instances_launched, r.completions, r.releases)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_incremental_dispatch_decides_as_the_full_scan(name, monkeypatch):
    fast_visits = []
    candidates = FreeIndex.candidates

    def counting(self, now, size):
        out = candidates(self, now, size)
        fast_visits.append(len(out))
        return out

    monkeypatch.setattr(FreeIndex, "candidates", counting)
    monkeypatch.setattr(dispatch_mod, "FEW_FREE_NODES", 0)  # the index whenever it may serve, small fleets too
    copies = 0
    for seed in (1, 2, 3):
        fast, fast_outcome = _trace(name, seed, True, monkeypatch)
        slow, slow_outcome = _trace(name, seed, False, monkeypatch)
        assert len(fast) == len(slow)
        for a, b in zip(fast, slow):
            assert a == b, f"seed {seed}: decisions differ at t={a[0]}"
        assert fast_outcome == slow_outcome
        copies += sum(isinstance(x, Replicate) for _, _, actions in fast for x in actions)
    assert fast_visits, "the index was never used: the comparison shows nothing"
    if name in ("point", "faults", "per-second"):
        assert copies > 0, "no tail copy was made: replicate's shortcut is not compared"


# -- the index against brute force --------------------------------------------------------------
def _view(i: int, speed: float, release: float | None, private: bool, running: int, ready_at: float) -> NodeView:
    run = tuple(RunningTask(f"r{i}-{k}", 1, k, 0.0, None) for k in range(running))
    return NodeView(id=f"n{i:03d}", slots=2, speed=speed, running=run, type_name=None if private else "t",
                    launched_at_s=None if private else 0.0, ready_at_s=ready_at, release_at_s=release)


views = st.builds(_view, st.integers(0, 30), st.sampled_from([0.5, 1.0, 2.5, 4.0]),
                  st.one_of(st.none(), st.floats(0.0, 5000.0)), st.booleans(), st.integers(0, 1),
                  st.sampled_from([0.0, 0.0, 900.0]))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("put"), views), st.tuples(st.just("drop"), st.integers(0, 30))),
                    max_size=60),
       now=st.floats(0.0, 3000.0), size=st.floats(0.0, 4000.0))
def test_free_index_answers_every_node_that_fits_and_only_free_ones(ops, now, size):
    index, free = FreeIndex(), {}
    for op, x in ops:
        if op == "put":
            index.put(x)
            free[x.id] = x
        else:
            index.drop(f"n{x:03d}")
            free.pop(f"n{x:03d}", None)
    assert len(index) == len(free)
    got = {v.id: v for v in index.candidates(now, size)}
    assert len(got) == len(index.candidates(now, size))  # each node once
    assert all(free.get(k) is v for k, v in got.items())
    must = {v.id for v in free.values()
            if v.is_private or v.release_at_s is None or (v.release_at_s - now) * v.speed >= size}
    assert must <= set(got)
    ready = [v.speed for v in free.values() if v.ready(now)]
    assert index.slowest_ready_speed(now) == (min(ready) if ready else None)


# -- replicate against the reference on generated tails -----------------------------------------
@st.composite
def tails(draw):
    n_nodes = draw(st.integers(1, 12))
    nodes, tid = [], 0
    for i in range(n_nodes):
        speed = draw(st.sampled_from([1.0, 2.0, 5.0, 20.0]))
        slots = draw(st.integers(1, 3))
        running = []
        for k in range(draw(st.integers(0, slots))):
            task = f"t{draw(st.integers(0, 25)) if draw(st.booleans()) else 100 + tid}"
            tid += 1
            est = draw(st.one_of(st.none(), st.floats(10.0, 4000.0)))
            # mostly before now; sometimes after it (a clock that restarted): the tail's shortcuts must hold
            start = draw(st.floats(0.0, 3000.0)) if draw(st.integers(0, 7)) else draw(st.floats(0.0, 7000.0))
            running.append(RunningTask(task, 1, k, start, est))
        nodes.append(NodeView(id=f"n{i:02d}", slots=slots, speed=speed, running=tuple(running), type_name="t"))
    idle = []
    for i in sorted(range(n_nodes), key=lambda i: -nodes[i].speed):
        for slot in range(draw(st.integers(0, 2))):
            idle.append((nodes[i], 10 + slot, draw(st.floats(0.0, 20000.0))))
    if draw(st.booleans()):  # the dispatch lists idle slots fastest first; replicate must not rely on it
        idle = draw(st.permutations(idle))
    return tuple(nodes), idle, draw(st.floats(50.0, 3000.0)), draw(st.floats(3000.0, 6000.0))


@settings(max_examples=400, deadline=None)
@given(tails())
def test_replicate_copies_what_the_full_scan_copies(tail):
    nodes, idle, mean, now = tail
    snap = Snapshot(now_s=now, types={}, nodes=nodes, pending=TaskPool(), tasks_total=0, tasks_done=0,
                    observations=None, committed_usd=0.0)
    fast, slow = Scratch(), Scratch()
    dispatch_mod.replicate(snap, now, mean, idle, fast)
    reference_replicate(snap, now, mean, idle, slow)
    assert fast.actions == slow.actions
    # The tail's shortcut (dispatch._copy_may_win, from the ledger's O(1) counts): when it says
    # no copy can win, the full scan copies nothing.
    running = [n for n in nodes if n.running]
    counted = Snapshot(now_s=now, types={}, nodes=nodes, pending=TaskPool(), tasks_total=0, tasks_done=0,
                       observations=None, committed_usd=0.0, free_nodes=tuple({n.id: n for n, _, _ in idle}.values()),
                       slowest_running_speed=min((n.speed for n in running), default=math.inf),
                       latest_start_s=max((r.started_at_s for n in running for r in n.running), default=-math.inf))
    if not dispatch_mod._copy_may_win(counted, now):
        event("no copy can win")
        assert slow.actions == []


def test_replicate_leaves_out_only_the_tasks_no_idle_slot_can_beat():
    """The tail keeps the tasks of nodes slower than the fastest idle slot: a task on a speed-2
    node is copied to an idle speed-3 slot (ends at 100 + 1000/3 < 500), one on a speed-3 node
    is not (and would never be), and a speed-3 node's task started after ``now`` is kept."""
    slow = NodeView(id="a", slots=1, speed=2.0, running=(RunningTask("x", 1, 0, 0.0, None),), type_name="t")
    same = NodeView(id="b", slots=1, speed=3.0, running=(RunningTask("y", 1, 0, 0.0, None),), type_name="t")
    idle = NodeView(id="c", slots=2, speed=3.0, type_name="t")
    snap = Snapshot(now_s=100.0, types={}, nodes=(slow, same, idle), pending=TaskPool(), tasks_total=0, tasks_done=0,
                    observations=None, committed_usd=0.0)
    s = Scratch()
    dispatch_mod.replicate(snap, 100.0, 1000.0, [(idle, 0, math.inf), (idle, 1, math.inf)], s)
    assert s.actions == [Replicate("x", SlotRef("c", 0), 2, WorkCause.TAIL_REPLICATION)]
    late = NodeView(id="b", slots=1, speed=3.0, running=(RunningTask("y", 1, 0, 150.0, None),), type_name="t")
    snap = Snapshot(now_s=100.0, types={}, nodes=(late, idle), pending=TaskPool(), tasks_total=0, tasks_done=0,
                    observations=None, committed_usd=0.0)
    s = Scratch()
    dispatch_mod.replicate(snap, 100.0, 1000.0, [(idle, 0, math.inf)], s)
    assert s.actions == [Replicate("y", SlotRef("c", 0), 2, WorkCause.TAIL_REPLICATION)]


# -- the ledger's running sums against a recomputation ------------------------------------------
C5 = MachineType("c5", 2, 2.0, 3.6, 8, 30.0, Billing.hourly())
M5 = MachineType("m5", 2, 1.0, 0.4, 8, 30.0, Billing.per_second())
TASKS = [f"t{i}" for i in range(8)]
ledger_events = st.lists(st.one_of(
    st.tuples(st.just("launch"), st.sampled_from(["c5", "m5"]), st.floats(600.0, 8000.0)),
    st.tuples(st.just("ready"), st.integers(0, 9)),
    st.tuples(st.just("start"), st.integers(0, 7), st.integers(0, 9), st.integers(0, 1)),
    st.tuples(st.just("end"), st.integers(0, 20)),
    st.tuples(st.just("lost"), st.integers(0, 9)),
    st.tuples(st.just("release"), st.integers(0, 9)),
    st.tuples(st.just("reschedule"), st.integers(0, 9), st.floats(0.0, 9000.0)),
    st.tuples(st.just("wait"), st.floats(0.0, 4000.0)),
), max_size=50)


@settings(max_examples=300, deadline=None)
@given(ledger_events)
def test_ledger_running_sums_equal_a_recomputation(script):
    led = Ledger({"c5": C5, "m5": M5}, tick_s=60.0)
    led.add_tasks([(t, None) for t in TASKS])
    led.add_private(PrivateNode("own", 2, 1.0))
    led.on_node_ready("own", 0.0)
    now, launched = 0.0, []
    for ev in script:
        now += 1.0
        kind = ev[0]
        nodes = [led.nodes[i] for i in launched] + [led.nodes["own"]]
        pick = (lambda k: nodes[k % len(nodes)])
        if kind == "launch":
            node_id = f"i-{len(launched)}"
            launched.append(node_id)
            led.on_launched(node_id, ev[1], now, now, ev[2])
        elif kind == "ready":
            n = pick(ev[1])
            if n.type is not None and n.ready_at_s is None and n.terminated_at_s is None:
                led.on_node_ready(n.id, now)
        elif kind == "start":
            n = pick(ev[2])
            if TASKS[ev[1]] in led.pool and n.ready_at_s is not None and not n.lost and n.terminated_at_s is None \
                    and ev[3] < n.slots and ev[3] not in n.running:
                led.start(TASKS[ev[1]], n.id, ev[3], now)
        elif kind == "end":
            running = [a for t in TASKS for a in led.copies(t)]
            if running:
                a = running[ev[1] % len(running)]
                led.on_result(a.node, a.task_id, a.attempt, now)
        elif kind == "lost":
            n = pick(ev[1])
            if n.type is not None and n.terminated_at_s is None and not n.lost:
                led.on_node_lost(n.id, now, gone=True)
        elif kind == "release":
            n = pick(ev[1])
            if n.type is not None and n.terminated_at_s is None:
                led.on_released(n.id, now)
        elif kind == "reschedule":
            n = pick(ev[1])
            if n.type is not None and n.terminated_at_s is None:
                led.schedule_release(n.id, now + ev[2], "plan", now)
        else:
            now += ev[1]
        snap = led.snapshot(now)
        live = [n for n in led.nodes.values() if n.type is not None]
        recomputed = sum(n.type.billing.cost_usd(max(0.0, min(now, n.terminated_at_s if n.terminated_at_s is not None
                                                              else now) - n.launched_at_s), n.type.price_per_hour)
                         for n in live)
        assert snap.committed_usd == pytest.approx(recomputed, rel=1e-9, abs=1e-9)
        assert snap.count_running() == sum(len(n.running) for n in led.nodes.values())
        assert snap.slowest_running_speed == min((n.speed for n in led.nodes.values() if n.running), default=math.inf)
        assert all(a.started_at_s <= snap.latest_start_s for n in led.nodes.values() for a in n.running.values())
        scratch = Snapshot(now_s=now, types={}, nodes=snap.nodes, pending=snap.pending, tasks_total=0,
                           tasks_done=0, observations=None, committed_usd=0.0)
        assert {v.id for v in snap.nodes_with_free_slots()} == {v.id for v in scratch.nodes_with_free_slots()}
        index = snap.free_index
        assert index is not None and index.version == snap.free_index_version
        assert {v.id for v in index.candidates(now, 0.0)} >= {
            v.id for v in scratch.nodes_with_free_slots() if v.is_private or v.release_at_s is None
            or v.release_at_s >= now}
        assert len(index) == len(snap.nodes_with_free_slots())
        for v in snap.nodes_with_free_slots():
            assert index.view(v.id) is v
