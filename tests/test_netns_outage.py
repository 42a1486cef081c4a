"""A 60 s link outage on one host of a live run (issue 18, item 2): the node is *away*, not
lost. Its agent runs its tasks on meanwhile; the broker holds their slots (nothing is
re-queued), reconnects in the background with backoff for the node's grace (10 minutes by
default) while the other host works on, and once the link is back the agent re-attaches and
replays the results finished during the outage. No task runs twice, the node rejoins, the
run finishes (exit 0). Before, the node was declared lost after one reconnect try: its
running tasks were re-queued and ran again elsewhere, and it never rejoined.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns_hosts import netns_hosts_factory  # noqa: F401 - fixture
from tests.test_dryrun import query
from tests.test_netns_runs import _env, _wait, _write_inputs

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

MARK = "sleep 7.5"
OUTAGE_S = 60.0


def test_a_60s_link_outage_holds_the_hosts_tasks_and_it_rejoins(netns_hosts_factory, tmp_path):
    hosts = netns_hosts_factory(2)
    inventory, bag = _write_inputs(tmp_path, hosts, 2, f'command: "{MARK}; echo {{i}}"\n'
                                   f"sweep: {{i: [{', '.join(str(i) for i in range(30))}]}}\n"
                                   "timeout: 10m\nretries: 0\n")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    broker = subprocess.Popen([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(bag), "--run-dir", str(run_dir)],
                              env=_env(home), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = hosts[1]
    try:
        _wait(lambda: sum(MARK in c for c in victim.broker_processes().values()) >= 2, 180,
              f"two tasks running on {victim.name}")
        held = sum(MARK in c for c in victim.broker_processes().values())
        victim.outage(OUTAGE_S)
        stdout, stderr = broker.communicate(timeout=900)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.communicate()
    assert broker.returncode == 0, stdout + stderr[-3000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    on_victim = [e["event"] for e in events if e.get("node") == victim.name
                 and e["event"] in ("node.away", "agent.reattached", "node.lost", "agent.reattach_failed")]
    assert on_victim[:2] == ["node.away", "agent.reattached"], on_victim  # the outage fired; the node rejoined
    assert "node.lost" not in on_victim, on_victim
    away = next(e for e in events if e["event"] == "node.away")
    assert away["running"] >= 1 and held >= 1
    # No task ran twice: one attempt each, every one a success; none lost or cancelled.
    attempts = query(run_dir, "SELECT task_id, count(*), sum(outcome = 'ok') FROM attempts GROUP BY task_id")
    assert len(attempts) == 30 and all(n == 1 and ok == 1 for _, n, ok in attempts), attempts
    # The attempts the host held through the outage were its own to finish (replayed).
    assert query(run_dir, f"SELECT count(*) FROM attempts WHERE node = '{victim.name}' AND outcome = 'ok'"
                          f" AND started_at < (SELECT min(at) FROM events WHERE name = 'node.away')")[0][0] >= 1
    assert "node lost" not in stdout, stdout
