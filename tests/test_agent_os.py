"""What the agent asks of the system for each task: kept output files and batch scheduling.

The agent keeps empty output files for the next tasks (workers/agent.py, "Spare files").

Creating and unlinking two files a task made ext4's inode allocator most of a no-op task's
cost (``recently_deleted``: every new inode is looked for past those deleted in the last
half minute). A kept file must be indistinguishable from a new one: empty, private, holding
only the new task's output, and never one that a leftover of an earlier task still writes to.
Its tasks run under SCHED_BATCH unless told not to ("Scheduling"). Real agent daemons over
local pipes.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

from tests.test_agent import agent_dir, connect, results_until  # noqa: F401 - agent_dir: fixture
from workers.protocol import Run


def spare_inodes(state_dir: Path) -> set[int]:
    return {p.stat().st_ino for p in (state_dir / "spare").iterdir()}


def test_empty_outputs_are_reused_and_the_next_output_is_the_tasks_own(agent_dir):
    client = connect(agent_dir, slots=2)
    client.submit([Run(f"quiet{i}", 1, "true") for i in range(4)])
    results_until(client, 4)
    kept = spare_inodes(agent_dir)
    assert len(kept) >= 2  # the empty streams were kept, not unlinked ...
    assert list((agent_dir / "out").iterdir()) == []  # ... and an empty stream still leaves no file in out/
    client.submit([Run("loud", 1, "echo out; echo err >&2")])
    results, _ = results_until(client, 1)
    loud = results[("loud", 1)]
    out, err = Path(loud.stdout_path), Path(loud.stderr_path)
    assert (out.read_text(), err.read_text()) == ("out\n", "err\n")
    assert {out.stat().st_ino, err.stat().st_ino} <= kept  # renamed from spare/, not created
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and stat.S_IMODE(err.stat().st_mode) == 0o600
    assert sorted(p.name for p in (agent_dir / "out").iterdir()) == ["loud.1.stderr", "loud.1.stdout"]
    client.close()


def test_a_file_a_leftover_still_holds_is_not_given_to_the_next_task(agent_dir, tmp_path):
    """A task leaves a process (its own session, so the task's group kill misses it) that
    writes to the task's stdout and stderr after the task ended; the next task on the slot
    must not get those files. Without the write-lease check it gets the same inodes."""
    written = tmp_path / "leaked"
    # Its own session and no environment: the agent cannot tell whose it is, so its reaper
    # leaves it be while any task runs ("hold" here; tests/test_agent_trust.py).
    leftover = f"env -i PATH=/usr/bin:/bin setsid sh -c 'sleep 0.5; echo leak; echo leak >&2; : > {written}' & sleep 0.2"  # the sleep: it has left the group
    client = connect(agent_dir, slots=2)
    client.submit([Run("hold", 1, "sleep 2"), Run("leaves", 1, leftover), Run("next", 1, "sleep 1; echo mine")])
    results, _ = results_until(client, 3)
    assert results[("leaves", 1)].stdout_path is None  # it wrote nothing while it ran
    deadline = time.monotonic() + 10
    while not written.exists() and time.monotonic() < deadline:  # the leftover did write
        time.sleep(0.02)
    assert written.exists(), "the leftover never wrote: the test proves nothing"
    after = results[("next", 1)]
    assert Path(after.stdout_path).read_text() == "mine\n"
    assert after.stderr_path is None and after.stderr_tail == ""
    client.close()


def test_spares_are_emptied_when_the_agent_stops_and_starts(agent_dir):
    from broker.shells.local_transport import stop_local_agent

    client = connect(agent_dir, slots=2)
    client.submit([Run(f"q{i}", 1, "true") for i in range(3)])
    results_until(client, 3)
    assert spare_inodes(agent_dir)
    client.close()
    stop_local_agent(agent_dir)
    assert spare_inodes(agent_dir) == set()
    (agent_dir / "spare" / "stale").write_bytes(b"left by a crashed agent")
    client = connect(agent_dir, slots=2)
    client.submit([Run("after", 1, "echo fresh")])
    results, _ = results_until(client, 4)  # with the three unacknowledged results replayed
    assert Path(results[("after", 1)].stdout_path).read_text() == "fresh\n"
    assert not (agent_dir / "spare" / "stale").exists()
    client.close()


def _policy_of_a_task(agent_dir: Path) -> str:
    """The scheduling policy (field 41 of /proc/PID/stat: 0 normal, 3 batch) a task runs under."""
    client = connect(agent_dir, slots=1)
    client.submit([Run("policy", 1, "cut -d' ' -f41 /proc/$$/stat")])
    results, _ = results_until(client, 1)
    client.close()
    return results[("policy", 1)].stdout_tail.strip()


def test_tasks_run_under_batch_scheduling(agent_dir):
    assert _policy_of_a_task(agent_dir) == "3"  # SCHED_BATCH: see Scheduling in workers/agent.py


def test_batch_scheduling_can_be_turned_off(agent_dir, monkeypatch):
    monkeypatch.setenv("BROKER_TASK_SCHED", "normal")
    assert _policy_of_a_task(agent_dir) == "0"
