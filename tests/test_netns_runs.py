"""Live runs on several SSH hosts, each in its own network namespace with its own sshd
(``tests/netns_hosts.py``): what a lab network does to a run (issue 18).

- ``--on-stop leave`` then ``broker down`` (from another directory): no agent or task
  process of the run is left on any host, nor its state directory.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.netns_hosts import NetnsHost, netns_hosts_factory  # noqa: F401 - fixture
from tests.test_dryrun import REPO

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), AWS_CONFIG_FILE=str(home / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(home / "none"))
    return env


def _write_inputs(tmp_path: Path, hosts: list[NetnsHost], slots: int, bag: str, **entry: object) -> tuple[Path, Path]:
    """The inventory (``entry``: more fields for every host) and the bag."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"private": [h.inventory_entry(slots, **entry) for h in hosts]}))
    bag_file = tmp_path / "bag.yaml"
    bag_file.write_text(bag)
    return inventory, bag_file


def _running(run_dir: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT count(*) FROM attempts WHERE outcome IS NULL OR outcome = 'running'").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _run_then_leave(tmp_path: Path, inventory: Path, bag: Path, ready) -> tuple[str, str]:
    """``broker run --on-stop leave`` in ``tmp_path/run`` (HOME ``tmp_path/home``), SIGTERMed
    once ``ready()``; its stdout and stderr."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    broker = subprocess.Popen([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(bag), "--run-dir", str(tmp_path / "run"), "--on-stop", "leave"],
                              env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(ready, 120, "the run to be under way on the hosts")
    finally:
        broker.send_signal(signal.SIGTERM)
        stdout, stderr = broker.communicate(timeout=120)
    return stdout, stderr


def test_leave_then_down_leaves_no_agent_or_task_on_any_host(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(3)
    inventory, bag = _write_inputs(tmp_path, hosts, 2, 'command: "sleep 120; echo {i}"\n'
                                   "sweep: {i: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\ntimeout: 10m\nretries: 0\n")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    stdout, stderr = _run_then_leave(tmp_path, inventory, bag, lambda: all(h.agent_pids() for h in hosts) and sum(
        "sleep 120" in c for h in hosts for c in h.broker_processes().values()) >= 2)
    assert "left the run's instances and agents running" in stdout, stderr[-3000:]
    for host in hosts:  # left running, as asked
        assert host.agent_pids(), host.name
    runs = [h.home / ".broker" / "runs" for h in hosts]
    assert all(len(list(r.iterdir())) == 1 for r in runs)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    down = subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], env=_env(home), cwd=elsewhere,
                          capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "3 agent(s) stopped (3 on private nodes" in down.stdout
    for host in hosts:
        assert host.broker_processes() == {}, (host.name, host.broker_processes())
    assert all(list(r.iterdir()) == [] for r in runs)  # the run's state went with it (keep: 0)
    assert _running(run_dir) == 0
    again = subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], env=_env(home), cwd=elsewhere,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout  # safe to repeat


def test_down_names_a_host_it_cannot_reach_and_exits_1(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(2)
    inventory, bag = _write_inputs(tmp_path, hosts, 1, 'command: "sleep 120; echo {i}"\nsweep: {i: [1, 2, 3, 4]}\n'
                                   "timeout: 10m\nretries: 0\n")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    _run_then_leave(tmp_path, inventory, bag, lambda: all(h.agent_pids() for h in hosts))
    hosts[1].kill_sshd()
    down = subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], env=_env(home), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert down.returncode == 1, down.stdout
    assert "could not reach private node h1: cannot reach" in down.stdout
    assert "exits by itself 1h00m after it last heard from a broker (its lease)" in down.stdout
    assert hosts[0].broker_processes() == {}
    assert hosts[1].agent_pids()  # out of reach: its lease will end it
