"""Private nodes that do not answer when a run starts (issue 18, item 2), on hosts in network
namespaces whose link the test cuts (``tests/netns_hosts.py``).

- a host unreachable at start is tried again in the background, the run goes on on the
  others and says on the console that it waits, and the host joins once it answers
  (before: it was declared lost at once and never tried again);
- a run whose every node stays unreachable waits for them for their grace (it does not end
  at once), then ends with exit 1 naming them.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns_hosts import netns_hosts_factory  # noqa: F401 - fixture
from tests.test_dryrun import events, query
from tests.test_netns_runs import _env, _wait, _write_inputs

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _running(run_dir: Path) -> int:
    try:
        return query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'")[0][0]
    except sqlite3.Error:  # no journal yet
        return 0


def _events_of(run_dir: Path, name: str) -> list[dict]:
    try:
        return events(run_dir, name)
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_a_host_unreachable_at_start_joins_the_run_once_it_answers(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(2)
    late = hosts[1]
    flag = tmp_path / "go"
    # Every task waits for the flag, so the run cannot end before the late host has joined; the
    # tasks' estimates make the first plan at once (no sampling pass holding tasks back).
    (tmp_path / "tasks.csv").write_text("command,estimate_user\n" + "".join(
        f'"while [ ! -e {flag} ]; do sleep 0.2; done; echo {i}",10\n' for i in range(8)))
    inventory, bag = _write_inputs(tmp_path, hosts, 2, "csv: tasks.csv\ntimeout: 10m\nretries: 0\n", grace="5m")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    late.cut_link()
    broker = subprocess.Popen([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(bag), "--run-dir", str(run_dir), "--tick", "5s"],
                              env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: any(e["node"] == late.name for e in _events_of(run_dir, "node.unreachable")), 180,
              f"{late.name} reported unreachable")
        _wait(lambda: any(e["node"] == hosts[0].name for e in _events_of(run_dir, "node.ready")), 180,
              f"{hosts[0].name} ready")
        late.restore_link()
        _wait(lambda: any(e["node"] == late.name for e in _events_of(run_dir, "node.ready")), 240,
              f"{late.name} joining once its link is back")
        _wait(lambda: query(run_dir, f"SELECT count(*) FROM attempts WHERE node = '{late.name}'")[0][0] > 0, 120,
              f"work on {late.name}")
        flag.touch()
        stdout, stderr = broker.communicate(timeout=300)
    finally:
        flag.touch()
        if broker.poll() is None:
            broker.kill()
            broker.communicate()
    assert broker.returncode == 0, stdout + stderr[-3000:]
    assert f"warning: private node {late.name} did not answer" in stdout, stdout  # a human line, not only JSON
    assert _events_of(run_dir, "node.lost") == []
    done_on = dict(query(run_dir, "SELECT a.task_id, a.node FROM attempts a JOIN tasks t"
                                  " ON a.task_id = t.id AND a.attempt = t.done_attempt"))
    assert len(done_on) == 8 and late.name in done_on.values(), done_on
    oks = query(run_dir, "SELECT task_id, count(*) FROM attempts WHERE outcome = 'ok' GROUP BY task_id")
    assert len(oks) == 8 and all(n == 1 for _, n in oks), oks


def test_a_run_whose_nodes_never_answer_waits_their_grace_then_exits_1_naming_them(netns_hosts_factory, tmp_path):
    (host,) = netns_hosts_factory(1)
    inventory, bag = _write_inputs(tmp_path, [host], 2, 'command: "echo {i}"\nsweep: {i: [1, 2, 3]}\n'
                                   "timeout: 1m\n", grace="20s")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    host.cut_link()
    done = subprocess.run([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory), str(bag),
                           "--run-dir", str(run_dir), "--tick", "2s"],
                          env=_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"warning: private node {host.name} did not answer" in done.stdout, done.stdout
    assert f"warning: private node {host.name} not reached" in done.stdout, done.stdout
    (start,) = query(run_dir, "SELECT created_at FROM run")[0]
    lost = query(run_dir, "SELECT at, fields FROM events WHERE name = 'node.lost'")
    assert len(lost) == 1 and json.loads(lost[0][1])["node"] == host.name, lost
    assert lost[0][0] - start >= 20.0  # waited out the grace (run time) before giving the node up
    assert json.loads(lost[0][1]).get("refused") is False
    assert f"node lost: {host.name} at " in done.stdout, done.stdout  # the report names it
    assert query(run_dir, "SELECT count(*) FROM tasks WHERE state = 'done'") == [(0,)]


def test_a_host_unreachable_on_resume_keeps_its_tasks_and_rejoins(netns_hosts_factory, tmp_path):
    """A run left (``--on-stop leave``) is resumed while one host's link is down: that host is
    tried again in the background, the tasks its agent runs are held (not re-run elsewhere),
    and once its link is back its agent reports them and the run finishes, each task done
    once, where it started. Before: the host was lost at once and its tasks re-queued."""
    hosts = netns_hosts_factory(2)
    late, flag = hosts[1], tmp_path / "go"
    (tmp_path / "tasks.csv").write_text("command,estimate_user\n" + "".join(
        f'"while [ ! -e {flag} ]; do sleep 0.2; done; echo {i}",10\n' for i in range(4)))
    inventory, bag = _write_inputs(tmp_path, hosts, 2, "csv: tasks.csv\ntimeout: 10m\nretries: 0\n", grace="5m")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    command = [sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory), str(bag),
               "--run-dir", str(run_dir), "--tick", "5s", "--on-stop", "leave"]
    first = subprocess.Popen(command, env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        _wait(lambda: _running(run_dir) == 4, 180, "all four tasks running, two on each host")
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    on_late = {t for (t,) in query(run_dir, f"SELECT task_id FROM attempts WHERE node = '{late.name}'")}
    assert len(on_late) == 2, on_late
    late.cut_link()
    second = subprocess.Popen(command, env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        _wait(lambda: any(e["node"] == late.name for e in _events_of(run_dir, "node.unreachable")), 180,
              f"{late.name} reported unreachable on resume")
        late.restore_link()
        _wait(lambda: [e["node"] for e in _events_of(run_dir, "agent.reattached")].count(late.name) >= 1, 240,
              f"{late.name} back once its link is back")
        flag.touch()
        stdout, stderr = second.communicate(timeout=300)
    finally:
        flag.touch()
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0, stdout + stderr[-3000:]
    assert f"warning: private node {late.name} did not answer on resume" in stdout, stdout
    assert _events_of(run_dir, "node.lost") == []
    done = dict(query(run_dir, "SELECT t.id, a.node || ':' || a.attempt FROM tasks t JOIN attempts a"
                               " ON a.task_id = t.id AND a.attempt = t.done_attempt"))
    assert len(done) == 4 and all(done[t] == f"{late.name}:1" for t in on_late), done  # held, not re-run
    assert query(run_dir, "SELECT count(*) FROM attempts") == [(4,)]  # no task was started twice
