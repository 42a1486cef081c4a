"""Queue-ahead (issue 20, ``broker/core/control/queue_ahead.py``, ``ledger/queue.py``): a node's
agent holds work beyond its slots while tasks are short and plenty is pending; the ledger
knows each queued task is at its node, starts it when a slot frees, and gives it back once
if the node is lost.

Decided directly on the live daemon's ledger (no shell, no clock)."""

from __future__ import annotations

from broker.core.control.actions import Assign
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.estimates import remaining_work
from broker.core.control.ledger import Ledger
from broker.core.control.queue_ahead import DEEP_QUEUE_DEPTH, PLENTY, QUEUE_DEPTH
from broker.core.control.snapshot import Goal, Memory
from broker.core.model import PrivateNode

SLOTS = 4
BAG = SLOTS * (1 + DEEP_QUEUE_DEPTH) + 4  # a node's every position, running and queued, and a few pending
ON = ControllerConfig(queue_ahead_below_s=2.0)  # what the live daemon sets (2 s of run time)


def _ledger(n_tasks: int, size_s: float | None, nodes=(("p", 1.0), ("q", 1.0)), observed=30) -> Ledger:
    led = Ledger({})
    led.add_tasks([(f"t{i:04d}", size_s) for i in range(n_tasks)])
    for name, speed in nodes:
        led.add_private(PrivateNode(name, SLOTS, speed, 0.0))
        led.on_node_ready(name, 0.0)
    for _ in range(observed):  # past the sampling phase
        led.observe(size_s or 0.05, size_s)
    return led


def _fill_slots(led: Ledger, now: float = 1.0) -> None:
    """Every slot of every node runs a task (as the dispatch before did)."""
    taken = set()
    for name, node in led.nodes.items():
        for slot in range(node.slots):
            task = led.pool.smallest(1.0, frozenset(taken))[0]
            taken.add(task)
            assert led.start(task, name, slot, now) is not None


def _decide(led: Ledger, config: ControllerConfig = ON, now: float = 1.0):
    ctl = Controller(Goal("deadline", 10 * 3600.0), config, private=())
    return ctl.decide(led.snapshot(now), Memory(), now, tick=False)


def _queued(decision, slots: int = SLOTS) -> list[Assign]:
    return [a for a in decision.actions if isinstance(a, Assign) and a.slot.index >= slots]


def test_short_tasks_with_plenty_pending_are_queued_ahead_at_each_busy_node():
    led = _ledger(200, 0.05)
    _fill_slots(led)
    d = _decide(led)
    queued = _queued(d)
    assert len(queued) == 2 * SLOTS * DEEP_QUEUE_DEPTH  # 50 ms tasks: every queue position of both nodes
    assert {a.slot.node for a in queued} == {"p", "q"}
    assert all(SLOTS <= a.slot.index < SLOTS * (1 + DEEP_QUEUE_DEPTH) for a in queued)
    assert len({a.task_id for a in d.actions if isinstance(a, Assign)}) == len(d.actions)  # no task twice
    for a in queued:  # the ledger takes them: the slots are all busy
        assert led.start(a.task_id, a.slot.node, a.slot.index, 1.0) is not None
    assert not _queued(_decide(led))  # full: nothing more until a slot frees


def test_the_free_slots_are_filled_first_and_queued_in_the_same_decision():
    led = _ledger(200, 0.05)
    d = _decide(led)
    slots = [a.slot.index for a in d.actions if isinstance(a, Assign) and a.slot.node == "p"]
    assert sorted(slots) == list(range(SLOTS * (1 + DEEP_QUEUE_DEPTH)))
    for a in d.actions:  # in the decision's order, the ledger takes each (the slots before the queue)
        assert led.start(a.task_id, a.slot.node, a.slot.index, 1.0) is not None


def test_long_tasks_are_not_queued():
    led = _ledger(200, 10.0)  # 10 s a task: the round trip a queue hides is no share of it
    _fill_slots(led)
    assert not _queued(_decide(led))


def test_a_slow_node_does_not_queue_what_a_fast_one_does():
    led = _ledger(200, 1.5, nodes=(("fast", 2.0), ("slow", 0.5)))  # 0.75 s there, 3 s here
    _fill_slots(led)
    queued = _queued(_decide(led))
    assert len(queued) == SLOTS * QUEUE_DEPTH and {a.slot.node for a in queued} == {"fast"}  # 1 s tasks: depth 1


def test_nothing_is_queued_in_the_bag_s_tail():
    fleet_slots = 2 * SLOTS
    plenty = PLENTY * fleet_slots * DEEP_QUEUE_DEPTH
    led = _ledger(fleet_slots + plenty - 1, 0.05)  # one task short of plenty once the slots run
    _fill_slots(led)
    assert not _queued(_decide(led))
    led2 = _ledger(fleet_slots + plenty, 0.05)
    _fill_slots(led2)
    assert _queued(_decide(led2))


def test_off_unless_the_daemon_turns_it_on():
    led = _ledger(200, 0.05)
    _fill_slots(led)
    assert not _queued(_decide(led, ControllerConfig()))  # the simulator's config: depth 0


def test_the_ledger_refuses_a_queue_position_while_a_slot_is_free():
    led = _ledger(BAG, 0.05, nodes=(("p", 1.0),))
    assert led.start("t0000", "p", SLOTS, 1.0) is None  # slot 0 is free: a queued task would wait by it
    assert "t0000" in led.pool
    for slot in range(SLOTS):
        led.start(f"t{slot:04d}", "p", slot, 1.0)
    assert led.start("t0010", "p", SLOTS * (1 + DEEP_QUEUE_DEPTH), 1.0) is None  # past the deepest queue
    assert led.start("t0010", "p", SLOTS, 1.0) is not None


def _queued_node(led: Ledger) -> list[str]:
    """Fill p's slots (t0000-t0003) and its queue (t0004-...) at 1.0 s."""
    tasks = []
    for pos in range(SLOTS * (1 + QUEUE_DEPTH)):
        task = f"t{pos:04d}"
        assert led.start(task, "p", pos, 1.0) is not None
        tasks.append(task)
    return tasks


def test_a_node_lost_with_queued_tasks_gives_each_back_once():
    led = _ledger(BAG, 0.05, nodes=(("p", 1.0),))
    tasks = _queued_node(led)
    ended, _ = led.on_node_lost("p", 2.0)
    assert sorted(e.attempt.task_id for e in ended) == tasks
    assert all(t in led.pool for t in tasks) and len(led.pool) == BAG
    assert led.running_count == 0 and not led.nodes["p"].running
    again, _ = led.on_node_lost("p", 3.0)
    assert again == [] and len(led.pool) == BAG


def test_a_freed_slot_starts_the_earliest_queued_task_and_its_runtime_excludes_the_wait():
    led = _ledger(BAG, 0.05, nodes=(("p", 1.0),))
    tasks = _queued_node(led)
    node = led.nodes["p"]
    view = led.snapshot(1.0).nodes[0]
    assert [r.queued for r in view.running] == [False] * SLOTS + [True] * (SLOTS * QUEUE_DEPTH)
    e = led.on_result("p", "t0002", 1, 5.0, 4.0)
    assert e.outcome == "done"
    moved = node.running[2]  # the slot that freed
    assert moved.task_id == tasks[SLOTS] and moved.started_at_s == 5.0  # first queued, started now
    assert SLOTS not in node.running and len(node.running) == SLOTS * (1 + QUEUE_DEPTH) - 1
    assert not led.snapshot(5.0).nodes[0].running[2].queued
    # without the agent's own runtime, the ledger counts from the start, not from the dispatch at 1.0
    done = led.on_result("p", tasks[SLOTS], 1, 5.5)
    assert abs(done.runtime_ref_s - 0.5) < 1e-9


def test_a_queued_task_s_residual_is_its_whole_estimate():
    led = _ledger(20, 3.0, nodes=(("p", 1.0),))
    _queued_node(led)
    rem = remaining_work(led.snapshot(2.5), 1.645)
    # 4 running tasks 1.5 s in (1.5 s left each), 4 queued (3 s each), 12 pending (3 s each)
    assert abs(rem.point_ref_s - (4 * 1.5 + 4 * 3.0 + 12 * 3.0)) < 1e-6


def test_a_resumed_node_keeps_its_queued_attempts():
    led = _ledger(BAG, 0.05, nodes=(("p", 1.0),))
    for pos in range(SLOTS * (1 + DEEP_QUEUE_DEPTH)):
        assert led.resume_attempt(f"t{pos:04d}", 1, "p", 1.0) is not None
    assert len(led.nodes["p"].running) == SLOTS * (1 + DEEP_QUEUE_DEPTH)
    assert led.resume_attempt("t0019", 1, "p", 1.0) is None  # more than the agent can hold


def test_a_node_holding_a_deeper_queue_takes_no_more_at_a_shallower_depth():
    led = _ledger(400, 0.05, nodes=(("p", 1.0),))
    for pos in range(SLOTS * (1 + DEEP_QUEUE_DEPTH)):  # queued when tasks looked like 50 ms
        assert led.start(f"t{pos:04d}", "p", pos, 1.0) is not None
    for _ in range(200):  # they turn out to last 1 s: depth 1 from now on
        led.observe(1.0, None)
    led.on_result("p", "t0000", 1, 2.0, 1.0)  # a slot frees, a queued task starts in it
    assert not _queued(_decide(led, now=2.0))  # it still holds more than 4 x (1 + 1)


def test_an_instance_released_with_queued_tasks_gives_each_back_once():
    from broker.core.billing import Billing
    from broker.core.model import MachineType

    c5 = MachineType("c5", SLOTS, 1.0, 3.6, 10, 90.0, Billing.hourly())
    led = Ledger({"c5": c5})
    led.add_tasks([(f"t{i:04d}", 0.05) for i in range(BAG)])
    led.on_launched("i-1", "c5", 0.0, 0.0, 3000.0)
    led.on_node_ready("i-1", 10.0)
    tasks = [f"t{pos:04d}" for pos in range(SLOTS * (1 + DEEP_QUEUE_DEPTH))]
    for pos, task in enumerate(tasks):
        assert led.start(task, "i-1", pos, 11.0) is not None
    followups = led.on_released("i-1", 20.0, "user_stop")  # stopping a slot must not move a queued task there
    assert sorted(f.task_id for f in followups if type(f).__name__ == "Cancel") == tasks
    assert all(t in led.pool for t in tasks) and len(led.pool) == BAG and led.running_count == 0


def test_a_private_node_s_work_cancelled_with_queued_tasks_gives_each_back_once():
    led = _ledger(BAG, 0.05, nodes=(("p", 1.0),))
    tasks = _queued_node(led)
    followups = led.cancel_running("p", "private_budget_spent", 2.0)
    assert sorted(f.task_id for f in followups if type(f).__name__ == "Cancel") == tasks
    assert len(led.pool) == BAG and not led.nodes["p"].running


def test_a_spot_notice_sends_a_queued_task_elsewhere_however_short():
    from broker.core.billing import Billing
    from broker.core.model import MachineType, spot_key

    spot = MachineType(spot_key("c5"), 2, 1.0, 3.6, 10, 0.0, Billing.per_second(), market="spot", ec2_type="c5",
                       interruptions_per_hour=0.2)
    led = Ledger({spot.name: spot})
    led.add_tasks([(f"t{i}", 1.0) for i in range(4)])
    led.on_launched("i-1", spot.name, 0.0, 0.0)
    led.on_node_ready("i-1", 0.0)
    for pos in range(4):  # two running, two queued behind them
        assert led.start(f"t{pos}", "i-1", pos, 100.0) is not None
    out = led.on_interruption_notice("i-1", 100.5, 220.0)
    # the running ones end at 101 < 220 and run on; the queued ones have not started: pending again
    assert sorted(f.task_id for f in out if type(f).__name__ == "Cancel") == ["t2", "t3"]
    assert "t2" in led.pool and "t3" in led.pool and sorted(led.nodes["i-1"].running) == [0, 1]
