"""An agent SIGTERMed on one host of a live run (a node rebooting its services; issue 18):
it cancels what it runs; those attempts are lost, not failed (``retries: 0``), and run again;
the node's agent is started again and re-attached, and the run finishes (exit 0), every
task done exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns_hosts import netns_hosts_factory  # noqa: F401 - fixture
from tests.test_dryrun import query
from tests.test_netns_runs import _env, _wait, _write_inputs

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

MARK = "sleep 4.5"


def test_an_agent_sigtermed_mid_run_loses_no_task_and_the_run_finishes(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(2)
    inventory, bag = _write_inputs(tmp_path, hosts, 2, f'command: "{MARK}; echo {{i}}"\n'
                                   f"sweep: {{i: [{', '.join(str(i) for i in range(16))}]}}\n"
                                   "timeout: 10m\nretries: 0\n")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    broker = subprocess.Popen([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(bag), "--run-dir", str(run_dir)],
                              env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = hosts[1]
    try:
        _wait(lambda: sum(MARK in c for c in victim.broker_processes().values()) >= 1, 180,
              f"tasks running on {victim.name}")
        assert victim.signal_agents(signal.SIGTERM)
        stdout, stderr = broker.communicate(timeout=600)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.communicate()
    assert broker.returncode == 0, stdout + stderr[-3000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "node.down" and e.get("node") == victim.name for e in events), "the fault did not fire"
    lost = [e for e in events if e["event"] == "task.failed" and e.get("node") == victim.name]
    assert lost and all(e["lost"] and not e["final"] for e in lost), lost
    tasks = query(run_dir, "SELECT id, state, failures FROM tasks")
    assert len(tasks) == 16 and all(state == "done" and f == 0 for _, state, f in tasks), tasks
    oks = query(run_dir, "SELECT task_id, count(*) FROM attempts WHERE outcome = 'ok' GROUP BY task_id")
    assert len(oks) == 16 and all(n == 1 for _, n in oks), oks
