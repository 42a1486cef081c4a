"""Regression tests for the seams the run ledger closed (issue 14), each on a real dry run.

- resuming a run after a task failed (the daemon's restore set ``self.failures``, which did
  not exist: AttributeError at every resume);
- an agent stopped with SIGTERM cancels its running tasks and reports them cancelled: the
  daemon dropped those results without re-queueing or journaling them, and the run hung;
- a kill between the run's row and its tasks (every resume then failed: unknown task);
- a kill while the dry run's EC2 world was being made (every later run on the directory
  failed: InvalidKeyPair.Duplicate).
"""

from __future__ import annotations

import os
import signal

from broker.shells.moto_world import (
    DEFAULT_REGION,
    fake_aws_environment,
    find_moto_server,
    server_client,
    start_moto_server,
)
from tests.test_cli_run import LOCAL_ONLY
from broker.shells.local_transport import local_agent_pid
from broker.shells.nodes import agent_dir
from tests.test_dryrun import query
from tests.test_resume import (
    assert_every_task_done_once,
    assert_nothing_left,
    broker,
    journal_events,
    run_args,
    run_dir,  # noqa: F401 - the fixture
    start_broker,
    wait_for,
    write_inputs,
)

FAILING_BAG = """\
command: "python3 -c 'import sys, time; time.sleep(0.2); sys.exit({code})'"
sweep:
  code: [0, 0, 0, 0, 0, 0, 3]
timeout: 30s
retries: 2
"""

SLOW_BAG = """\
command: "sleep 1.5; echo {k}"
sweep:
  k: [1, 2, 3, 4]
timeout: 60s
retries: 2
"""


def test_resume_after_a_failed_task_rebuilds_the_failure_book(tmp_path, run_dir):  # noqa: F811
    inv, _ = write_inputs(tmp_path)
    bag = tmp_path / "failing.yaml"
    bag.write_text(FAILING_BAG)
    killed = broker(*run_args(inv, bag, run_dir), crash="event:task.failed:2", keep_moto=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # The kill lands inside the batch that recorded the second failure: the journal has one.
    assert query(run_dir, "SELECT failures FROM tasks WHERE id = 't000007'") == [(1,)]

    resumed = broker(*run_args(inv, bag, run_dir))
    assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert resumed.returncode == 1, resumed.stderr[-3000:]  # one task could not be done: exit 1
    assert query(run_dir, "SELECT state FROM run") == [("finished",)]
    states = dict(query(run_dir, "SELECT id, state FROM tasks"))
    assert states.pop("t000007") == "quarantined" and set(states.values()) == {"done"}
    # The resumed run counted the failures before the kill. Retries 2 means 3 attempts in all,
    # unless two of them failed alike on two nodes: then it is quarantined at the second
    # (failures.py), which it can only know from the rebuilt book, as the first failure's node
    # is in the journal alone. Which node takes the retry is the dispatch's timing (since
    # instances attach off the loop, the dry run's instance often does). Only the first two
    # failures decide: failed on A, A, then B is three attempts, the third ending the retries
    # (counting distinct nodes over all three made this test fail about one run in four).
    order = query(run_dir, "SELECT node FROM attempts WHERE task_id = 't000007' AND outcome = 'failed' "
                           "ORDER BY attempt")
    expected = 2 if len({node for (node,) in order[:2]}) == 2 else 3
    assert query(run_dir, "SELECT failures, attempts FROM tasks WHERE id = 't000007'") == [(expected, expected)]
    if expected == 2:
        [quarantined] = [e for e in journal_events(run_dir, "task.quarantined") if e["task"] == "t000007"]
        assert "on 2 nodes" in quarantined["reason"]
    final = [e for e in journal_events(run_dir, "task.failed") if e["task"] == "t000007"]
    assert [e["final"] for e in final][-1] is True
    assert_nothing_left(run_dir)


def test_a_cancelled_replay_after_sigterm_to_an_agent_is_requeued_and_the_run_ends(tmp_path, run_dir):  # noqa: F811
    (tmp_path / "inv.yaml").write_text(LOCAL_ONLY)
    (tmp_path / "bag.yaml").write_text(SLOW_BAG)
    # A deadline the local slots can meet: exit 0 says the run ended with every task done
    # (the shared 2-minute one is out of their reach, and a missed deadline exits 1).
    proc = start_broker(*run_args(tmp_path / "inv.yaml", tmp_path / "bag.yaml", run_dir, "--deadline", "1h"))
    try:
        wait_for(proc, run_dir, lambda: query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'")[0][0]
                 >= 2, "two running attempts")
        agent = local_agent_pid(agent_dir(run_dir, "local"))
        os.kill(agent, signal.SIGTERM)  # a private node's agent stopped: it cancels what it runs
        out, err = proc.communicate(timeout=120)  # hung forever before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert_every_task_done_once(run_dir, 4)
    lost = query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'lost'")[0][0]
    assert lost >= 2  # each cancelled attempt was journaled as ended, then re-run
    # The node was down while its agent stopped (no work sent to it), then back.
    assert [e["attempts"] for e in journal_events(run_dir, "node.down")] == [lost]
    assert journal_events(run_dir, "agent.reattached")
    assert_nothing_left(run_dir)


def test_a_kill_between_run_creation_and_task_insertion_leaves_a_resumable_run(tmp_path, run_dir):  # noqa: F811
    inv, bag = write_inputs(tmp_path, task_s=0.2)
    # A deadline that is not at risk: exit 0 then says every task was done once (the shared
    # 2-minute one is missed by seconds on a resumed run, and a missed deadline exits 1).
    killed = broker(*run_args(inv, bag, run_dir, "--deadline", "1h"), crash="create_run:1", keep_moto=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = broker(*run_args(inv, bag, run_dir, "--deadline", "1h"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_every_task_done_once(run_dir, 10)
    assert_nothing_left(run_dir)


def test_a_kill_during_the_dry_run_worlds_creation_leaves_a_resumable_run(tmp_path, run_dir):  # noqa: F811
    """The run directory's moto server holds part of a world (the key pair was made, the
    server file never got the world's ids): the next ``broker run`` finishes it."""
    inv, bag = write_inputs(tmp_path, task_s=0.2)
    server = start_moto_server(run_dir, region=DEFAULT_REGION)
    with fake_aws_environment(DEFAULT_REGION):
        ec2 = server_client(server, DEFAULT_REGION)
        ec2.create_vpc(CidrBlock="10.77.0.0/16")
        ec2.create_key_pair(KeyName="broker-dry-run")
    done = broker(*run_args(inv, bag, run_dir, "--deadline", "1h"))  # met: exit 0 then means the run worked
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Duplicate" not in done.stderr
    assert_every_task_done_once(run_dir, 10)
    assert find_moto_server(run_dir) is None  # the run stopped its server at the end
    assert_nothing_left(run_dir)
