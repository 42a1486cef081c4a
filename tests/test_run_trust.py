"""A whole dry run, under the user's umask 022: everything it writes is private, and nothing its
tasks started outlives the run, or `broker down` after the broker was killed.

The tasks detach a daemon each (``setsid``, double fork, ``sleep 1000``) and write its pid to
a file of their own; the tests look those pids up in /proc afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import agent_task_processes
from tests.test_agent_trust import alive, assert_private_tree
from tests.test_dryrun import REPO, run_dir  # noqa: F401 - run_dir is a fixture

INVENTORY = ("private:\n  - {name: local, local: true, slots: 2}\n"
             "aws:\n  region: us-east-1\n  types:\n"
             "    - {name: c5.large, slots: 2, speed: 1, price: 0.085, limit: 1, boot: 1s}\n")
TOKEN = "tok-live-4f9a8c1e2b7d6e5f"


@pytest.fixture(autouse=True)
def _nothing_left(tmp_path):
    """Whatever a failing test leaves (daemons, tasks, agents of this test's dirs) is killed."""
    yield
    marks = f"BROKER_AGENT_DIR={tmp_path}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(e.startswith(marks) for e in (entry / "environ").read_bytes().split(b"\0")):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _bag(tmp_path: Path, then: str, tasks: int) -> Path:
    pids = tmp_path / "pids"
    pids.mkdir()
    daemon = (f"setsid sh -c 'sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {pids}/$BROKER_TASK.pid' "
              f"</dev/null >/dev/null 2>&1; echo \"$API_TOKEN\" > res-{{i}}; {then}")
    bag = tmp_path / "bag.yaml"
    bag.write_text(json.dumps({"command": daemon, "sweep": {"i": list(range(tasks))}, "timeout": "30m",
                               "retries": 0, "workdir": str(tmp_path / "work"), "outputs": "res-{i}",
                               "env": {"API_TOKEN": TOKEN}}))
    (tmp_path / "work").mkdir()
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    return bag


def _broker_argv(*args: str) -> list[str]:
    # `umask 022` first: the user's umask, which the broker must not let into its run directory.
    return ["sh", "-c", 'umask 022 && exec "$@"', "sh", sys.executable, "-m", "broker", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _daemons(tmp_path: Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in (tmp_path / "pids").glob("*.pid") if p.read_text().strip()]


def _kill_the_broker_once_daemons_run(tmp_path: Path, env: dict, *args: str) -> list[int]:
    """``broker run --dry-run ARGS`` (real time), SIGKILLed once two tasks have detached their
    daemons; returns the daemons' pids."""
    broker = subprocess.Popen(_broker_argv("run", "--dry-run", "--yes", "--deadline", "10h", "--time-scale", "1",
                                           *args),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 120
        while len(_daemons(tmp_path)) < 2 and time.monotonic() < deadline and broker.poll() is None:
            time.sleep(0.1)
        assert len(_daemons(tmp_path)) >= 2, broker.stderr.read() if broker.poll() is not None else "no daemons"
    finally:
        broker.send_signal(signal.SIGKILL)
        broker.wait()
    return _daemons(tmp_path)


def _left_running(run_dir: Path) -> list[int]:  # noqa: F811
    agents = run_dir / "agents"
    return agent_task_processes(list(agents.iterdir())) if agents.is_dir() else []


def test_a_finished_dry_run_leaves_only_private_files_and_no_process_of_its_tasks(tmp_path, run_dir):  # noqa: F811
    bag = _bag(tmp_path, "sleep 0.2", tasks=6)
    done = subprocess.run(
        _broker_argv("run", "--dry-run", "--yes", "--json-report", "--inventory",
                     str(tmp_path / "inv.yaml"), str(bag), "--run-dir", str(run_dir), "--deadline", "1h"),
        capture_output=True, text=True, timeout=300, cwd=REPO, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["tasks"]["done"] == 6
    daemons = _daemons(tmp_path)
    assert len(daemons) == 6  # every task did detach its daemon ...
    assert [pid for pid in daemons if alive(pid)] == []  # ... and none outlived the run
    checked = {p.name for p in assert_private_tree(run_dir)}
    assert {"journal.sqlite", "events.jsonl", "agents", "local", "out", "journal", "agent.log",
            "outputs", "res-0"} <= checked, sorted(checked)
    # The tasks' own files keep the user's umask; the copies the broker fetched are private.
    assert stat.S_IMODE((tmp_path / "work" / "res-0").stat().st_mode) == 0o644
    assert (run_dir / "outputs" / "t000001" / "res-0").read_text() == f"{TOKEN}\n"  # the user's own output
    for state_dir in (run_dir / "agents").iterdir():  # what the agents wrote themselves: masked
        for name in ("journal", "agent.log"):
            assert TOKEN.encode() not in (state_dir / name).read_bytes(), state_dir / name


def test_broker_down_after_the_broker_was_killed_leaves_no_process_of_its_tasks(tmp_path, run_dir):  # noqa: F811
    bag = _bag(tmp_path, "sleep 600", tasks=4)
    daemons = _kill_the_broker_once_daemons_run(tmp_path, _env(), "--inventory", str(tmp_path / "inv.yaml"),
                                                str(bag), "--run-dir", str(run_dir))
    assert all(alive(pid) for pid in daemons) and _left_running(run_dir)  # the killed broker left them all
    # Mid-run, with the journal's -wal and -shm still there: every file private already.
    checked = {p.name for p in assert_private_tree(run_dir)}
    assert {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm", "events.jsonl"} <= checked, sorted(checked)
    down = subprocess.run(_broker_argv("down", str(run_dir)), capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=_env())
    assert down.returncode == 0, down.stderr[-3000:]
    assert [pid for pid in daemons if alive(pid)] == [] and _left_running(run_dir) == []
    assert_private_tree(run_dir)


@pytest.mark.sshd
@pytest.mark.slow
def test_broker_down_stops_the_agent_of_a_private_node_over_ssh_and_what_its_tasks_left(sshd, tmp_path, run_dir):  # noqa: F811
    """The broker is killed while tasks on a private node reached over SSH have detached
    daemons: `broker down` logs in to the node, stops its agent and kills what the tasks left."""
    from tests.test_live_private import _home_with_known_hosts, _inventory

    bag = _bag(tmp_path, "sleep 600", tasks=4)
    home = _home_with_known_hosts(tmp_path, sshd)
    env = {**_env(), "HOME": str(home)}
    daemons = _kill_the_broker_once_daemons_run(tmp_path, env, "--inventory", str(_inventory(tmp_path, sshd)),
                                                str(bag), "--run-dir", str(run_dir))
    assert all(alive(pid) for pid in daemons)
    down = subprocess.run(_broker_argv("down", str(run_dir)), capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env)
    assert down.returncode == 0, down.stdout
    assert "1 agent(s) stopped" in down.stdout, down.stdout
    assert [pid for pid in daemons if alive(pid)] == []
