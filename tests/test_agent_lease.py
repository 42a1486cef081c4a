"""The agent is never orphaned and cleans up after itself (issue 18, item 4).

- its lease: with no master for ``--lease-s``, it cancels its tasks and exits (the results
  stay journaled for a master that comes back), never while a master is connected;
- ``--keep-s``: a state directory whose results are safe (the master's Shutdown, every
  result acknowledged) is removed at once (0) or marked and swept later; one whose results
  are not safe is kept;
- ``agent.py stop`` (what ``broker down`` runs on a node) stops the agent and every task of
  the state directory, even those of an agent that was SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.shells.agent_client import AgentClient
from broker.shells.local_transport import AGENT_SCRIPT, attach_local_agent, local_agent_pid
from tests.processes import agent_task_processes
from tests.test_agent import agent_dir, results_until, wait_for, wait_until  # noqa: F401 - fixture
from workers.agent import FINISHED_NAME, _held, sweep_finished
from workers.protocol import Result, Run, Started


def connect(state_dir: Path, **options) -> AgentClient:
    options.setdefault("grace_s", 0.5)
    options.setdefault("progress_poll_s", 0.05)
    return AgentClient(attach_local_agent(state_dir, 2, **options), "node")


def _stop(state_dir: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(AGENT_SCRIPT), "stop", "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_an_agent_without_a_master_stops_its_tasks_after_its_lease(agent_dir):
    client = connect(agent_dir, lease_s=1.0)
    client.submit([Run("long", 1, "sleep 60"), Run("queued", 1, "sleep 60"), Run("more", 1, "sleep 60")])
    wait_for(client, Started)
    pid = local_agent_pid(agent_dir)
    assert pid is not None and agent_task_processes(agent_dir)
    client.close()  # the master goes away for good
    assert wait_until(lambda: local_agent_pid(agent_dir) is None, 15.0), "the agent outlived its lease"
    assert not agent_task_processes(agent_dir)
    log = (agent_dir / "agent.log").read_text()
    assert "no master for 1 s (the lease): cancelling 3 task(s) and stopping" in log
    # What it held is kept for a master that comes back: a new agent replays the outcomes.
    back = connect(agent_dir)
    results, _ = results_until(back, 3)
    assert all(r.cancelled for r in results.values())
    back.shutdown(drain=False)
    back.close()


def test_the_lease_never_runs_out_while_a_master_is_connected(agent_dir):
    client = connect(agent_dir, lease_s=0.3)
    client.submit([Run("slow", 1, "sleep 1.5; echo done")])
    results, _ = results_until(client, 1, timeout_s=20)
    assert results[("slow", 1)].ok and results[("slow", 1)].stdout_tail == "done\n"
    client.close()


def test_a_finished_runs_state_is_removed_once_its_results_are_safe(tmp_path):
    run_dir = tmp_path / "runs" / "run-1"
    state = run_dir / "node"
    client = connect(state, keep_s=0)
    client.submit([Run("t", 1, "echo hi")])
    results, _ = results_until(client, 1)
    client.ack([("t", 1)])
    client.shutdown(drain=True)
    client.wait_closed(10)
    client.close()
    assert wait_until(lambda: not state.exists(), 10.0), list(state.iterdir()) if state.exists() else None
    assert not run_dir.exists()  # its run's directory went with its only node
    assert (tmp_path / "runs").is_dir()


def test_state_with_a_result_not_acknowledged_is_kept(tmp_path):
    state = tmp_path / "runs" / "run-1" / "node"
    client = connect(state, keep_s=0)
    client.submit([Run("t", 1, "echo hi")])
    results_until(client, 1)  # never acknowledged: the master may still need it
    client.shutdown(drain=True)
    client.wait_closed(10)
    client.close()
    assert wait_until(lambda: local_agent_pid(state) is None, 10.0)
    assert (state / "journal").is_file() and not (state / FINISHED_NAME).exists()


def test_finished_state_is_kept_for_keep_then_swept(tmp_path):
    runs = tmp_path / "runs"
    state = runs / "run-1" / "node"
    client = connect(state, keep_s=3600)
    client.submit([Run("t", 1, "true")])
    results_until(client, 1)
    client.ack([("t", 1)])
    client.shutdown(drain=True)
    client.wait_closed(10)
    client.close()
    # until the agent has exited: it holds the lock (and a held state is never swept) after its pid file went
    assert wait_until(lambda: (state / FINISHED_NAME).exists() and not _held(str(state)), 10.0)
    unfinished = runs / "run-0" / "node"  # a crashed run's state: its results are not known to be safe
    unfinished.mkdir(parents=True)
    (unfinished / "journal").write_text("")
    other = runs / "run-2" / "node"
    assert sweep_finished(str(other), 3600) == []  # not old enough
    assert sweep_finished(str(other), 3600, now=time.time() + 3601) == [str(state)]
    assert not (runs / "run-1").exists() and unfinished.is_dir()


def test_stop_ends_the_agent_and_its_tasks_and_removes_the_state(agent_dir):
    client = connect(agent_dir)
    client.submit([Run("a", 1, "trap '' TERM; sleep 60"), Run("b", 1, "sleep 60")])
    wait_for(client, Started)
    assert wait_until(lambda: len(agent_task_processes(agent_dir)) >= 2)
    report = _stop(agent_dir, "--keep-s", "0")
    client.close()
    assert report["stopped"] is True and report["removed"] is True
    assert not agent_task_processes(agent_dir) and not agent_dir.exists()


def test_stop_kills_the_tasks_of_an_agent_that_was_killed(agent_dir):
    client = connect(agent_dir)
    client.submit([Run("a", 1, "sleep 60")])
    wait_for(client, Started)
    os.kill(local_agent_pid(agent_dir), signal.SIGKILL)  # its task runs on, orphaned
    client.close()
    assert wait_until(lambda: local_agent_pid(agent_dir) is None)
    assert agent_task_processes(agent_dir)
    report = _stop(agent_dir)
    assert report["stopped"] is False and report["tasks_killed"] >= 1 and report["removed"] is False
    assert wait_until(lambda: not agent_task_processes(agent_dir))
    assert (agent_dir / "journal").is_file()  # without --keep-s the state stays


def test_stop_on_a_node_that_never_ran_the_run_does_nothing(tmp_path):
    report = _stop(tmp_path / "never", "--keep-s", "0")
    assert report == {"state_dir": str(tmp_path / "never"), "stopped": False, "tasks_killed": 0,
                      "removed": False, "swept": 0}


def test_results_survive_when_the_lease_runs_out_with_them_unacknowledged(agent_dir):
    client = connect(agent_dir, lease_s=0.5)
    client.submit([Run("quick", 1, "echo ok")])
    results_until(client, 1)
    client.close()  # no ack: the result is the master's to collect
    assert wait_until(lambda: local_agent_pid(agent_dir) is None, 10.0)
    back = connect(agent_dir)
    results, _ = results_until(back, 1)
    assert isinstance(results[("quick", 1)], Result) and results[("quick", 1)].stdout_tail == "ok\n"
    back.shutdown(drain=False)
    back.close()
