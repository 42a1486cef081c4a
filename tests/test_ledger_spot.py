"""Spot interruptions in the run ledger (ledger/spot.py) and the dispatch rules they feed:
the two-minute notice, EC2 taking the instance, what it is charged, no failure counted,
``max_spot_attempts``, short tasks on spot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.core.billing import Billing
from broker.core.control.actions import Cancel, Launch
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import Ledger, Requeue
from broker.core.model import MachineType, PrivateNode, spot_key
from tests.builders import assigned, decide, machine, node, pool, snapshot

SPOT = MachineType(spot_key("c5"), 2, 1.0, 3.6, 10, 0.0, Billing.per_second(), market="spot", ec2_type="c5",
                   interruptions_per_hour=0.2)
SPOT_HOURLY = replace(SPOT, name="m@spot", billing=Billing.hourly())
OD = MachineType("c5", 2, 1.0, 3.6, 10, 0.0, Billing.hourly())
TYPES = {t.name: t for t in (SPOT, SPOT_HOURLY, OD)}


def ledger(tasks, policy=FailurePolicy()) -> Ledger:
    led = Ledger(TYPES, policy)
    led.add_tasks(list(tasks))
    return led


def up(led: Ledger, iid: str, type_name: str = SPOT.name, now: float = 0.0) -> None:
    led.on_launched(iid, type_name, now, now)
    led.on_node_ready(iid, now)


def test_the_notice_stops_dispatch_there_and_requeues_only_what_cannot_end_in_time():
    led = ledger([("short", 60.0), ("long", 3600.0)])
    up(led, "i-1")
    led.start("short", "i-1", 0, 1000.0)
    led.start("long", "i-1", 1, 1000.0)
    out = led.on_interruption_notice("i-1", 1050.0, 1170.0)
    # "short" ends at 1060 < 1170: it runs on; "long" would end at 4600: stopped now, pending again
    assert out == [Cancel("long", 1, "spot_notice", "i-1"), Requeue("long", False, "spot_notice")]
    assert "long" in led.pool and [a.task_id for a in led.nodes["i-1"].running.values()] == ["short"]
    assert led.nodes["i-1"].lost and led.snapshot(1050.0).nodes[0].lost  # the controller sees no room there
    assert led.start("long", "i-1", 1, 1051.0) is None  # and the ledger refuses work there
    assert led.book.failures == {} and led.book.losses == {}  # no failure, no lost attempt
    assert led.interruptions == {"long": 1}
    c = led.spot_counts
    assert (c.notices, c.requeued_at_notice, c.attempts_interrupted, c.lost_work_ref_s) == (1, 1, 1, 50.0)
    assert led.on_interruption_notice("i-1", 1060.0, 1170.0) == []  # a second notice changes nothing


def test_a_task_without_estimate_is_judged_by_the_mean_seen_and_an_overdue_one_by_its_age():
    led = ledger([("a", None), ("b", None), ("c", None)])
    led.observe(100.0, None)  # the mean runtime seen: 100 ref-s
    up(led, "i-1")
    led.start("a", "i-1", 0, 1000.0)  # expected to end at 1100
    led.start("b", "i-1", 1, 900.0)  # overdue at 1050: needs as long again as it ran (150 s), to 1200
    out = led.on_interruption_notice("i-1", 1050.0, 1170.0)
    assert [f.task_id for f in out if isinstance(f, Requeue)] == ["b"]


def test_the_interruption_loses_what_runs_requeues_it_and_is_no_failure_of_the_task():
    led = ledger([("a", None), ("b", None)])
    up(led, "i-1")
    led.start("a", "i-1", 0, 100.0)
    led.on_interruption_notice("i-1", 400.0, 520.0)  # nothing known of "a": it runs on
    out = led.on_interrupted("i-1", 520.0)
    assert Cancel("a", 1, "spot_interrupted", "i-1") in out and Requeue("a", False, "spot_interrupted") in out
    assert led.nodes["i-1"].terminated_at_s == 520.0 and led.nodes["i-1"].release_cause == "spot_interrupted"
    assert "a" in led.pool and led.running_count == 0 and led.book.failures == {} and not led.quarantined
    assert led.spot_counts.interruptions == 1 and led.spot_counts.lost_work_ref_s == 420.0
    assert led.on_interrupted("i-1", 600.0) == []  # once


@pytest.mark.parametrize("type_name, ended_s, charged_s", [
    (SPOT.name, 520.0, 520.0),  # per-second: the seconds run, not the 60 s minimum's unit rounding
    (SPOT.name, 30.0, 30.0),  # not even the minute
    (SPOT_HOURLY.name, 1800.0, 0.0),  # hourly: the hour EC2 interrupted is free
    (SPOT_HOURLY.name, 5400.0, 3600.0),
])
def test_an_interrupted_instance_is_charged_only_for_what_ran(type_name, ended_s, charged_s):
    led = ledger([("a", None)])
    up(led, "i-1", type_name)
    assert led.committed_usd(ended_s - 1.0) > 0  # charged ahead while it runs, as any instance
    led.on_interrupted("i-1", ended_s)
    assert led.committed_usd(ended_s + 10_000) == pytest.approx(charged_s / 3600 * 3.6)
    assert led.spot_cost_usd(ended_s) == {"spot": pytest.approx(charged_s / 3600 * 3.6), "on-demand": 0.0}


def test_a_node_lost_after_its_notice_loses_its_attempts_as_interrupted_not_as_lost():
    led = ledger([("a", None)])
    up(led, "i-1")
    led.start("a", "i-1", 0, 100.0)
    led.on_interruption_notice("i-1", 400.0, 520.0)
    ended, _ = led.on_node_lost("i-1", 520.0, gone=True)
    assert [e.outcome for e in ended] == ["interrupted"] and led.book.losses == {}
    assert led.interruptions == {"a": 1} and "a" in led.pool


def test_a_task_interrupted_max_spot_attempts_times_is_barred_from_spot():
    led = ledger([("a", None)], FailurePolicy(max_spot_attempts=2))
    for k, iid in enumerate(("i-1", "i-2")):
        up(led, iid, now=1000.0 * k)
        assert led.start("a", iid, 0, 1000.0 * k + 1) is not None
        assert "a" not in led.spot_barred
        led.on_interrupted(iid, 1000.0 * k + 500)
    assert led.spot_barred == {"a"} and led.snapshot(2000.0).spot_barred == {"a"}
    assert led.spot_counts.fallback_tasks == 1 and led.book.failures == {}
    up(led, "i-3", OD.name, now=2000.0)
    led.start("a", "i-3", 0, 2000.0)
    assert led.spot_counts.fallback_attempts == 1


def test_max_spot_attempts_must_be_positive():
    with pytest.raises(ValueError, match="max_spot_attempts"):
        FailurePolicy(max_spot_attempts=0)


# -- dispatch ---------------------------------------------------------------------------------
SPOT_M = replace(machine("m@spot", slots=1), market="spot", ec2_type="m", interruptions_per_hour=0.1)
OD_M = machine("m", slots=1)
MIXED = {"m@spot": SPOT_M, "m": OD_M}


def test_spot_slots_take_the_short_tasks_and_on_demand_the_long_ones():
    snap = snapshot(types=MIXED, pending=pool([("t100", 100.0), ("t200", 200.0), ("t900", 900.0)]),
                    nodes=[node("s-1", type=SPOT_M), node("o-1", type=OD_M)])
    assert assigned(decide(snap)) == {"t100": "s-1", "t900": "o-1"}
    # spot alone: the usual largest-first
    snap = replace(snap, nodes=(node("s-1", type=SPOT_M),))
    assert assigned(decide(snap)) == {"t900": "s-1"}


def test_a_barred_task_goes_to_on_demand_never_to_spot():
    tasks = pool([("t100", 100.0), ("t200", 200.0), ("t900", 900.0)])
    snap = snapshot(types=MIXED, pending=tasks, spot_barred={"t100", "t900"},
                    nodes=[node("s-1", type=SPOT_M), node("s-2", type=SPOT_M), node("o-1", type=OD_M)])
    got = assigned(decide(snap))
    assert got == {"t200": "s-1", "t900": "o-1"}  # s-2 finds nothing it may take: t100 waits
    # with no on-demand or private node alive, an on-demand instance is rented for the barred
    # tasks (spotfallback.py), and from that decision on they wait for it
    snap = replace(snap, nodes=(node("s-1", type=SPOT_M),))
    d = decide(snap)
    assert assigned(d) == {"t200": "s-1"}
    assert [(a.type_name, a.count, a.cause) for a in d.actions if isinstance(a, Launch)] == [("m", 1, "spot_fallback")]
    # with no on-demand type to rent either, a barred task still runs (nowhere else to go)
    snap = replace(snap, types={"m@spot": SPOT_M})
    assert assigned(decide(snap)) == {"t900": "s-1"}


def test_a_private_node_is_a_fallback_too():
    snap = snapshot(types=MIXED, pending=pool([("t100", 100.0), ("t900", 900.0)]), spot_barred={"t100"},
                    nodes=[node("s-1", type=SPOT_M), node("p", private=True)])
    # the private node takes the largest first; the spot slot may not take t100: it waits
    assert assigned(decide(snap, private=[PrivateNode("p", 1)])) == {"t900": "p"}


@pytest.mark.parametrize("code, kind", [("InsufficientInstanceCapacity", "capacity"),
                                        ("SpotMaxPriceTooLow", "capacity"),
                                        ("MaxSpotInstanceCountExceeded", "limit")])
def test_spot_capacity_errors_cool_the_spot_type_down_as_on_demand(code, kind):
    from broker.shells.aws.errors import kind_of_code

    assert kind_of_code(code).value == kind
    led = ledger([("a", None)])
    until = led.on_launch_failed(SPOT.name, 100.0, kind)
    assert until == 100.0 + FailurePolicy().type_cooldown_s
    snap = led.snapshot(200.0)
    assert snap.types[SPOT.name].limit == 0 and snap.types[OD.name].limit == OD.limit  # the on-demand offer stays
