"""A host lost for good during a live run is no fault of its tasks (issue 18, items 3 and 5).

Three SSH hosts in network namespaces (``tests/netns_hosts.py``), a bag with ``retries: 0``;
once one host runs tasks, its sshd is killed for good (its agent and tasks run on, out of
the broker's reach); it is tried again for its grace (15 s here), then given up. Its attempts end as *lost*, not failed: their tasks are re-queued
without counting against ``retries``, the run finishes on the two other hosts, every task
done once, and it exits 0. Before the fix each lost attempt counted a failure: with
``retries: 0`` its tasks were quarantined and the run exited 1. The report (human, as
``broker run`` prints it, and ``broker report --json``) names the host lost and says the run
finished on 2 of its 3 private nodes; before, nothing said a node was lost.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns_hosts import netns_hosts_factory  # noqa: F401 - fixture
from tests.test_netns_runs import _env, _wait, _write_inputs

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

MARK = "sleep 5.5"


def _journal(run_dir: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def test_a_host_whose_sshd_dies_loses_its_attempts_without_failing_their_tasks(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(3)
    inventory, bag = _write_inputs(tmp_path, hosts, 2, f'command: "{MARK}; echo {{i}}"\n'
                                   f"sweep: {{i: [{', '.join(str(i) for i in range(12))}]}}\n"
                                   "timeout: 10m\nretries: 0\n", grace="15s")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    broker = subprocess.Popen([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(bag), "--run-dir", str(run_dir)],
                              env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = hosts[2]
    try:
        _wait(lambda: sum(MARK in c for c in victim.broker_processes().values()) >= 1, 180,
              f"tasks running on {victim.name}")
        victim.kill_sshd()
        stdout, stderr = broker.communicate(timeout=600)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.communicate()
    assert broker.returncode == 0, stdout + stderr[-3000:]
    lost = _journal(run_dir, f"SELECT task_id FROM attempts WHERE node = '{victim.name}' AND outcome = 'lost'")
    assert lost, "the host's attempts were not lost: the fault did not fire"
    tasks = _journal(run_dir, "SELECT id, state, failures, done_attempt FROM tasks")
    assert len(tasks) == 12 and all(state == "done" for _, state, _, _ in tasks), tasks
    assert sum(f for _, _, f, _ in tasks) == 0  # no attempt counted against retries: 0
    done_on = dict(_journal(run_dir, "SELECT a.task_id, a.node FROM attempts a JOIN tasks t"
                                     " ON a.task_id = t.id AND a.attempt = t.done_attempt"))
    assert all(done_on[t] != victim.name for (t,) in lost)  # re-run on the other hosts
    oks = _journal(run_dir, "SELECT task_id, count(*) FROM attempts WHERE outcome = 'ok' GROUP BY task_id")
    assert all(n == 1 for _, n in oks), oks  # each task recorded done exactly once
    # Say what happened: the host lost, by name, and a run finished on fewer nodes than given.
    assert f"node lost: {victim.name} at " in stdout, stdout
    assert f"finished on 2 of the 3 private nodes it was given ({victim.name} lost)" in stdout, stdout
    report = subprocess.run([sys.executable, "-m", "broker", "report", "--json", str(run_dir)], env=_env(home),
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    nodes = json.loads(report.stdout)["nodes"]
    assert [n["node"] for n in nodes["lost"]] == [victim.name] and nodes["lost"][0]["private"], nodes
    assert nodes["private"] == [h.name for h in hosts] and nodes["rejoined"] == []
