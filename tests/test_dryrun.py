"""``broker run --dry-run`` end to end: moto for EC2, local agents for instances, real tasks.

Each test runs the real command in a subprocess (its own signals, logging and environment)
with a temporary run directory, then reads what it left: the journal, events.jsonl, and the
process table (no agent may outlive its run).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.cli.verdict import late_but_done

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "inventory.yaml"
SWEEP = REPO / "examples" / "sweep.yaml"


def broker(*args: str, stdin=subprocess.DEVNULL, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], cwd=REPO, stdin=stdin, capture_output=True, text=True,
        timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def start_broker(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def events(run_dir: Path, name: str | None = None, key: str | None = None) -> list[dict]:
    """The run's events (optionally one name, optionally only those carrying ``key``)."""
    found = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if (name is None or e["event"] == name) and (key is None or key in e):
            found.append(e)
    return found


def query(run_dir: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def agent_pids(run_dir: Path) -> list[int]:
    """Processes whose command line names this run directory (agents and their bridges)."""
    marker = str(run_dir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"agent.py" in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def run_dir(tmp_path):
    """A run directory; the test fails if any agent started for it is still alive at the end."""
    directory = tmp_path / "run"
    yield directory
    deadline = time.monotonic() + 5.0
    while agent_pids(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = agent_pids(directory)
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leaked, f"agent processes outlived the run: {leaked}"


def wait_for_event(proc: subprocess.Popen, run_dir: Path, name: str, key: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "events.jsonl").exists():
            found = events(run_dir, name, key)
            if found:
                return found[0]
        assert proc.poll() is None, f"broker run ended early:\n{proc.stderr.read()[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {name} event within {timeout_s} s")


def test_sweep_runs_every_task_once_and_terminates_every_instance(run_dir):
    # A budget, not a deadline: the run buys instances whatever the machine's speed, and a
    # budget is kept however loaded the machine is (a dry run at 60x on a loaded machine can
    # miss a 6-minute deadline by minutes, and a missed deadline exits 1, as it should).
    done = broker("run", "--dry-run", "--yes", "--budget", "0.5", "--inventory", str(INVENTORY), str(SWEEP),
                  "--run-dir", str(run_dir))
    # a loaded machine makes a dry run late (its clock runs 60x the wall): that exits 1, and is all it may do
    assert done.returncode == 0 or late_but_done(done.stdout), done.stderr[-3000:]
    # The plan table came before the launch question, and the report at the end.
    out = done.stdout
    assert out.index("makespan") < out.index("Launch ") < out.index("proposed")
    assert "40 done, 0 failed, 0 left of 40" in out

    # Every task done exactly once: in the journal and in the events.
    states = query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state")
    assert states == [("done", 40)]
    assert query(run_dir, "SELECT count(*) FROM tasks WHERE done_attempt IS NULL") == [(0,)]
    done_events = events(run_dir, "task.done")
    assert sorted(e["task"] for e in done_events) == sorted(r[0] for r in query(run_dir, "SELECT id FROM tasks"))
    for e in done_events:
        assert e["exit_code"] == 0 and e["runtime_s"] > 0 and e["node"] and e["attempt"] >= 1
    assert len(events(run_dir, "sample.done")) == 8  # the controller's sampling phase: a fifth of 40 tasks

    # Every launched instance terminated: journal rows, the terminate intents, the events.
    launched = events(run_dir, "instance.launch", "instance_id")
    assert launched, "the deadline needs instances: none was launched"
    ids = {e["instance_id"] for e in launched}
    assert all(e["type"] and e["cause"] for e in launched)
    assert query(run_dir, "SELECT DISTINCT state FROM instances") == [("terminated",)]
    assert {r[0] for r in query(run_dir, "SELECT id FROM instances")} == ids
    terminate_actions = query(run_dir, "SELECT state, count(*) FROM actions WHERE kind = 'terminate' GROUP BY state")
    assert terminate_actions == [("done", len(ids))]
    terminated = events(run_dir, "instance.terminated", "instance_id")
    assert {e["instance_id"] for e in terminated} == ids
    for e in terminated:
        assert e["at_s"] <= e["paid_until_s"] and e["cost_usd"] > 0 and "committed_usd" in e
    # moto's own record of the TerminateInstances calls (Ec2Fleet logs each successful one).
    assert {i for e in events(run_dir, "aws.terminate_instances", "instance_ids") for i in e["instance_ids"]} == ids
    released = events(run_dir, "instance.release_scheduled")
    assert {e["instance_id"] for e in released} == ids
    assert all(e["at_s"] <= e["paid_until_s"] and e["cause"] for e in released)

    plans = events(run_dir, "plan.solved")
    assert plans and all(p["makespan_s"] > 0 and p["cost_usd"] >= 0 and isinstance(p["fleet"], dict) and p["cause"]
                         for p in plans)
    run_done = events(run_dir, "run.done")[-1]
    assert run_done["state"] == "finished" and run_done["planned_makespan_s"] == plans[0]["makespan_s"]
    assert query(run_dir, "SELECT state FROM run") == [("finished",)]

    # broker down on a finished run: nothing to do, and it says so, twice.
    for _ in range(2):
        down = broker("down", str(run_dir))
        assert down.returncode == 0, down.stderr
        assert "0 instance(s) terminated" in down.stdout


BOUNDARY_INVENTORY = """\
aws:
  region: us-east-1
  billing: hourly
  types:
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 1.0
      limit: 1
      boot: 30s
"""


def test_release_is_timed_to_the_billing_boundary_in_scaled_time(tmp_path, run_dir):
    """Only EC2 capacity, a budget of exactly one hourly unit and more work than it buys: the
    instance must be terminated by its timer at paid-until minus the margin, not later."""
    (tmp_path / "inv.yaml").write_text(BOUNDARY_INVENTORY)
    # Each task sleeps 0.3 wall s = 540 run s; the estimate (700) covers that plus a loaded
    # machine's delays, so "nothing killed by the release" tests the fit rule, not the load.
    rows = ["id,command,estimate_user"] + [f"t{i:02d},sleep 0.3,700" for i in range(20)]
    (tmp_path / "tasks.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "bag.yaml").write_text("csv: tasks.csv\ntimeout: 30s\nretries: 0\n")
    scale, margin_s = 1800.0, 300.0
    done = broker("run", "--dry-run", "--yes", "--budget", "1", "--time-scale", str(scale), "--margin", "5m",
                  "--inventory", str(tmp_path / "inv.yaml"), str(tmp_path / "bag.yaml"), "--run-dir", str(run_dir))
    assert done.returncode == 1, done.stderr[-3000:]  # tasks are left: the budget cannot buy them
    assert events(run_dir, "budget.stop")

    [launch] = events(run_dir, "instance.launch", "instance_id")
    [release] = [e for e in events(run_dir, "instance.release_scheduled") if e["cause"] != "bag_done"]
    [gone] = events(run_dir, "instance.terminated", "instance_id")
    unit_end_s = launch["launched_at_s"] + 3600.0
    assert release["paid_until_s"] == pytest.approx(unit_end_s, abs=1e-3)
    assert release["at_s"] == pytest.approx(unit_end_s - margin_s, abs=1e-3)
    # The timer fired on time: within 0.15 wall seconds (270 run seconds, under the margin).
    assert gone["cause"] == release["cause"]
    assert release["at_s"] <= gone["at_s"] <= release["at_s"] + 0.15 * scale
    assert gone["at_s"] < gone["paid_until_s"] == pytest.approx(unit_end_s, abs=1e-3)
    assert gone["cost_usd"] == pytest.approx(1.0) and gone["committed_usd"] <= 1.0 + 1e-9

    done_tasks = query(run_dir, "SELECT count(*) FROM tasks WHERE state = 'done'")[0][0]
    assert 0 < done_tasks < 20
    # Nothing was killed by the release: the controller only started tasks that fit before it.
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE outcome <> 'ok'") == [(0,)]
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]


def test_refuses_without_yes_when_nobody_can_answer(tmp_path):
    run_dir = tmp_path / "never"
    done = broker("run", "--dry-run", "--inventory", str(INVENTORY), str(SWEEP), "--run-dir", str(run_dir))
    assert done.returncode == 2
    assert "--yes" in done.stderr and "not a terminal" in done.stderr
    assert not run_dir.exists()


SLOW_BAG = """\
command: "sleep {t}"
sweep:
  t: [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
timeout: 30s
"""


def test_interrupt_releases_everything_and_leaves_the_journal_consistent(tmp_path, run_dir):
    (tmp_path / "slow.yaml").write_text(SLOW_BAG)
    proc = start_broker("run", "--dry-run", "--yes", "--deadline", "15m", "--inventory", str(INVENTORY),
                        str(tmp_path / "slow.yaml"), "--run-dir", str(run_dir))
    try:
        wait_for_event(proc, run_dir, "instance.ready", "instance_id")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "user_stop" in out
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'") == [(0,)]
    assert query(run_dir, "SELECT count(*) FROM tasks WHERE state IN ('running', 'sampling')") == [(0,)]
    assert query(run_dir, "SELECT DISTINCT state FROM instances") == [("terminated",)]
    assert query(run_dir, "SELECT count(*) FROM actions WHERE state = 'intended'") == [(0,)]
    assert {e["cause"] for e in events(run_dir, "instance.terminated", "instance_id")} == {"user_stop"}


def test_down_cleans_up_after_a_killed_daemon_and_is_idempotent(tmp_path, run_dir):
    (tmp_path / "slow.yaml").write_text(SLOW_BAG)
    proc = start_broker("run", "--dry-run", "--yes", "--deadline", "15m", "--inventory", str(INVENTORY),
                        str(tmp_path / "slow.yaml"), "--run-dir", str(run_dir))
    try:
        wait_for_event(proc, run_dir, "instance.ready", "instance_id")
    finally:
        proc.kill()  # no clean-up at all: the agents are detached and keep running
        proc.communicate(timeout=30)
    assert agent_pids(run_dir), "the killed run should have left its agents behind"
    alive = query(run_dir, "SELECT count(*) FROM instances WHERE state <> 'terminated'")[0][0]
    assert alive >= 1

    first = broker("down", str(run_dir))
    assert first.returncode == 0, first.stderr
    assert f"{alive} instance(s) terminated" in first.stdout
    assert not agent_pids(run_dir)
    assert query(run_dir, "SELECT DISTINCT state FROM instances") == [("terminated",)]
    assert query(run_dir, "SELECT state FROM run") == [("stopped",)]

    second = broker("down", str(run_dir))
    assert second.returncode == 0, second.stderr
    assert "0 instance(s) terminated, 0 agent(s) stopped" in second.stdout
