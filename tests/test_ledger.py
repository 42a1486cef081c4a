"""The run ledger's rules, one at a time, with plain objects (no shell, no clock)."""

from __future__ import annotations

import math

import pytest

from broker.core.billing import Billing
from broker.core.control.actions import Cancel, Launch, ScheduleRelease
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import (
    LATE_READY_S,
    Ledger,
    NodeQuarantined,
    Quarantine,
    Requeue,
    launch_cost_usd,
    planned_life_s,
    private_cost_usd,
)
from broker.core.model import MachineType, PrivateNode

C5 = MachineType("c5", 2, 1.0, 3.6, 10, 90.0, Billing.hourly())  # $0.001 a second, hourly units
TYPES = {"c5": C5}


def ledger(tasks=("a", "b", "c"), policy=FailurePolicy(), privates=(("p", 2),), **kw) -> Ledger:
    led = Ledger(TYPES, policy, **kw)
    led.add_tasks([(t, None) for t in tasks])
    for name, slots in privates:
        led.add_private(PrivateNode(name, slots, 1.0, 0.36))
        led.on_node_ready(name, 0.0)
    return led


def instance(led: Ledger, iid="i-1", now=0.0, release_after_s=math.inf):
    release = led.on_launched(iid, "c5", now, now, release_after_s)
    led.on_node_ready(iid, now + C5.boot_s)
    return release


# -- requeue ----------------------------------------------------------------------------------
def test_a_started_task_leaves_the_pool_and_a_retry_goes_behind_the_waiting_ones():
    led = ledger()
    a = led.start("c", "p", 0, 1.0)
    assert a is not None and a.attempt == 1 and "c" not in led.pool
    e = led.on_attempt_failed("p", "c", 1, 2.0, "exit code 1")
    assert e.outcome == "failed" and e.verdict.retries_left == 2
    assert Requeue("c", True, "retry") in e.followups and "c" in led.pool
    # the pool's stack is taken from its end: the retry is now taken last
    assert [led.pool.smallest(1.0, frozenset(taken))[0] for taken in ((), ("a",), ("a", "b"))] == ["a", "b", "c"]


def test_no_requeue_while_another_copy_runs_or_once_done():
    led = ledger(tasks=("a",))
    led.start("a", "p", 0, 0.0)
    assert led.start("a", "p", 1, 0.0, replica=True).attempt == 2
    e = led.on_attempt_failed("p", "a", 1, 1.0, "exit code 1")
    assert not [f for f in e.followups if isinstance(f, Requeue)] and "a" not in led.pool  # copy 2 still runs
    assert led.on_result("p", "a", 2, 2.0).outcome == "done"
    assert led.cancel_running("p", "stop", 3.0) == [] and "a" not in led.pool


def test_start_refuses_busy_slots_gone_nodes_and_tasks_not_pending():
    led = ledger(tasks=("a", "b"))
    assert led.start("a", "p", 0, 0.0) is not None
    assert led.start("b", "p", 0, 0.0) is None  # busy
    assert led.start("a", "p", 1, 0.0) is None  # not pending any more
    assert led.start("b", "p", 2, 0.0) is None  # no such slot
    assert led.start("b", "nowhere", 0, 0.0) is None
    assert led.start("b", "p", 1, 0.0, replica=True) is None  # nothing of it runs to replicate
    led.on_launched("i-1", "c5", 0.0, 0.0)
    assert led.start("b", "i-1", 0, 1.0) is None  # still booting


# -- first result wins ------------------------------------------------------------------------
def test_the_first_result_wins_and_cancels_the_other_copies():
    led = ledger(tasks=("a",))
    instance(led)
    led.start("a", "p", 0, 100.0)
    led.start("a", "i-1", 1, 100.0, replica=True)
    e = led.on_result("i-1", "a", 2, 130.0)
    assert e.outcome == "done" and e.runtime_ref_s == pytest.approx(30.0)
    assert e.followups == (Cancel("a", 1, "first_result_wins", "p"),)
    assert led.done == {"a"} and led.running_count == 0 and led.last_done_s == 130.0
    assert led.on_result("p", "a", 1, 131.0).outcome == "stale"  # the cancelled copy's late result
    assert led.obs.count == 1 and led.finished


# -- after a failure --------------------------------------------------------------------------
def test_past_its_retries_a_task_is_quarantined_and_its_copies_cancelled():
    led = ledger(tasks=("a",), policy=FailurePolicy(retries=1, distinct_nodes=0, node_strikes=0))
    led.start("a", "p", 0, 0.0)
    led.on_attempt_failed("p", "a", 1, 1.0, "exit code 3")
    led.start("a", "p", 0, 2.0)
    led.start("a", "p", 1, 2.0, replica=True)
    e = led.on_attempt_failed("p", "a", 2, 3.0, "exit code 3")
    assert e.verdict.quarantined
    assert Quarantine("a", e.verdict.reason, 2, "p") in e.followups
    assert Cancel("a", 3, "quarantined", "p") in e.followups
    assert led.quarantined == {"a": e.verdict.reason} and led.finished and "a" not in led.pool


def test_a_bad_instance_is_quarantined_and_released_now_a_bad_private_node_only_quarantined():
    policy = FailurePolicy(retries=5, distinct_nodes=0, node_strikes=2)
    led = ledger(tasks=("a", "b", "c", "d", "e"), policy=policy)
    instance(led)
    led.start("a", "p", 0, 100.0)
    assert led.on_result("p", "a", 1, 101.0).outcome == "done"
    led.start("b", "i-1", 0, 102.0)
    led.start("c", "i-1", 1, 102.0)
    led.on_attempt_failed("i-1", "b", 1, 103.0, "exit code 1")
    e = led.on_attempt_failed("i-1", "c", 1, 104.0, "exit code 1")
    assert e.verdict.bad_node
    assert NodeQuarantined("i-1") in e.followups and ScheduleRelease("i-1", 104.0, "bad_node") in e.followups
    assert led.nodes["i-1"].lost and led.release_due("i-1", led.nodes["i-1"].release_version)
    assert led.bad_nodes == ["i-1"]
    # the same on the private node (now the only other node): quarantined, never released
    led2 = ledger(tasks=("a", "b", "c"), policy=policy, privates=(("p", 2), ("q", 1)))
    led2.start("a", "q", 0, 0.0)
    led2.on_result("q", "a", 1, 1.0)
    for t in ("b", "c"):
        led2.start(t, "p", 0, 2.0)
        e = led2.on_attempt_failed("p", t, 1, 3.0, "exit code 1")
    assert e.verdict.bad_node and [f for f in e.followups if isinstance(f, ScheduleRelease)] == []
    assert led2.nodes["p"].lost and led2.start("b", "p", 0, 4.0) is None


def test_a_lost_node_loses_its_attempts_without_a_failure_and_is_released():
    led = ledger(tasks=("a", "b"), policy=FailurePolicy(retries=0))
    instance(led)
    led.start("a", "i-1", 0, 100.0)
    ended, followups = led.on_node_lost("i-1", 110.0)
    assert [e.outcome for e in ended] == ["lost"] and not ended[0].verdict.quarantined  # even retries 0
    assert ended[0].verdict.lost and led.book.failures.get("a") is None and "a" in led.pool
    assert ended[0].followups == (Requeue("a", True, "retry"),)
    assert followups == [ScheduleRelease("i-1", 110.0, "node_lost")]
    assert led.on_node_lost("i-1", 111.0) == ([], [])  # once
    led2 = ledger(tasks=("a",))
    instance(led2)
    assert led2.on_node_lost("i-1", 100.0, gone=True)[1] == [ScheduleRelease("i-1", 100.0, "instance_lost")]


def test_an_agent_that_comes_back_loses_its_attempts_but_keeps_its_node():
    led = ledger(tasks=("a",))
    led.start("a", "p", 0, 0.0)
    ended, followups = led.on_node_lost("p", 5.0, comes_back=True)
    assert [e.outcome for e in ended] == ["lost"] and followups == [] and "a" in led.pool
    assert led.snapshot(6.0).nodes[0].lost and led.start("a", "p", 0, 6.0) is None
    assert led.on_node_back("p", 60.0) and not led.snapshot(60.0).nodes[0].lost


def test_an_attempt_a_dead_daemon_started_and_the_agent_never_got_is_requeued_without_a_failure():
    led = ledger(tasks=("a", "b"))
    led.resume_attempt("a", 3, "p", 0.0)
    e = led.on_attempt_lost("p", "a", 3, 1.0)
    assert e.outcome == "cancelled" and e.verdict is None and led.book.failures.get("a") is None
    assert e.followups == (Requeue("a", False, "never_reached_agent"),)
    led.start("b", "p", 0, 2.0)
    e = led.on_attempt_lost("p", "b", 1, 3.0)
    assert e.outcome == "lost" and led.book.failures.get("b") is None and led.book.losses["b"] == 1


def test_a_task_lost_with_its_node_again_and_again_is_given_up_at_its_own_bound():
    led = ledger(tasks=("a",), policy=FailurePolicy(retries=0, lost_attempts=2))
    outcomes = []
    for k in range(3):
        led.start("a", "p", 0, 10.0 * k)
        ended, _ = led.on_node_lost("p", 10.0 * k + 5, comes_back=True)
        outcomes.append(ended[0].verdict.quarantined)
        led.on_node_back("p", 10.0 * k + 6)
    assert outcomes == [False, False, True] and "lost_attempts: 2" in led.quarantined["a"]


# -- releases ---------------------------------------------------------------------------------
def test_release_after_launch_is_never_before_boot():
    led = ledger(tasks=())
    assert led.on_launched("i-1", "c5", 10.0, 12.0, 30.0) == ScheduleRelease("i-1", 10.0 + 90.0, "planned_life")
    assert led.on_launched("i-2", "c5", 10.0, 12.0, 600.0) == ScheduleRelease("i-2", 610.0, "planned_life")
    assert led.on_launched("i-3", "c5", 10.0, 12.0) is None
    assert planned_life_s(C5, 30.0) == 90.0 and planned_life_s(C5, math.inf) == 3600.0
    assert launch_cost_usd(C5, Launch("c5", 2, "plan", 30.0)) == pytest.approx(2 * 3.6)


def test_a_new_release_makes_the_old_timer_stale_and_a_release_requeues_without_failure():
    led = ledger(tasks=("a",))
    instance(led)
    first = led.nodes["i-1"].release_version
    led.schedule_release("i-1", 3000.0, "plan", 100.0)
    assert not led.release_due("i-1", first) and led.release_due("i-1", first + 1)
    assert led.schedule_release("i-1", 50.0, "x", 200.0).at_s == 200.0  # never in the past
    led.start("a", "i-1", 0, 200.0)
    out = led.on_released("i-1", 300.0, "plan")
    assert out == [Cancel("a", 1, "released", "i-1"), Requeue("a", False, "released")]
    assert led.book.failures.get("a") is None and led.live_count("c5") == 0
    assert led.committed_usd(5000.0) == pytest.approx(3.6)  # one hour charged, nothing after
    assert led.on_released("i-1", 301.0) == []


def test_committed_spend_grows_at_each_billing_boundary():
    led = ledger(tasks=())
    instance(led)
    assert led.committed_usd(10.0) == pytest.approx(3.6)
    assert led.committed_usd(3600.0) == pytest.approx(3.6)
    assert led.committed_usd(3600.5) == pytest.approx(7.2)
    assert {v.id: v for v in led.snapshot(3601.0).nodes}["i-1"].paid_until_s == 7200.0


def test_private_node_cost_is_its_rate_over_the_makespan():
    led = ledger(tasks=("a",))
    led.start("a", "p", 0, 0.0)
    led.on_result("p", "a", 1, 7200.0)
    assert led.private_cost_usd() == pytest.approx(0.72)
    assert private_cost_usd([PrivateNode("x", 1, 1.0, 1.0)], 1800.0) == 0.5


def test_a_refused_launch_for_capacity_or_a_partial_start_hides_the_type_for_a_while():
    led = ledger(tasks=("a",), policy=FailurePolicy(type_cooldown_s=100.0))
    assert led.on_launch_failed("c5", 0.0, "throttled") is None and led.snapshot(1.0).types["c5"].limit == 10
    assert led.on_launch_failed("c5", 0.0, "partial") == 100.0
    assert led.snapshot(1.0).types["c5"].limit == 0 and led.snapshot(101.0).types["c5"].limit == 10


def test_a_type_whose_instances_never_come_up_is_given_up_after_three():
    """Regression: an instance whose agent could not start was lost, the plan launched
    another, and so on at every tick (a live test with a broken agent launched 294 instances,
    each a paid hour, in 14 minutes). After BROKEN_AFTER lost before they were ready, the type
    gets no room for the rest of the run, and a run left with nothing gives up."""
    led = ledger(tasks=("a",), privates=(), tick_s=60.0, replan_every_s=120.0)
    for k in range(3):
        assert led.snapshot(10.0 * k).types["c5"].limit == 10
        led.on_launched(f"i-{k}", "c5", 10.0 * k, 10.0 * k)
        if k == 1:
            led.on_setup_failed(f"i-{k}", 10.0 * k + 1)  # the bag's setup failing counts too
        else:
            led.on_node_lost(f"i-{k}", 10.0 * k + 1)
        led.on_released(f"i-{k}", 10.0 * k + 2)  # the shell terminates it at once
    assert led.broken_types == {"c5"}
    assert led.snapshot(1e6).types["c5"].limit == 0  # for good, not for a cooldown
    assert [led.on_tick(60.0 * k) for k in range(1, 6)] == [False, False, False, True, True]


def test_a_type_that_came_up_once_is_never_given_up_and_ec2_losses_do_not_count():
    led = ledger(tasks=("a",), privates=())
    instance(led, "i-0")  # ready: the type works
    for k in range(1, 5):
        led.on_launched(f"i-{k}", "c5", 0.0, 0.0)
        led.on_node_lost(f"i-{k}", 1.0)
    assert led.broken_types == set() and led.snapshot(2.0).types["c5"].limit == 10
    led2 = ledger(tasks=("a",), privates=())
    for k in range(4):  # EC2 says they are gone (interrupted, terminated from outside): not the type's fault
        led2.on_launched(f"i-{k}", "c5", 0.0, 0.0)
        led2.on_node_lost(f"i-{k}", 1.0, gone=True)
    assert led2.broken_types == set()
def test_a_launch_timing_out_after_its_retries_hides_the_type_like_a_capacity_error():
    # A type whose RunInstances keeps timing out (an outage of its endpoint, a stuck API) is
    # as unusable as one without capacity: asking again at every tick only stalls the loop.
    led = ledger(tasks=("a",), policy=FailurePolicy(type_cooldown_s=100.0))
    assert led.on_launch_failed("c5", 0.0, "timeout") == 100.0
    assert led.snapshot(1.0).types["c5"].limit == 0 and led.snapshot(101.0).types["c5"].limit == 10


def test_reattaches_are_counted_against_the_failure_policy():
    led = ledger(policy=FailurePolicy(reattaches=2))
    assert [led.reattach_allowed("p") for _ in range(3)] == [True, True, False]


# -- stall watch ------------------------------------------------------------------------------
def test_with_nothing_running_and_no_node_the_run_gives_up_after_the_idle_ticks():
    led = ledger(tasks=("a",), privates=(), tick_s=60.0, replan_every_s=120.0)
    assert [led.on_tick(60.0 * k) for k in range(1, 6)] == [False, False, False, True, True]
    led2 = ledger(tasks=("a",), privates=())
    led2.on_budget_stop()
    assert [led2.on_tick(60.0 * k) for k in range(1, 5)] == [False, False, False, True]
    led3 = ledger(tasks=("a",))  # a private node: never idle
    assert not any(led3.on_tick(60.0 * k) for k in range(1, 50))


# -- snapshot ---------------------------------------------------------------------------------
def test_a_snapshot_rebuilds_only_the_views_an_event_touched():
    led = ledger(tasks=("a", "b"), privates=(("p", 1), ("q", 1)))
    s1 = led.snapshot(0.0)
    views = {v.id: v for v in s1.nodes}
    led.start("a", "p", 0, 1.0)
    s2 = led.snapshot(1.0)
    after = {v.id: v for v in s2.nodes}
    assert after["q"] is views["q"] and after["p"] is not views["p"]
    assert [v.id for v in s2.nodes_with_free_slots()] == ["q"] and s2.count_running() == 1
    assert after["p"].running[0].task_id == "a" and s2.tasks_total == 2 and s2.pending is led.pool


def test_a_node_not_ready_past_its_boot_delay_is_shown_not_ready_yet():
    led = ledger(tasks=("a",), privates=())
    led.on_launched("i-1", "c5", 0.0, 0.0)
    assert led.snapshot(10.0).nodes[0].ready_at_s == 90.0
    late = led.snapshot(100.0).nodes[0]
    assert late.ready_at_s == 100.0 + LATE_READY_S and not late.ready(100.0)
    assert led.snapshot(200.0).nodes[0].ready_at_s == 200.0 + LATE_READY_S
    led.on_node_ready("i-1", 210.0)
    assert led.snapshot(211.0).nodes[0].ready(211.0)
    led.add_private(PrivateNode("p", 1, 1.0))  # a private node waits for its agent too
    assert not led.snapshot(212.0).nodes[-1].ready(212.0)


def test_a_task_sampled_by_another_command_is_done_observed_and_not_pooled():
    led = Ledger(TYPES)
    led.adopt_done("a", 2, 30.0, 20.0)
    led.add_tasks([("a", 20.0), ("b", None)])
    assert led.done == {"a"} and "a" not in led.pool and "b" in led.pool
    assert led.sample_keys == {("a", 2)} and led.attempts["a"] == 2
    assert led.obs.count == 1 and led.obs.sum_estimate_ref_s == 20.0 and led.obs.sum_ratio == 1.5


def test_the_idle_watch_says_since_when_a_ready_node_has_nothing_running():
    led = ledger(tasks=("a", "b"))
    assert led.nodes["p"].idle_since_s == 0.0  # ready at 0, nothing running
    led.start("a", "p", 0, 5.0)
    led.start("b", "p", 1, 6.0)
    assert led.nodes["p"].idle_since_s is None
    led.on_result("p", "a", 1, 7.0)
    assert led.nodes["p"].idle_since_s is None  # b still runs
    led.on_attempt_failed("p", "b", 1, 9.0, "exit code 1")
    assert led.nodes["p"].idle_since_s == 9.0
    led.on_launched("i-1", "c5", 10.0, 10.0)
    assert led.nodes["i-1"].idle_since_s is None  # not ready yet
    led.on_node_ready("i-1", 100.0)
    assert led.nodes["i-1"].idle_since_s == 100.0
