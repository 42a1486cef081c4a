"""``broker run`` on a private node reached over SSH (a real sshd on 127.0.0.1): the node is
connected to with its host key checked against the user's known_hosts, the bag's setup runs
there once, the agent is shipped and started there, the sampling phase and then every task
run there, and the agent is stopped at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sshd import TestSshd
from tests.test_dryrun import REPO, events, query

pytestmark = [pytest.mark.sshd]


def _run(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180, env=env)


def _home_with_known_hosts(tmp_path: Path, sshd: TestSshd) -> Path:
    """A HOME whose ~/.ssh/known_hosts pins the test sshd's key (the default for private nodes)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshd.known_hosts_path, home / ".ssh" / "known_hosts")
    return home


def _inventory(tmp_path: Path, sshd: TestSshd) -> Path:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "private:\n"
        f"  - {{name: lab, host: 127.0.0.1, port: {sshd.port}, user: {sshd.user}, key: {sshd.client_key_path},"
        " slots: 2, speed: 1.0}\n"
    )
    return inventory


def test_a_run_samples_and_executes_on_a_private_node_over_ssh(sshd: TestSshd, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    bag = tmp_path / "bag.yaml"
    bag.write_text(
        "command: \"python3 -c 'import time, socket; time.sleep(0.05); print({i} * {i})'\"\n"
        "sweep: {i: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n"
        "timeout: 30s\nretries: 0\n"
        "setup: \"echo ready >> setup-ran.txt\"\n"
        f"workdir: {work}\n"
    )
    run_dir = tmp_path / "run"
    done = _run(_home_with_known_hosts(tmp_path, sshd), "run", "--dry-run", "--yes", "--json-report",
                "--inventory", str(_inventory(tmp_path, sshd)), str(bag), "--run-dir", str(run_dir),
                "--deadline", "1h")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["tasks"] == {"total": 12, "done": 12, "failed": 0, "left": 0}
    assert report["instances_launched"] == 0

    # Setup ran once, on the node (the sshd's user writes into the shared workdir).
    assert (work / "setup-ran.txt").read_text() == "ready\n"
    # Every task ran on the SSH node, exactly once, and the first ones were samples.
    finished = events(run_dir, "task.done")
    assert sorted(e["task"] for e in finished) == sorted(f"t{i:06d}" for i in range(1, 13))
    assert {e["node"] for e in finished} == {"lab"}
    assert events(run_dir, "sample.done")
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'ok'") == [(12,)]
    connects = events(run_dir, "ssh.connect")
    assert connects and all(e["port"] == sshd.port and e["host"] == "127.0.0.1" for e in connects)
    assert any(e["event"] == "node.ready" and e["node"] == "lab" for e in events(run_dir))


def test_an_unknown_host_key_refuses_the_node_and_nothing_runs_there(sshd: TestSshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)  # an empty known_hosts: the node's key is unknown
    bag = tmp_path / "bag.yaml"
    bag.write_text("command: \"true {i}\"\nsweep: {i: [1, 2]}\ntimeout: 10s\n")
    run_dir = tmp_path / "run"
    done = _run(home, "run", "--dry-run", "--yes", "--inventory", str(_inventory(tmp_path, sshd)), str(bag),
                "--run-dir", str(run_dir), "--deadline", "1h")
    assert done.returncode != 0
    lost = events(run_dir, "node.lost")
    assert lost and lost[0]["node"] == "lab" and "host key" in lost[0]["reason"].lower(), lost
    assert not events(run_dir, "task.done")
