"""Resuming a killed or left dry run, reconciling with EC2 by tag, and stopping it.

Every test runs the real ``broker run`` in a subprocess against its run directory's moto
server (a process of its own that outlives a killed daemon), kills it at an exact point
with ``BROKER_CRASH_AT`` (a SIGKILL it sends itself, see broker/shells/crashpoints.py) or
with a signal, and reads what is left: the journal, the moto server, the process table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.cli.verdict import late_but_done  # a late end exits 1 (issue 16); these tests check other things
from broker.shells.moto_world import DEFAULT_REGION, fake_aws_environment, find_moto_server, server_client
from tests.test_dryrun import REPO, agent_pids, query

sys.path.insert(0, str(REPO / "bench"))
import bench_crash  # noqa: E402

INVENTORY = bench_crash.INVENTORY  # one instance type, one local slot: the crash chains' too

BAG = """\
command: "python3 -c 'import time; time.sleep({t}); print({k})'"
sweep:
  t: [T]
  k: [1, 2, 3, 4, 5]
timeout: 30s
retries: 2
"""

GOAL = ("--deadline", "2m", "--tick", "10s")


def write_inputs(tmp_path: Path, task_s: float = 0.4) -> tuple[Path, Path]:
    inv, bag = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(INVENTORY)
    bag.write_text(BAG.replace("[T]", f"[{task_s}, {task_s + 0.1}]"))
    return inv, bag


def run_args(inv: Path, bag: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["run", "--dry-run", "--yes", *GOAL, "--inventory", str(inv), str(bag), "--run-dir", str(run_dir), *extra]


def broker(*args: str, crash: str | None = None, keep_moto: bool = False,
           timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("BROKER_CRASH_AT", None)
    env.pop("BROKER_DRY_RUN_KEEP_MOTO", None)
    if crash:
        env["BROKER_CRASH_AT"] = crash
    if keep_moto:
        env["BROKER_DRY_RUN_KEEP_MOTO"] = "1"
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s, env=env)


def start_broker(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_CRASH_AT", "BROKER_DRY_RUN_KEEP_MOTO")}
    return subprocess.Popen([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "PYTHONPATH": str(REPO)})


def journal_events(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(f) for (f,) in query(run_dir, f"SELECT fields FROM events WHERE name = '{name}' ORDER BY seq")]


def wait_for(proc: subprocess.Popen, run_dir: Path, predicate, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "journal.sqlite").exists():
            try:
                if predicate():
                    return
            except Exception:  # noqa: BLE001 - the journal may not have its tables yet
                pass
        assert proc.poll() is None, f"broker run ended before {what}:\n{proc.stderr.read()[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout_s} s")


def moto_instances(run_dir: Path, run_id: str) -> dict[str, str]:
    """Instance id -> state, as the run's moto server lists them under the run's tag."""
    server = find_moto_server(run_dir)
    assert server is not None, "the run's moto server is gone"
    with fake_aws_environment(DEFAULT_REGION):
        ec2 = server_client(server, DEFAULT_REGION)
        pages = ec2.describe_instances(Filters=[{"Name": "tag:broker:run", "Values": [run_id]}])
    return {i["InstanceId"]: i["State"]["Name"] for r in pages["Reservations"] for i in r["Instances"]}


def alive(states: dict[str, str]) -> list[str]:
    return [i for i, s in states.items() if s not in ("terminated", "shutting-down")]


def committed(run_dir: Path) -> float:
    from broker.shells.journal import Journal

    with Journal.open(run_dir, readonly=True) as j:
        return j.committed_usd(j.latest_time_s())


def assert_every_task_done_once(run_dir: Path, tasks: int) -> None:
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state") == [("done", tasks)]
    done = [e["task"] for e in journal_events(run_dir, "task.done")]
    assert sorted(done) == sorted(set(done)) and len(done) == tasks, f"task.done recorded more than once: {done}"
    # No task started again after its counted attempt had ended.
    assert query(run_dir, """
        SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
        JOIN attempts d ON d.task_id = t.id AND d.attempt = t.done_attempt
        WHERE a.attempt <> d.attempt AND a.started_at > d.ended_at""") == [(0,)]


def assert_nothing_left(run_dir: Path) -> None:
    assert query(run_dir, "SELECT DISTINCT state FROM instances") in ([("terminated",)], [])
    assert query(run_dir, "SELECT count(*) FROM actions WHERE state = 'intended'") == [(0,)]
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'") == [(0,)]
    deadline = time.monotonic() + 5.0
    while agent_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not agent_pids(run_dir)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory; whatever a failed test left running for it is brought down after."""
    directory = tmp_path / "run"
    yield directory
    if directory.exists():
        subprocess.run([sys.executable, "-m", "broker", "down", str(directory)], cwd=REPO, capture_output=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert find_moto_server(directory) is None
    assert not agent_pids(directory)


def test_killed_daemon_resumes_reattaches_its_agents_and_records_every_task_once(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=1.0)
    killed = broker(*run_args(inv, bag, run_dir), crash="event:task.done:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    running = set(query(run_dir, "SELECT task_id, attempt FROM attempts WHERE outcome = 'running'"))
    assert running, "the kill should land while attempts run"
    assert find_moto_server(run_dir) is not None, "the moto server must outlive the daemon"
    assert agent_pids(run_dir), "the agents must outlive the daemon"
    spend_before = committed(run_dir)
    done_before = {t for (t,) in query(run_dir, "SELECT id FROM tasks WHERE state = 'done'")}

    resumed = broker(*run_args(inv, bag, run_dir))
    assert resumed.returncode == 0 or late_but_done(resumed.stdout), resumed.stderr[-3000:]
    assert "resuming run" in resumed.stdout and "10 done, 0 failed, 0 left of 10" in resumed.stdout
    assert_every_task_done_once(run_dir, 10)
    [resume] = journal_events(run_dir, "run.resume")
    assert resume["done"] == len(done_before) and resume["reattached"] == len(running)
    assert sum(e["attempts"] for e in journal_events(run_dir, "agent.reattached")) == len(running)
    # The attempts that ran through the kill were kept: each is its task's counted attempt.
    counted = dict(query(run_dir, "SELECT id, done_attempt FROM tasks"))
    assert all(counted[task] == attempt for task, attempt in running)
    # Tasks done before the kill were never started again.
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE started_at > (SELECT max(at) FROM events "
                          "WHERE name = 'run.resume') AND task_id IN (%s)" % ",".join(f"'{t}'" for t in done_before)) \
        == [(0,)]
    assert committed(run_dir) >= spend_before > 0
    assert query(run_dir, "SELECT state FROM run") == [("finished",)]
    assert_nothing_left(run_dir)
    assert find_moto_server(run_dir) is None, "the run's end stops its moto server"


def test_instances_launched_before_their_journal_row_are_adopted_and_released(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path)
    killed = broker(*run_args(inv, bag, run_dir), crash="fleet.launch:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_id = query(run_dir, "SELECT id FROM run")[0][0]
    in_ec2 = alive(moto_instances(run_dir, run_id))
    assert in_ec2 and query(run_dir, "SELECT count(*) FROM instances") == [(0,)]
    assert query(run_dir, "SELECT kind, state FROM actions") == [("launch", "intended")]

    resumed = broker(*run_args(inv, bag, run_dir), keep_moto=True)
    assert resumed.returncode == 0 or late_but_done(resumed.stdout), resumed.stderr[-3000:]
    adopted = [e["instance_id"] for e in journal_events(run_dir, "instance.launch") if e["cause"] == "adopted_on_resume"]
    assert sorted(adopted) == sorted(in_ec2)
    assert query(run_dir, "SELECT state FROM actions WHERE seq = 1") == [("done",)]
    assert_every_task_done_once(run_dir, 10)
    assert_nothing_left(run_dir)
    assert alive(moto_instances(run_dir, run_id)) == []
    assert set(adopted) <= {i for (i,) in query(run_dir, "SELECT id FROM instances WHERE state = 'terminated'")}


def test_resume_refuses_other_inputs_and_down_releases_the_killed_run(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path)
    killed = broker(*run_args(inv, bag, run_dir), crash="event:instance.ready:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_id = query(run_dir, "SELECT id FROM run")[0][0]
    assert alive(moto_instances(run_dir, run_id))

    # An edited bag and another goal are resumed (tests/test_resume_edit.py); what remains refused
    # is what continuing would get wrong, each saying why.
    other = tmp_path / "other.yaml"
    other.write_text(bag.read_text() + "setup: 'true'\n")
    refusals = {
        "the bag's setup changed: the run's nodes were set up with the old one": run_args(inv, other, run_dir),
        "it runs at time scale 60, not 30": run_args(inv, bag, run_dir, "--time-scale", "30"),
        "so that deadline has passed": ["run", "--dry-run", "--yes", "--deadline", "1s", "--tick", "10s",
                                        "--inventory", str(inv), str(bag), "--run-dir", str(run_dir)],
        "so that budget is spent": ["run", "--dry-run", "--yes", "--budget", "0.001", "--tick", "10s",
                                    "--inventory", str(inv), str(bag), "--run-dir", str(run_dir)],
    }
    for why, args in refusals.items():
        refused = broker(*args)
        assert refused.returncode == 2 and "cannot resume run" in refused.stderr and why in refused.stderr, \
            refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr
    assert query(run_dir, "SELECT state FROM run") == [("running",)]  # untouched by the refusals
    assert query(run_dir, "SELECT count(*) FROM events WHERE name LIKE 'run.%_changed'") == [(0,)]

    first = broker("down", str(run_dir))
    assert first.returncode == 0, first.stdout + first.stderr
    n = len(query(run_dir, "SELECT id FROM instances"))
    assert f"{n} instance(s) terminated" in first.stdout and "moto server stopped" in first.stdout
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]
    assert_nothing_left(run_dir)
    assert find_moto_server(run_dir) is None
    again = broker("down", str(run_dir))
    assert again.returncode == 0 and "0 instance(s) terminated, 0 agent(s) stopped" in again.stdout


def test_instance_terminated_from_outside_is_lost_and_its_tasks_requeued(tmp_path, run_dir):
    # Tasks of 4 s: the instance must still be running one when the test terminates it (with
    # 2 s tasks a loaded machine saw the run end, and its moto server stop, in between).
    inv, bag = write_inputs(tmp_path, task_s=4.0)
    proc = start_broker(*run_args(inv, bag, run_dir))
    try:
        def busy_instance():
            rows = query(run_dir, "SELECT a.node FROM attempts a JOIN instances i ON i.id = a.node "
                                  "WHERE a.outcome = 'running'")
            return rows[0][0] if rows else None

        wait_for(proc, run_dir, busy_instance, "a task running on an instance")
        victim = busy_instance()
        run_id = query(run_dir, "SELECT id FROM run")[0][0]
        with fake_aws_environment(DEFAULT_REGION):
            server_client(find_moto_server(run_dir), DEFAULT_REGION).terminate_instances(InstanceIds=[victim])
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 or late_but_done(out), err[-3000:]
    lost = [e for e in journal_events(run_dir, "node.lost") if e["node"] == victim]
    assert lost and "terminated outside the broker" in lost[0]["reason"]
    # Its attempts ended as lost and their tasks ran again elsewhere.
    lost_attempts = query(run_dir, f"SELECT task_id FROM attempts WHERE node = '{victim}' AND outcome = 'lost'")
    assert lost_attempts
    for (task,) in lost_attempts:
        assert query(run_dir, f"SELECT a.node FROM tasks t JOIN attempts a ON a.task_id = t.id "
                              f"AND a.attempt = t.done_attempt WHERE t.id = '{task}'")[0][0] != victim
    assert_every_task_done_once(run_dir, 10)
    assert_nothing_left(run_dir)
    assert run_id


def test_on_stop_leave_keeps_the_run_going_and_a_resume_finishes_it(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=1.5)
    proc = start_broker(*run_args(inv, bag, run_dir, "--on-stop", "leave"))
    try:
        wait_for(proc, run_dir, lambda: query(run_dir, "SELECT count(*) FROM attempts a JOIN instances i "
                                                       "ON i.id = a.node WHERE a.outcome = 'running'")[0][0] > 0,
                 "a task running on an instance")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "left the run's instances and agents running" in out
    run_id = query(run_dir, "SELECT id FROM run")[0][0]
    assert query(run_dir, "SELECT state FROM run") == [("running",)]
    assert query(run_dir, "SELECT count(*) FROM actions WHERE state = 'intended'") == [(0,)]
    left = {i for (i,) in query(run_dir, "SELECT id FROM instances WHERE state <> 'terminated'")}
    assert left and left <= set(alive(moto_instances(run_dir, run_id)))
    assert agent_pids(run_dir)
    [event] = journal_events(run_dir, "run.left")
    assert set(event["instances"]) == left

    resumed = broker(*run_args(inv, bag, run_dir))
    assert resumed.returncode == 0 or late_but_done(resumed.stdout), resumed.stderr[-3000:]
    assert_every_task_done_once(run_dir, 10)
    assert_nothing_left(run_dir)
    assert find_moto_server(run_dir) is None


def test_down_after_leave_terminates_in_moto_and_never_shows_a_traceback(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path, task_s=1.5)
    proc = start_broker(*run_args(inv, bag, run_dir, "--on-stop", "leave"))
    try:
        wait_for(proc, run_dir, lambda: query(run_dir, "SELECT count(*) FROM instances WHERE ready_at IS NOT NULL")
                 [0][0] > 0, "an instance ready")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = query(run_dir, "SELECT id FROM run")[0][0]
    left = alive(moto_instances(run_dir, run_id))
    assert left
    os.environ["BROKER_DRY_RUN_KEEP_MOTO"] = "1"  # not read by down: it always stops the server
    try:
        down = broker("down", str(run_dir))
    finally:
        del os.environ["BROKER_DRY_RUN_KEEP_MOTO"]
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"{len(left)} instance(s) terminated" in down.stdout and "moto server stopped" in down.stdout
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]
    assert_nothing_left(run_dir)

    # A journal cut to garbage, a journal with no run, a directory that is no run: one line each.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "journal.sqlite").write_bytes(b"not a journal at all" * 100)
    out = broker("down", str(broken))
    assert out.returncode == 1 and "could not be used" in out.stdout and "Traceback" not in out.stderr
    from broker.shells.journal import Journal

    empty = tmp_path / "empty"
    Journal.open(empty).close()
    out = broker("down", str(empty))
    assert out.returncode == 0 and "holds no run" in out.stdout and "Traceback" not in out.stderr
    out = broker("down", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "no journal in" in out.stderr and "Traceback" not in out.stderr


def test_down_after_the_moto_server_died_too(tmp_path, run_dir):
    inv, bag = write_inputs(tmp_path)
    killed = broker(*run_args(inv, bag, run_dir), crash="event:instance.ready:1")
    assert killed.returncode == -signal.SIGKILL
    server = find_moto_server(run_dir)
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while find_moto_server(run_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    down = broker("down", str(run_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "moto server is gone" in down.stdout and "Traceback" not in down.stderr
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]
    assert_nothing_left(run_dir)
