"""Worker, node and EC2 faults in real dry runs: nothing lost, nothing done twice, nothing doubled.

Every test runs the real ``broker run --dry-run`` in a subprocess (moto server process,
local agents, time scaled) and reads what it left: the journal, ``events.jsonl``, the
run's moto server (kept with ``BROKER_DRY_RUN_KEEP_MOTO`` where the test counts its
instances), the process table. EC2 faults are injected with ``BROKER_DRY_RUN_FAULTS``
(broker/shells/faults.py); agents are killed with SIGKILL; an SSH link to a private node is
cut by killing the test sshd's connection processes (tests/sshd.py).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from broker.cli.verdict import late_but_done  # a late end exits 1 (issue 16); these tests check other things
from broker.shells.local_transport import local_agent_pid
from broker.shells.moto_world import DEFAULT_REGION, fake_aws_environment, find_moto_server, server_client
from broker.shells.nodes import agent_dir
from tests.processes import agent_task_processes
from tests.sshd import TestSshd
from tests.test_live_instances import remote_root  # noqa: F401 - a fixture: no remote agent may outlive a test
from tests.test_dryrun import REPO, query
from tests.test_resume import (  # noqa: F401 - run_dir is a fixture
    assert_every_task_done_once,
    assert_nothing_left,
    committed,
    journal_events,
    run_dir,
    wait_for,
)

INVENTORY = """\
private:
  - name: local
    local: true
    slots: 1
    speed: 1.0
aws:
  region: us-east-1
  billing: hourly
  types:
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 0.085
      limit: 3
      boot: 3s
    - name: m5.large
      slots: 2
      speed: 1.0
      price: 0.096
      limit: 3
      boot: 3s
"""

BAG = """\
command: "python3 -c 'import time; time.sleep({t}); print({k})'"
sweep:
  t: [T]
  k: [1, 2, 3, 4, 5]
timeout: 60s
retries: 2
"""

TASKS = 10
SCALE = 20.0  # run seconds per wall second
TICK_S = 60.0  # the default monitoring interval, in run time: 3 wall seconds at SCALE
# Where run time is compared with the moment of a kill: an interval of 6 wall seconds, so that
# a loaded machine (a CBC solve holding the loop, an agent's restart) does not eat a tick.
KILL_SCALE = 10.0
GOAL = ("--deadline", "3m")
LONG_TASK_S = 2.0  # wall seconds: 40 s of run time, most of a tick


def write_inputs(tmp_path: Path, task_s: float = 0.4) -> tuple[Path, Path]:
    inv, bag = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(INVENTORY)
    bag.write_text(BAG.replace("[T]", f"[{task_s}, {task_s + 0.1}]"))
    return inv, bag


def run_args(inv: Path, bag: Path, run_dir: Path, *goal: str, scale: float = SCALE) -> list[str]:
    return ["run", "--dry-run", "--yes", *(goal or GOAL), "--tick", f"{TICK_S:g}s", "--time-scale", f"{scale:g}",
            "--inventory", str(inv), str(bag), "--run-dir", str(run_dir)]


def _env(faults: str | None, keep_moto: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BROKER_CRASH_AT", "BROKER_DRY_RUN_KEEP_MOTO", "BROKER_DRY_RUN_FAULTS")}
    env["PYTHONPATH"] = str(REPO)
    if faults:
        env["BROKER_DRY_RUN_FAULTS"] = faults
    if keep_moto:
        env["BROKER_DRY_RUN_KEEP_MOTO"] = "1"
    return env


def broker(*args: str, faults: str | None = None, keep_moto: bool = False,
           timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s, env=_env(faults, keep_moto))


def start_broker(*args: str, faults: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(faults, False))


def events(run_dir: Path, name: str | None = None) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if name is None or e["event"] == name]


def wall_s(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def moto_by_token(run_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Every instance the run's moto server holds under the run's tag (terminated ones too),
    by the launch's client token: token -> [(instance id, state)]."""
    run_id = query(run_dir, "SELECT id FROM run")[0][0]
    server = find_moto_server(run_dir)
    assert server is not None, "the run's moto server is gone (keep_moto=True keeps it)"
    with fake_aws_environment(DEFAULT_REGION):
        pages = server_client(server, DEFAULT_REGION).describe_instances(
            Filters=[{"Name": "tag:broker:run", "Values": [run_id]}])
    out: dict[str, list[tuple[str, str]]] = {}
    for r in pages["Reservations"]:
        for i in r["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", ())}
            out.setdefault(tags.get("broker:client-token", "?"), []).append((i["InstanceId"], i["State"]["Name"]))
    return out


def assert_ec2_matches_the_journal(run_dir: Path) -> None:
    """No launch doubled, none orphaned: moto's instances under the run's tag are exactly the
    journal's, each launch's token holds at most what it asked for, all terminated."""
    in_moto = moto_by_token(run_dir)
    ids = {i for group in in_moto.values() for i, _ in group}
    journal = {i for (i,) in query(run_dir, "SELECT id FROM instances")}
    assert ids == journal, f"EC2 and the journal disagree: {sorted(ids ^ journal)}"
    asked = {json.loads(p)["client_token"]: json.loads(p)["count"]
             for (p,) in query(run_dir, "SELECT payload FROM actions WHERE kind = 'launch'")}
    for token, group in in_moto.items():
        assert token in asked, f"instances under an unknown token {token}: {group}"
        assert len(group) <= asked[token], f"launch {token} asked {asked[token]}, EC2 holds {group}"
    assert {s for group in in_moto.values() for _, s in group} == {"terminated"}


def assert_retries_bounded(run_dir: Path, retries: int = 2) -> None:
    """No task started more than once beyond its retries (cancelled tail replicas aside)."""
    rows = query(run_dir, "SELECT task_id, count(*) FROM attempts WHERE outcome <> 'cancelled' GROUP BY task_id")
    assert max(n for _, n in rows) <= retries + 1, rows


def injected(run_dir: Path) -> list[tuple[str, str]]:
    return [(e["operation"], e["kind"]) for e in events(run_dir, "fault.injected")]


# -- EC2 faults -------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "kind"), [("insufficient_capacity:c5.large:1", "capacity"),
                                             ("InstanceLimitExceeded:c5.large:1", "limit")])
def test_a_type_refused_for_capacity_or_limit_is_avoided_and_the_run_replans_onto_another(
        tmp_path, run_dir, spec, kind):
    # Tasks long enough that the private slot cannot finish the bag before the next tick:
    # the broker never buys more slots than there are pending tasks, so with half-second
    # tasks there is nothing left to re-plan for by then.
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults=spec, keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir) == [("RunInstances", kind)]
    [failed] = events(run_dir, "instance.launch_failed")
    assert (failed["type"], failed["kind"], failed["launched"]) == ("c5.large", kind, 0)
    [avoided] = events(run_dir, "instance.type_avoided")
    assert avoided["type"] == "c5.large" and avoided["kind"] == kind
    launched = events(run_dir, "instance.launch")
    assert launched and {e["type"] for e in launched} == {"m5.large"}  # re-planned onto the other type
    # Launches run off the loop: the m5.large one ordered with (or after) the refused one may be
    # answered first. What must hold: it was ordered no earlier than the refused launch.
    [refused_at] = query(run_dir, "SELECT created_at FROM actions WHERE kind = 'launch' AND state = 'failed'")[0]
    assert max(at for (at,) in query(run_dir, "SELECT created_at FROM actions WHERE kind = 'launch' "
                                              "AND payload LIKE '%m5.large%'")) >= refused_at
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)
    assert_nothing_left(run_dir)


def test_throttles_timeouts_and_lost_responses_are_retried_and_never_launch_twice(tmp_path, run_dir):
    # Tasks whose sleeps alone (10 x 40 s of run time) overrun the deadline on the one private
    # slot, so that the plan must rent however fast the machine is: with half-second tasks an
    # idle machine finished the bag on the private slot and nothing was launched (CI, once).
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    spec = ("throttle:RunInstances:2,timeout:RunInstances:1,lost_response:RunInstances:1,"
            "request_limit:TerminateInstances:1,timeout:TerminateInstances:1")
    done = broker(*run_args(inv, bag, run_dir), faults=spec, keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir) == [("RunInstances", "throttle"), ("RunInstances", "throttle"),
                                 ("RunInstances", "read_timeout"), ("RunInstances", "lost_response"),
                                 ("TerminateInstances", "throttle"), ("TerminateInstances", "read_timeout")]
    # Launches run off the loop, several at once, so the four faulted attempts may fall on
    # different launches: each launch succeeded on its last attempt, and the one after the lost
    # response found the instances launched under its client token instead of launching them again.
    runs = events(run_dir, "aws.run_instances")
    assert sum(e["attempts"] for e in runs) == len(runs) + 4
    assert any(e["reused"] for e in runs) and all(e["launched"] == e["requested"] for e in runs)
    retried = [e["code"] for e in events(run_dir, "aws.retry") if e["operation"] == "run_instances"]
    assert sorted(retried) == ["ReadTimeoutError", "ReadTimeoutError", "RequestLimitExceeded", "RequestLimitExceeded"]
    assert sorted(e["code"] for e in events(run_dir, "aws.retry") if e["operation"] == "terminate_instances") == [
        "ReadTimeoutError", "RequestLimitExceeded"]
    assert events(run_dir, "instance.launch_failed") == [] and events(run_dir, "instance.terminate_failed") == []
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)  # the lost response's instances were not launched again
    assert_nothing_left(run_dir)


def _run_s(e: dict, start: float) -> float:
    return (wall_s(e) - start) * SCALE


def test_instances_hidden_by_eventual_consistency_are_neither_lost_nor_recorded_terminated_early(
        tmp_path, run_dir):
    """EC2 hides each new instance from describe and refuses to terminate it for 150 s of run
    time (two and a half ticks; tasks of 100 s keep the instances busy past that): the daemon
    must not call it gone, nor record it terminated before EC2 could have confirmed it; it
    asks again until EC2 does."""
    hide_s = 150.0
    inv, bag = write_inputs(tmp_path, task_s=5.0)
    done = broker(*run_args(inv, bag, run_dir), faults=f"eventual:{hide_s:g}", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    hidden = [e for e in events(run_dir, "fault.injected") if e["kind"] == "eventual"]
    launches = {e["instance_id"]: e for e in events(run_dir, "instance.launch")}
    assert launches and {e["detail"].split()[0] for e in hidden} == set(launches)  # the fault fired, for each
    assert not [e for e in events(run_dir, "node.lost") if "not listed" in e["reason"]]
    for e in events(run_dir, "instance.terminated"):  # EC2 confirms only once it lists the instance
        assert _run_s(e, wall_s(launches[e["instance_id"]])) >= hide_s - 1.0, e
    assert {e["instance_id"] for e in events(run_dir, "instance.terminated")} == set(launches)
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_a_launch_retried_after_a_lost_response_while_ec2_hides_it_is_answered_by_its_token(tmp_path, run_dir):
    """The retry's look-up by token finds nothing (EC2 does not list the new instances yet):
    only EC2's idempotency, which the dry run emulates and moto lacks, keeps the retried
    RunInstances from launching a second set."""
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="lost_response:RunInstances:1,eventual:90", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    kinds = [k for op, k in injected(run_dir) if op == "RunInstances"]
    assert kinds[:2] == ["lost_response", "idempotent"], kinds  # the retry was answered from the token
    first = events(run_dir, "aws.run_instances")[0]
    assert (first["attempts"], first["reused"], first["launched"]) == (2, False, first["requested"])
    assert events(run_dir, "instance.launch_failed") == []
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)  # the lost response's instances were not launched again
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_an_instance_stuck_pending_is_seen_pending_and_left_terminated(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="stuck_pending:1", keep_moto=True)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    stuck = [e for e in events(run_dir, "fault.injected") if e["kind"] == "stuck_pending"]
    assert [e["operation"] for e in stuck][0] == "RunInstances"
    assert "DescribeInstances" in {e["operation"] for e in stuck}, stuck  # EC2 was asked, and said pending
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)  # terminated, pending or not
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_an_ec2_outage_from_the_first_launch_loses_nothing_and_leaves_nothing_billing(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)
    done = broker(*run_args(inv, bag, run_dir), faults="outage:600", keep_moto=True, timeout_s=600.0)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    outage = [e for e in events(run_dir, "fault.injected") if e["kind"] == "outage"]
    assert outage and outage[0]["operation"] == "RunInstances"
    assert {e["code"] for e in events(run_dir, "aws.retry")} >= {"EndpointConnectionError"}
    assert_every_task_done_once(run_dir, TASKS)
    in_moto = moto_by_token(run_dir)  # the run may or may not have launched once EC2 was back
    assert {i for g in in_moto.values() for i, _ in g} == {i for (i,) in query(run_dir, "SELECT id FROM instances")}
    assert {s for g in in_moto.values() for _, s in g} <= {"terminated"}
    assert_nothing_left(run_dir)


def test_a_partial_launch_is_topped_up_on_another_type(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=LONG_TASK_S)  # see the test above
    done = broker(*run_args(inv, bag, run_dir), faults="partial:c5.large", keep_moto=True)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    assert injected(run_dir) == [("RunInstances", "partial")]
    [short] = events(run_dir, "instance.launch_failed")
    assert short["kind"] == "partial" and short["type"] == "c5.large"
    assert 0 < short["launched"] < short["requested"]
    by_type: dict[str, int] = {}
    for e in events(run_dir, "instance.launch"):
        by_type[e["type"]] = by_type.get(e["type"], 0) + 1
    assert by_type.get("c5.large") == short["launched"]  # what did launch was kept and used
    assert by_type.get("m5.large", 0) >= 1  # the missing ones were re-planned onto the other type
    assert_every_task_done_once(run_dir, TASKS)
    assert_ec2_matches_the_journal(run_dir)
    assert_nothing_left(run_dir)


def test_under_a_budget_every_fault_together_never_spends_past_it(tmp_path, run_dir):
    budget = 0.25
    inv, bag = write_inputs(tmp_path)
    # Twenty tasks, not ten: with ten, sampling on the private slot sometimes left so few
    # that the plan bought one c5.large, which no "partial" fault can cut short (CI, once).
    bag.write_text(bag.read_text().replace("k: [1, 2, 3, 4, 5]", "k: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"))
    # The first launch is throttled, its retry launches half (the type is then avoided), and
    # the first termination times out (retried).
    spec = "throttle:RunInstances:1,partial:c5.large:1,lost_response:RunInstances:1,timeout:TerminateInstances:1"
    done = broker(*run_args(inv, bag, run_dir, "--budget", f"{budget}"), faults=spec, keep_moto=True)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert {("RunInstances", "throttle"), ("RunInstances", "partial"), ("TerminateInstances", "read_timeout")} <= set(
        injected(run_dir))
    spends = [e["committed_usd"] for e in events(run_dir, "instance.terminated")]
    spends += [e["committed_usd"] for e in events(run_dir, "budget.stop")]
    assert max(spends + [committed(run_dir)]) <= budget + 1e-9
    settled = query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state")
    if done.returncode == 0:
        assert_every_task_done_once(run_dir, 2 * TASKS)
    else:  # the budget stopped the cloud: what is left was not lost, it is pending
        assert events(run_dir, "budget.stop"), settled
    assert_ec2_matches_the_journal(run_dir)
    assert_nothing_left(run_dir)


def test_a_bad_fault_spec_is_refused_before_anything_starts(tmp_path):
    inv, bag = write_inputs(tmp_path)
    target = tmp_path / "run"
    for spec, message in [("melted:c5.large", "unknown fault kind 'melted'"),
                          ("insufficient_capacity:c5.lrage", "instance type 'c5.lrage' is not in"),
                          ("capacity:DescribeInstances", "can only be injected into RunInstances")]:
        out = broker(*run_args(inv, bag, target), faults=spec)
        assert out.returncode == 2 and message in out.stderr and "BROKER_DRY_RUN_FAULTS" in out.stderr, out.stderr
        assert not target.exists()
    live = broker("run", "--yes", "--deadline", "3m", "--inventory", str(inv), str(bag), "--run-dir", str(target),
                  faults="throttle")
    assert live.returncode == 2 and "dry runs only" in live.stderr and not target.exists()


# -- agents killed ----------------------------------------------------------------------------

def _running_on(run_dir: Path, kind: str) -> list[tuple[str, int, str]]:
    """(task, attempt, node) running on a private node (``local``) or on an instance."""
    join = "JOIN instances i ON i.id = a.node" if kind == "instance" else ""
    where = "" if kind == "instance" else "AND a.node = 'local'"
    return query(run_dir, f"SELECT a.task_id, a.attempt, a.node FROM attempts a {join} "
                          f"WHERE a.outcome = 'running' {where} ORDER BY a.started_at")


@pytest.mark.parametrize("kind", ["local", "instance"])
def test_a_killed_agent_has_its_tasks_requeued_within_one_tick_and_each_done_once(tmp_path, run_dir, kind):
    inv, bag = write_inputs(tmp_path, task_s=2.0)
    proc = start_broker(*run_args(inv, bag, run_dir, scale=KILL_SCALE))
    try:
        wait_for(proc, run_dir, lambda: _running_on(run_dir, kind), f"a task running on an {kind} node")
        victim = _running_on(run_dir, kind)[0][2]
        state_dir = agent_dir(run_dir, victim)
        pid = local_agent_pid(state_dir)
        assert pid is not None, f"no agent serves {state_dir}"
        running = {(t, a) for t, a, n in _running_on(run_dir, kind) if n == victim}
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        for orphan in agent_task_processes(agent_dir(run_dir, "")):  # tasks of the killed agent
            try:
                os.kill(orphan, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0 or late_but_done(out), err[-3000:]
    outcome = {(t, a): o for t, a, o in query(run_dir, "SELECT task_id, attempt, outcome FROM attempts")}
    cut = {key for key in running if outcome[key] != "ok"}  # not finished just before the kill
    assert cut, f"the kill should cut an attempt short: {running} -> {[outcome[k] for k in running]}"
    failed = {(e["task"], e["attempt"]): e for e in events(run_dir, "task.failed") if e["node"] == victim}
    for task, attempt in cut:
        assert outcome[(task, attempt)] in ("lost", "failed")
        event = failed[(task, attempt)]
        assert not event["final"] and event["retries_left"] >= 1
        # Back in the pool within one monitoring interval of the kill (run time = wall x scale).
        print(f"{kind}: {task}/{attempt} back in the pool {(wall_s(event) - killed_at) * KILL_SCALE:.1f} run-s "
              f"({wall_s(event) - killed_at:.2f} wall s) after the kill; tick {TICK_S:g} s")
        assert (wall_s(event) - killed_at) * KILL_SCALE <= TICK_S, (event, killed_at)
        [(counted,)] = query(run_dir, f"SELECT done_attempt FROM tasks WHERE id = '{task}'")
        assert counted > attempt
    reattached = [e for e in events(run_dir, "agent.reattached") if e["node"] == victim]
    assert reattached, "the broken link should be re-attached (a fresh agent on the same state dir)"
    assert_every_task_done_once(run_dir, TASKS)
    assert_retries_bounded(run_dir)
    assert_nothing_left(run_dir)


# -- a poison task ----------------------------------------------------------------------------

TWO_NODES = """\
private:
  - name: node-a
    local: true
    slots: 1
  - name: node-b
    local: true
    slots: 1
"""


def test_a_task_failing_alike_on_two_nodes_is_quarantined_with_its_stderr_kept_and_reported(tmp_path, run_dir):
    inv, bag = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(TWO_NODES)
    poison = "sh -c 'echo poison-7 cannot open /data/x.bin >&2; exit 3'"
    (tmp_path / "tasks.txt").write_text("sleep 0.3\n" * 6 + poison + "\n")
    bag.write_text("name: poison\ntasks_file: tasks.txt\ntimeout: 30s\nretries: 4\n")
    done = broker("run", "--dry-run", "--yes", "--deadline", "10m", "--tick", "60s", "--time-scale", "20",
                  "--inventory", str(inv), str(bag), "--run-dir", str(run_dir))
    assert done.returncode == 1, done.stderr[-3000:]  # a task failed
    task = "t000007"
    [event] = [e for e in events(run_dir, "task.quarantined")]
    assert event["task"] == task and "poison-7 cannot open /data/x.bin" in event["stderr_tail"]
    assert event["reason"] == "exit code 3 on 2 nodes (node-a, node-b)"
    # Fewer attempts than its retries allow (5): the same error on a second node was enough
    # (where the retry lands is up to the pool, so it may have failed twice on one node first).
    attempts = query(run_dir, f"SELECT node, outcome, exit_code, stderr_tail FROM attempts WHERE task_id = '{task}'")
    n = event["failures"]
    assert len(attempts) == n and 2 <= n < 5 and {a[0] for a in attempts} == {"node-a", "node-b"}
    assert all(a[1] == "failed" and a[2] == 3 and "poison-7" in a[3] for a in attempts)
    [(state, note)] = query(run_dir, f"SELECT state, note FROM tasks WHERE id = '{task}'")
    assert state == "quarantined" and "exit code 3 on 2 nodes" in note and "poison-7 cannot open" in note
    assert journal_events(run_dir, "task.quarantined") == [{k: v for k, v in event.items()
                                                             if k not in ("event", "level", "timestamp", "run_id")}]
    # The final report and `broker report` say what was given up and why, with the task's stderr.
    for text in (done.stdout, broker("report", str(run_dir)).stdout):
        assert f"failed {task} after {n} attempts: exit code 3" in text
        assert "quarantined: exit code 3 on 2 nodes (node-a, node-b)" in text
        assert "last stderr: poison-7 cannot open /data/x.bin" in text
    as_json = json.loads(broker("report", "--json", str(run_dir)).stdout)
    [failed] = as_json["failed_tasks"]
    assert failed["task"] == task and failed["quarantined"] == event["reason"]
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state ORDER BY state") == [
        ("done", 6), ("quarantined", 1)]
    assert_nothing_left(run_dir)


# -- an SSH link dropped ----------------------------------------------------------------------

@pytest.mark.sshd
def test_a_dropped_ssh_link_to_a_private_node_is_reattached_and_loses_nothing(
        sshd: TestSshd, tmp_path, run_dir, remote_root, monkeypatch, capsys):  # noqa: F811
    """A private node over real SSH (the test sshd on 127.0.0.1); its connections are cut
    (sshd's per-connection processes SIGKILLed, as a network drop would) while tasks run.
    The agent daemon on the node outlives the link: the broker reconnects, the agent replays
    what finished meanwhile, and every attempt running at the drop completes as itself."""
    from broker.cli import main
    from broker.shells import nodes

    monkeypatch.setattr(nodes, "SshAgents", functools.partial(
        nodes.SshAgents, known_hosts_path=str(sshd.known_hosts_path), remote_root=str(remote_root)))
    inv, bag = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(f"private:\n  - name: far\n    host: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
                   f"    key: {sshd.client_key_path}\n    slots: 2\n")
    bag.write_text("command: \"python3 -c 'import time; time.sleep({t}); print({k})'\"\n"
                   "sweep:\n  t: [1.0]\n  k: [1, 2, 3, 4, 5, 6]\ntimeout: 60s\nretries: 2\n")
    dropped: dict = {}

    def drop_while_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                running = query(run_dir, "SELECT task_id, attempt FROM attempts WHERE outcome = 'running'")
            except Exception:  # noqa: BLE001 - the journal may not exist yet
                running = []
            if running:
                time.sleep(0.2)  # well inside the 1 s tasks
                dropped["running"] = set(query(run_dir, "SELECT task_id, attempt FROM attempts "
                                                        "WHERE outcome = 'running'"))
                dropped["killed"] = sshd.drop_connections()
                return
            time.sleep(0.05)

    dropper = threading.Thread(target=drop_while_running, daemon=True)
    dropper.start()
    rc = main(["run", "--dry-run", "--yes", "--deadline", "10m", "--tick", "60s", "--time-scale", "20",
               "--inventory", str(inv), str(bag), "--run-dir", str(run_dir)])
    dropper.join(timeout=10)
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert dropped.get("killed", 0) >= 1 and dropped["running"], "the link should be cut while tasks run"
    lost = [e for e in events(run_dir, "agent.lost") if e["node"] == "far"]
    reattached = [e for e in events(run_dir, "agent.reattached") if e["node"] == "far"]
    assert lost and reattached and reattached[0]["running"] >= 1
    assert len([e for e in events(run_dir, "ssh.connect") if e["port"] == sshd.port]) >= 2
    # Nothing was lost: no attempt failed, and each attempt cut off from the broker is its task's counted one.
    assert events(run_dir, "task.failed") == [] and events(run_dir, "node.lost") == []
    counted = dict(query(run_dir, "SELECT id, done_attempt FROM tasks"))
    assert all(counted[task] == attempt for task, attempt in dropped["running"])
    assert query(run_dir, "SELECT count(*) FROM attempts") == [(6,)]
    assert_every_task_done_once(run_dir, 6)
    assert_nothing_left(run_dir)


def test_a_fault_spec_reads_kinds_by_any_name_and_targets_types_or_operations():
    from broker.shells.faults import FaultKind, SpecFaultInjector, parse_fault_spec

    entries = parse_fault_spec("InsufficientInstanceCapacity:c5.large:2, throttle:DescribeInstances, timeout")
    assert [(e.kind, e.target, e.times) for e in entries] == [
        (FaultKind.CAPACITY, "c5.large", 2), (FaultKind.THROTTLE, "DescribeInstances", 1),
        (FaultKind.READ_TIMEOUT, None, 1)]
    injector = SpecFaultInjector(entries)
    draw = injector._draw
    assert draw("RunInstances", 0, {"InstanceType": "m5.large", "MaxCount": 1}) is FaultKind.READ_TIMEOUT
    assert draw("RunInstances", 1, {"InstanceType": "m5.large", "MaxCount": 1}) is None  # timeout used up
    assert draw("RunInstances", 2, {"InstanceType": "c5.large", "MaxCount": 1}) is FaultKind.CAPACITY
    assert draw("TerminateInstances", 0, {}) is None
    assert draw("DescribeInstances", 0, {}) is FaultKind.THROTTLE
    assert draw("DescribeInstances", 1, {}) is None
    assert draw("RunInstances", 3, {"InstanceType": "c5.large", "MaxCount": 1}) is FaultKind.CAPACITY
    assert draw("RunInstances", 4, {"InstanceType": "c5.large", "MaxCount": 1}) is None
    assert entries[0].times == 2  # the injector counts on its own copy
    partial = SpecFaultInjector(parse_fault_spec("partial"))
    assert partial._draw("RunInstances", 0, {"MaxCount": 1}) is None  # waits for a launch of two or more
    assert partial._draw("RunInstances", 1, {"MaxCount": 4}) is FaultKind.PARTIAL
    for bad in ["", "melted", "throttle:x:y:z", "throttle:0", "throttle:c5.large:many", "partial:DescribeInstances",
                "throttle:describe"]:
        with pytest.raises(ValueError, match="BROKER_DRY_RUN_FAULTS"):
            parse_fault_spec(bad)


# -- every instance lost at once --------------------------------------------------------------

CLOUD_ONLY = """\
aws:
  region: us-east-1
  billing: hourly
  types:
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 0.085
      limit: 3
      boot: 3s
"""


def test_losing_every_instance_at_once_does_not_end_a_run_the_budget_can_still_pay(tmp_path, run_dir):
    """No private node: when the whole fleet is terminated from outside, nothing runs and no
    node is left. The run must not give up while the budget can pay: it waits for a re-plan,
    launches again and finishes, within the budget."""
    budget = 0.5
    inv, bag, gate = tmp_path / "inv.yaml", tmp_path / "bag.yaml", tmp_path / "gate"
    inv.write_text(CLOUD_ONLY)
    # The fleet must still have work when the test terminates it. Tasks of a given length
    # did not ensure it: a loaded machine let the bag finish first (the broker released the
    # instances itself and none was ever lost). So a task started once the run has planned
    # waits for the gate the test opens after the termination; sampling is not held up.
    task = tmp_path / "task.sh"
    task.write_text(f"if grep -q '\"plan.solved\"' {run_dir / 'events.jsonl'}; then\n"
                    f"  while [ ! -e {gate} ]; do sleep 0.05; done\nfi\nsleep $1 && echo $2\n")
    bag.write_text(f'command: "sh {task} {{t}} {{k}}"\nsweep:\n  t: [2.0, 2.1]\n  k: [1, 2, 3, 4, 5]\n'
                   "timeout: 60s\nretries: 3\n")
    proc = start_broker("run", "--dry-run", "--yes", "--budget", f"{budget}", "--tick", "60s",
                        "--inventory", str(inv), str(bag), "--run-dir", str(run_dir))
    try:
        def planned_fleet_busy():  # tasks running on the fleet of the first plan (sampling is over)
            return query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running' AND started_at > "
                                  "(SELECT min(at) FROM events WHERE name = 'plan.solved')")[0][0] > 0

        wait_for(proc, run_dir, planned_fleet_busy, "tasks running on the planned fleet")
        victims = [i for (i,) in query(run_dir, "SELECT id FROM instances WHERE state <> 'terminated'")]
        with fake_aws_environment(DEFAULT_REGION):
            server_client(find_moto_server(run_dir), DEFAULT_REGION).terminate_instances(InstanceIds=victims)
        gate.touch()
        out, err = proc.communicate(timeout=180)
    finally:
        gate.touch()  # no task is left waiting, whatever happened
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0 or late_but_done(out), out[-2000:] + err[-2000:]
    lost = {e["node"] for e in events(run_dir, "node.lost")}
    assert set(victims) <= lost
    last_loss = max(wall_s(e) for e in events(run_dir, "node.lost"))
    relaunched = [e for e in events(run_dir, "instance.launch") if wall_s(e) > last_loss]
    assert relaunched, "the run should launch again after losing its whole fleet"
    assert_every_task_done_once(run_dir, TASKS)
    assert committed(run_dir) <= budget + 1e-9
    assert_nothing_left(run_dir)
