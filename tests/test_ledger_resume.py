"""Ledger.from_journal: a ledger rebuilt from a journal's rows, one kind of row at a time."""

from __future__ import annotations

import pytest

from broker.core.billing import Billing
from broker.core.control.actions import ScheduleRelease
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import AttemptRow, InstanceRow, JournalRows, Ledger, TaskRow, restore_instance, resume_release
from broker.core.model import MachineType, PrivateNode

C5 = MachineType("c5", 2, 2.0, 3.6, 10, 90.0, Billing.hourly())
TASKS = [("a", None), ("b", None), ("c", 40.0)]


def rebuild(tasks=(), attempts=(), instances=(), policy=FailurePolicy(), time_scale=1.0, speeds=None):
    rows = JournalRows(tuple(tasks), tuple(attempts), tuple(instances), time_scale)
    return Ledger.from_journal(rows, {"c5": C5}, TASKS, speeds or {"p": 1.0, "i-1": 2.0}, policy=policy)


def task(tid, state="pending", attempts=0, failures=0, done_attempt=None, sample_order=None, note=None):
    return TaskRow(tid, state, attempts, failures, done_attempt, sample_order, note)


def attempt(tid, n, node="p", outcome="ok", start=0.0, end=10.0, runtime=10.0, code=0, timed_out=False, error=None):
    return AttemptRow(tid, n, node, start, end, outcome, runtime, code, timed_out, error)


def test_a_pending_task_row_is_pooled_with_its_attempt_counter():
    led, _ = rebuild([task("a", attempts=2, failures=2)])
    assert "a" in led.pool and led.attempts["a"] == 2 and led.start("a", "p", 0, 0.0) is None  # no node yet
    assert set(TASKS[i][0] for i in range(3)) <= set(led.estimates)


def test_a_done_task_row_counts_its_counted_attempt_once():
    led, _ = rebuild([task("c", "done", 2, 0, 2)],
                     [attempt("c", 1, outcome="cancelled", runtime=None, code=None, end=5.0),
                      attempt("c", 2, node="i-1", runtime=30.0, end=50.0),
                      attempt("c", 3, node="p", runtime=31.0, end=55.0)])  # a replica's late success
    assert led.done == {"c"} and "c" not in led.pool
    assert led.obs.count == 1 and led.obs.sum_ref_s == pytest.approx(60.0)  # 30 s on speed 2
    assert led.obs.count_with_estimate == 1 and led.last_done_s == 50.0


def test_failed_quarantined_and_cancelled_task_rows_stay_given_up():
    led, _ = rebuild([task("a", "failed", 3, 3), task("b", "quarantined", note="poison"), task("c", "cancelled")])
    assert led.quarantined == {"a": "failed", "b": "poison", "c": "cancelled"} and len(led.pool) == 0
    assert led.finished


def test_a_sampled_task_row_marks_its_first_attempt_as_the_sample():
    led, _ = rebuild([task("a", "done", 2, 1, 2, sample_order=1)],
                     [attempt("a", 1, outcome="failed", code=1, end=3.0), attempt("a", 2, end=9.0)])
    assert led.sampled == {"a"} and led.sample_keys == {("a", 1)}


def test_failed_timed_out_and_lost_attempt_rows_rebuild_the_failure_book():
    policy = FailurePolicy(retries=2, distinct_nodes=2, node_strikes=0)
    led, _ = rebuild([task("a", attempts=3, failures=3), task("b", attempts=1, failures=1)],
                     [attempt("a", 1, "p", "failed", code=7, end=1.0),
                      attempt("a", 2, "i-1", "timed_out", code=None, timed_out=True, end=2.0),
                      attempt("a", 3, "p", "lost", code=None, error="node p lost", end=3.0),
                      attempt("b", 1, "p", "failed", code=7, end=4.0)], policy=policy)
    assert led.book.failures == {"a": 2, "b": 1} and led.book.losses == {"a": 1}  # a lost one is no failure
    # the next failure of "a" is its third: past retries 2, it is given up
    led.add_private(PrivateNode("p", 1, 1.0))
    led.on_node_ready("p", 10.0)
    led.start("a", "p", 0, 10.0)
    assert led.on_attempt_failed("p", "a", 4, 11.0, "exit code 9").verdict.quarantined
    # "exit code 7" on node p once: on a second node it would be poison
    led.start("b", "p", 0, 12.0)
    e = led.on_attempt_failed("p", "b", 2, 13.0, "exit code 7")
    assert not e.verdict.quarantined


def test_the_same_error_on_two_nodes_before_the_kill_still_makes_a_poison_task():
    policy = FailurePolicy(retries=9, distinct_nodes=2, node_strikes=0)
    led, _ = rebuild([task("a", attempts=2, failures=2)],
                     [attempt("a", 1, "p", "failed", code=3, end=1.0), attempt("a", 2, "i-1", "failed", code=3, end=2.0)],
                     policy=policy)
    assert "a" in led.book.quarantined  # the book reached the verdict again


def test_a_node_found_bad_before_the_kill_is_reported_for_quarantine():
    policy = FailurePolicy(retries=9, distinct_nodes=0, node_strikes=2)
    _, restored = rebuild([task("a", "done", 1, 0, 1), task("b", attempts=1, failures=1), task("c", attempts=1, failures=1)],
                          [attempt("a", 1, "i-1", end=1.0), attempt("b", 1, "p", "failed", code=1, end=2.0),
                           attempt("c", 1, "p", "failed", code=1, end=3.0)], policy=policy)
    assert restored.bad_nodes == {"p"}


def test_running_attempt_rows_are_handed_back_per_node_for_reattaching():
    led, restored = rebuild([task("a", "running", 1)], [attempt("a", 1, "i-1", "running", end=None, runtime=None)])
    assert [a.attempt for a in restored.running["i-1"]] == [1] and "a" in led.pool  # until re-attached
    restore_instance(led, InstanceRow("i-1", "c5", "running", 0.0, 90.0, None, None), 100.0)
    led.on_node_ready("i-1", 100.0)
    kept = led.resume_attempt("a", 1, "i-1", 50.0)
    assert kept.resumed and "a" not in led.pool and led.running_count == 1


def test_instance_rows_come_back_with_their_cost_and_their_release_rule():
    led, _ = rebuild()
    restore_instance(led, InstanceRow("i-0", "c5", "terminated", 0.0, 90.0, None, 1000.0), 5000.0)
    restore_instance(led, InstanceRow("i-1", "c5", "running", 100.0, 190.0, None, None), 5000.0)
    restore_instance(led, InstanceRow("i-2", "c5", "running", 200.0, 290.0, 3000.0, None), 5000.0)
    restore_instance(led, InstanceRow("i-3", "c5", "running", 300.0, 390.0, 9000.0, None), 5000.0)
    assert led.instances_launched == 4 and led.live_instances == 3
    assert led.committed_usd(5000.0) == pytest.approx(3.6 + 3 * 7.2)
    # no journaled release: paid-until minus the margin; one past while no daemon ran: now
    assert resume_release(led, "i-1", None, 5000.0, 120.0) == ScheduleRelease("i-1", 7200.0 + 100 - 120, "resumed")
    assert resume_release(led, "i-2", 3000.0, 5000.0, 120.0) == ScheduleRelease("i-2", 5000.0, "resumed_past_release")
    assert resume_release(led, "i-3", 9000.0, 5000.0, 120.0) == ScheduleRelease("i-3", 9000.0, "resumed")
    assert resume_release(led, "i-0", None, 5000.0, 120.0) is None
    assert resume_release(led, "i-3", 9000.0, 5000.0, 120.0, interrupted=True) == ScheduleRelease(
        "i-3", 5000.0, "interrupted_release")


def test_interrupted_attempt_rows_count_towards_max_spot_attempts_not_failures():
    rows = [attempt("a", n, node="i-1", outcome="interrupted", runtime=None, code=None, end=10.0 * n) for n in (1, 2)]
    led, _ = rebuild([task("a", attempts=2)], rows)
    assert led.interruptions == {"a": 2} and led.spot_barred == {"a"} and led.book.failures == {}
    assert led.book.losses == {} and "a" in led.pool


def test_an_interrupted_spot_instance_comes_back_charged_for_what_ran_and_counted():
    """A resumed run used to forget that EC2 took a spot instance back: the partial hour it
    does not bill came back charged, the interruption count went to 0 and the learned rate
    restarted from the declared one."""
    spot = MachineType("c5@spot", 2, 2.0, 1.2, 10, 90.0, Billing.hourly(), market="spot", ec2_type="c5",
                       interruptions_per_hour=0.05)
    rows = JournalRows((), (), (), 1.0)
    led, _ = Ledger.from_journal(rows, {"c5": C5, "c5@spot": spot}, TASKS, {"p": 1.0})
    restore_instance(led, InstanceRow("i-0", "c5@spot", "terminated", 0.0, 90.0, None, 5400.0, True), 6000.0)
    restore_instance(led, InstanceRow("i-1", "c5@spot", "terminated", 0.0, 90.0, None, 5400.0), 6000.0)
    assert led.committed_usd(6000.0) == pytest.approx(1.2 + 2 * 1.2)  # 1 h (interrupted) + 2 h
    assert led.spot_counts.interruptions == 1 and led.spot_seen["c5@spot"][0] == 1
    assert led.spot_seen["c5@spot"][1] == pytest.approx(2 * 5400.0)  # both instances' exposure
