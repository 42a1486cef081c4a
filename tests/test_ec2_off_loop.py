"""EC2 calls off the control loop (broker/shells/run/actuator.py), in real dry runs.

Every EC2 call is journaled as an intent (created_at) and its outcome (completed_at), the
describes included, so the journal shows when each call was in flight. With the calls on
the loop, nothing else could be journaled while one was in flight (the loop thread, which
alone writes the journal, was inside the call). Off the loop, the private node's attempts
start and end while EC2 keeps failing: that is what these tests read from the journal, not
how fast anything ran.
"""

from __future__ import annotations

from pathlib import Path

from broker.cli.verdict import late_but_done
from tests.test_daemon_faults import (
    LONG_TASK_S,
    TASKS,
    assert_ec2_matches_the_journal,
    broker,
    events,
    injected,
    run_args,
    write_inputs,
)
from tests.test_dryrun import query
from tests.test_resume import assert_every_task_done_once, assert_nothing_left, run_dir  # noqa: F401 - a fixture

OUTAGE_FAULTS = 15  # throttled DescribeInstances calls: three EC2 calls whose 5 attempts all fail


def failed_call_spans(run_dir: Path) -> list[tuple[float, float]]:
    """(sent, answered) of every EC2 call that failed, in the journal's run time."""
    return query(run_dir, "SELECT created_at, completed_at FROM actions WHERE state = 'failed' "
                          "AND kind IN ('launch', 'terminate', 'describe') ORDER BY seq")


def private_attempts(run_dir: Path) -> list[tuple[float, float]]:
    return query(run_dir, "SELECT started_at, ended_at FROM attempts WHERE node = 'local' AND ended_at IS NOT NULL")


def test_an_ec2_outage_leaves_the_private_node_working(tmp_path, run_dir):
    """EC2 answers nothing for three calls in a row (every attempt of each throttled, with
    the fleet's backoff between them): meanwhile the loop keeps dispatching to the private
    node and recording its results. Before the calls left the loop, no attempt could start or
    end inside a failed call's span."""
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults=f"throttle:DescribeInstances:{OUTAGE_FAULTS}", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir) == [("DescribeInstances", "throttle")] * OUTAGE_FAULTS  # the outage happened
    spans = failed_call_spans(run_dir)
    assert len(spans) >= 2, spans  # (the calls on the loop journaled no describe)
    attempts = private_attempts(run_dir)
    started_inside = [a for a in attempts if any(lo < a[0] < hi for lo, hi in spans)]
    ended_inside = [a for a in attempts if any(lo < a[1] < hi for lo, hi in spans)]
    assert started_inside and ended_inside, (spans, attempts)
    assert_every_task_done_once(run_dir, TASKS)
    assert_nothing_left(run_dir)


PENDING_INVENTORY_TYPES = """\
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 0.085
      limit: 3
      boot: 3s
      pending_timeout: 1m
"""


def test_an_instance_stuck_pending_is_terminated_at_its_timeout_and_counted_a_launch_failure(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    text = inv.read_text()
    c5 = text.index("    - name: c5.large")
    m5 = text.index("    - name: m5.large")
    inv.write_text(text[:c5] + PENDING_INVENTORY_TYPES + text[m5:])
    done = broker(*run_args(inv, bag, run_dir), faults="stuck_pending:c5.large:1", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    fired = injected(run_dir)  # the launch is injected once; describes log each held instance once
    assert fired.count(("RunInstances", "stuck_pending")) == 1
    assert ("DescribeInstances", "stuck_pending") in fired and set(fired) == {
        ("RunInstances", "stuck_pending"), ("DescribeInstances", "stuck_pending")}
    stuck = [e for e in events(run_dir, "instance.launch_failed") if e["code"] == "PendingTimeout"]
    assert stuck and {e["type"] for e in stuck} == {"c5.large"} and all(e["kind"] == "timeout" for e in stuck)
    c5_ids = {i for (i,) in query(run_dir, "SELECT id FROM instances WHERE type = 'c5.large' AND action_seq = "
                                           "(SELECT min(seq) FROM actions WHERE kind = 'launch' "
                                           "AND payload LIKE '%c5.large%')")}
    assert {e["instance_id"] for e in stuck} == c5_ids
    # never reached (EC2 never showed them running), terminated at their pending_timeout, confirmed
    assert query(run_dir, "SELECT count(*) FROM instances WHERE type = 'c5.large' AND action_seq = "
                          "(SELECT min(seq) FROM actions WHERE kind = 'launch' AND payload LIKE '%c5.large%') "
                          "AND (ready_at IS NOT NULL OR state <> 'terminated')") == [(0,)]
    terminated = {e["instance_id"]: e for e in events(run_dir, "instance.terminated")}
    for e in stuck:
        launched = next(x for x in events(run_dir, "instance.launch") if x["instance_id"] == e["instance_id"])
        assert terminated[e["instance_id"]]["at_s"] - launched["launched_at_s"] >= 60.0
    avoided = [e for e in events(run_dir, "instance.type_avoided") if e["type"] == "c5.large"]
    assert avoided and all(e["kind"] == "timeout" for e in avoided)  # the type's cooldown, as for a launch timeout
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)
    assert_nothing_left(run_dir)
