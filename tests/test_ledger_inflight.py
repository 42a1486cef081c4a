"""Launches in flight (broker/core/control/ledger/inflight.py): the daemon calls EC2 off its
loop, so between a Launch and EC2's answer the ledger holds placeholders. They are
committed spend for the budget, part of the fleet for the plan (no second launch for the
same need), never dispatched to, and voided without a trace when EC2 answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.actions import Assign, Launch
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.ledger import Ledger
from broker.core.control.ledger.inflight import is_placeholder
from broker.core.control.snapshot import Memory
from broker.core.goal import Goal
from broker.core.model import MachineType, PrivateNode

C5 = MachineType("c5", 2, 1.0, 3.6, 10, 90.0, Billing.hourly())  # $3.60 an hourly unit
PRIVATE = PrivateNode("p", 1, 1.0, 0.0)


def _ledger(tasks: int = 200, done: int = 40, **kw) -> Ledger:
    led = Ledger({"c5": C5}, tick_s=60.0, **kw)
    led.add_tasks([(f"t{i}", None) for i in range(tasks)])
    led.add_private(PRIVATE)
    led.on_node_ready("p", 0.0)
    for i in range(done):  # runtimes enough to end the sampling phase
        led.adopt_done(f"t{i}", 1, 300.0 + i, None)
    return led


def test_a_launch_in_flight_is_committed_spend_and_its_answer_refunds_the_placeholders():
    led = _ledger()
    assert led.committed_usd(10.0) == 0.0
    releases = led.on_launch_sent("run-1", "c5", 2, 10.0, release_after_s=1000.0)
    assert led.committed_usd(10.0) == pytest.approx(2 * 3.6)  # the first unit of each, as if launched
    assert led.live_count("c5") == 2 and led.launches_in_flight == 1
    assert [r.at_s for r in releases] == [1010.0, 1010.0]
    view = [n for n in led.snapshot(20.0).nodes if n.type_name == "c5"]
    assert len(view) == 2 and all(is_placeholder(n.id) and n.ready_at_s > 20.0 for n in view)
    voided = led.on_launch_answered("run-1")
    assert [(v.node_id, v.launched_at_s, v.release_at_s, v.released) for v in voided] == [
        ("run-1#1", 10.0, 1010.0, False), ("run-1#2", 10.0, 1010.0, False)]
    assert led.committed_usd(30.0) == 0.0 and led.live_count("c5") == 0 and led.launches_in_flight == 0
    assert not any(is_placeholder(n) for n in led.nodes) and led.instances_launched == 0
    led.on_launched("i-1", "c5", 30.0, 30.0)  # what EC2 launched takes their place
    assert led.committed_usd(30.0) == pytest.approx(3.6)
    assert led.committed_usd(5000.0) == pytest.approx(2 * 3.6)  # billing goes on past the voided heap entries


def test_a_placeholder_past_a_billing_boundary_is_refunded_all_its_units():
    led = _ledger()
    led.on_launch_sent("run-1", "c5", 1, 0.0)
    assert led.committed_usd(3700.0) == pytest.approx(2 * 3.6)  # an answer an hour late: two units held
    led.on_launch_answered("run-1")
    assert led.committed_usd(3800.0) == 0.0


def test_a_plan_does_not_order_a_second_launch_while_the_first_is_in_flight():
    """Without the placeholders the same controller orders the launch again once the fleet
    has been missing from its plan for a while (at t=400 here): an outage that holds a
    RunInstances in retries would buy the fleet twice."""
    goal = Goal("deadline", 3600.0)
    controller = Controller(goal, ControllerConfig(), private=[PRIVATE])

    def launches(in_flight: bool) -> list[tuple[float, Launch]]:
        led = _ledger()
        rng = np.random.default_rng(1)
        first = controller.decide(led.snapshot(100.0), Memory(), 100.0, rng, tick=True)
        ordered = [(100.0, a) for a in first.actions if isinstance(a, Launch)]
        assert ordered, "the plan must buy instances for this bag and deadline"
        if in_flight:
            for _, a in ordered:
                led.on_launch_sent("run-1", a.type_name, a.count, 100.0, a.release_after_s)
        memory = first.memory
        for t in range(160, 1300, 60):
            decision = controller.decide(led.snapshot(float(t)), memory, float(t), rng, tick=True)
            memory = decision.memory
            ordered += [(float(t), a) for a in decision.actions if isinstance(a, Launch)]
            assert not any(isinstance(a, Assign) and is_placeholder(a.slot.node) for a in decision.actions)
        return ordered

    assert len(launches(in_flight=False)) > 1  # the rule the placeholders are there for
    assert len(launches(in_flight=True)) == 1


def test_a_placeholder_released_in_flight_hands_its_release_to_the_answer():
    """The controller releases a launch in flight (a stop, the bag done): the answer says so,
    so the shell terminates the instances at once; the spend is refunded all the same."""
    led = _ledger()
    led.on_launch_sent("run-1", "c5", 1, 10.0, release_after_s=math.inf)
    led.schedule_release("run-1#1", 20.0, "user_stop", 20.0)
    [voided] = led.on_launch_answered("run-1")
    assert voided.release_at_s == 20.0 and voided.release_cause == "user_stop"
    assert led.committed_usd(30.0) == 0.0


def test_an_instance_pending_past_its_timeout_is_a_launch_failure_of_its_type():
    led = _ledger()
    for k in range(3):
        iid = f"i-{k}"
        led.on_launched(iid, "c5", 0.0, 0.0)
        until, followups = led.on_pending_timeout(iid, 600.0)
        assert until is not None and until > 600.0  # the type's cooldown
        assert [f.instance_id for f in followups] == [iid] and followups[0].cause == "pending_timeout"
        assert led.nodes[iid].lost
    assert "c5" in led.broken_types  # BROKEN_AFTER instances of the type never came up
