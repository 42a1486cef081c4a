"""Nothing left billing (issue 17): a termination is done only when EC2 says so, and a launch
EC2 carried out after its retries ran out is found and accounted for.

Real ``broker run --dry-run`` in a subprocess (moto server kept with
``BROKER_DRY_RUN_KEEP_MOTO``), EC2 faults injected with ``BROKER_DRY_RUN_FAULTS``; what the
run left is read from moto, the journal and ``events.jsonl``.
"""

from __future__ import annotations

import pytest

from broker.cli.verdict import late_but_done
from tests.test_daemon_faults import (
    LONG_TASK_S,
    TASKS,
    assert_ec2_matches_the_journal,
    broker,
    events,
    injected,
    moto_by_token,
    run_args,
    write_inputs,
)
from tests.test_dryrun import query
from tests.test_resume import assert_every_task_done_once, assert_nothing_left, run_dir  # noqa: F401 - fixture


def _moto_states(run_dir) -> dict[str, str]:
    return {i: s for group in moto_by_token(run_dir).values() for i, s in group}


@pytest.mark.slow
def test_a_failed_termination_is_not_recorded_as_done_and_is_retried_until_ec2_confirms(tmp_path, run_dir):
    # Five throttles: every attempt of the first TerminateInstances (the retry policy's five)
    # fails, so the first release's termination fails for good; it must be asked again.
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="throttle:TerminateInstances:5", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir).count(("TerminateInstances", "throttle")) == 5
    failed = {e["instance_id"] for e in events(run_dir, "instance.terminate_failed")}
    assert failed, "the first termination should have failed"
    terminated = [e["instance_id"] for e in events(run_dir, "instance.terminated")]
    assert failed <= set(terminated) and len(terminated) == len(set(terminated))  # once, when confirmed
    assert set(_moto_states(run_dir).values()) == {"terminated"}
    assert_ec2_matches_the_journal(run_dir)
    assert query(run_dir, "SELECT count(*) FROM instances WHERE state <> 'terminated'") == [(0,)]
    status = broker("status", str(run_dir))
    assert status.returncode == 0 and "fleet  0 alive" in status.stdout, status.stdout + status.stderr
    assert_every_task_done_once(run_dir, TASKS)
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_a_termination_ec2_never_confirms_exits_1_naming_the_instance_still_billing(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="throttle:TerminateInstances:100000", keep_moto=True)
    assert done.returncode == 1, done.stderr[-3000:]
    in_moto = _moto_states(run_dir)
    running = {i for i, s in in_moto.items() if s != "terminated"}
    assert running, in_moto
    for instance_id in running:
        assert instance_id in done.stderr and "broker down" in done.stderr, done.stderr[-3000:]
    # The journal agrees with EC2: not terminated, still billing.
    assert set(query(run_dir, "SELECT id FROM instances WHERE state <> 'terminated'")) == {(i,) for i in running}
    assert {e["instance_id"] for e in events(run_dir, "instance.terminated")}.isdisjoint(running)
    [unconfirmed] = events(run_dir, "run.instances_unconfirmed")
    assert set(unconfirmed["instance_ids"]) == running
    status = broker("status", str(run_dir))  # what a user sees: still there, still terminating
    for instance_id in running:
        line = next((ln for ln in status.stdout.splitlines() if instance_id in ln), "")
        assert "terminating" in line, status.stdout + status.stderr
    down = broker("down", str(run_dir), keep_moto=True)  # what the message says to do, without faults
    assert down.returncode == 0, down.stderr[-3000:]
    assert query(run_dir, "SELECT DISTINCT state FROM instances") == [("terminated",)]


@pytest.mark.slow
def test_a_launch_ec2_carried_out_after_its_retries_ran_out_is_adopted_not_left_running(tmp_path, run_dir):
    # Each launch attempt first describes by its client token (the idempotency check): the
    # first four describes time out, the fifth and last attempt's RunInstances is carried out
    # and its answer lost. The launch is recorded failed while EC2 holds its instances.
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    spec = "timeout:DescribeInstances:4,lost_response:RunInstances:1"
    done = broker(*run_args(inv, bag, run_dir), faults=spec, keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert ("RunInstances", "lost_response") in injected(run_dir)
    assert events(run_dir, "instance.launch_failed"), "the first launch should have been recorded failed"
    assert set(_moto_states(run_dir).values()) == {"terminated"}
    adopted = [e for e in events(run_dir, "instance.launch") if e["cause"] == "adopted"]
    assert adopted, "the instances of the lost launch should be found by the run's tag and adopted"
    assert_ec2_matches_the_journal(run_dir)
    assert_every_task_done_once(run_dir, TASKS)
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_a_launch_timing_out_after_its_retries_puts_the_type_on_cooldown_and_the_run_replans(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="timeout:c5.large:5", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir) == [("RunInstances", "read_timeout")] * 5
    [failed] = events(run_dir, "instance.launch_failed")
    assert (failed["type"], failed["kind"], failed["launched"]) == ("c5.large", "timeout", 0)
    [avoided] = events(run_dir, "instance.type_avoided")
    assert (avoided["type"], avoided["kind"]) == ("c5.large", "timeout")
    launched = events(run_dir, "instance.launch")
    assert launched and {e["type"] for e in launched} == {"m5.large"}  # re-planned onto the other type
    assert_ec2_matches_the_journal(run_dir)
    assert_every_task_done_once(run_dir, TASKS)
    assert_nothing_left(run_dir)
