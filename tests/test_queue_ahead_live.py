"""Queue-ahead end to end (issue 20): ``broker run`` on a real local agent queues short tasks
at it, and every task still runs exactly once, its runtime the agent's own."""

from __future__ import annotations

import json
from collections import Counter

from broker.core.control.queue_ahead import queue_positions
from tests.test_dryrun import broker, events, query, run_dir  # noqa: F401 - run_dir is a fixture

SLOTS = 2
INVENTORY = f"""\
private:
  - name: local
    local: true
    slots: {SLOTS}
"""
N = 200
BAG = f'command: ": {{k}}"\ntimeout: 30s\nsweep:\n  k: {{range: [0, {N}]}}\n'


def test_short_tasks_are_queued_at_the_agent_and_each_runs_once(tmp_path, run_dir):  # noqa: F811
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    (tmp_path / "bag.yaml").write_text(BAG)
    done = broker("run", "--yes", "--json-report", "--deadline", "10h", "--inventory", str(tmp_path / "inv.yaml"),
                  str(tmp_path / "bag.yaml"), "--run-dir", str(run_dir), timeout_s=300.0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["tasks"] == {"total": N, "done": N, "failed": 0, "left": 0}
    starts = events(run_dir, "task.start")
    queued = [e for e in starts if e["slot"] >= SLOTS]
    assert queued, "no task was queued ahead"
    assert max(e["slot"] for e in starts) < queue_positions(SLOTS)  # within the deepest queue
    assert Counter(e["task"] for e in starts).most_common(1)[0][1] == 1  # no task dispatched twice
    finished = events(run_dir, "task.done")
    assert len(finished) == N and len({e["task"] for e in finished}) == N
    # the runtime the ledger learnt is the agent's own (spawn to reap), not the wait in the queue
    assert all(abs(e["runtime_ref_s"] - round(e["runtime_s"], 3)) < 2e-3 for e in finished)
    assert query(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome = 'ok'") == [(N,)]  # one attempt each
    assert query(run_dir, "SELECT COUNT(*) FROM tasks WHERE state = 'done'") == [(N,)]
