"""Kill points (broker/shells/crashpoints.py) still land where the daemon now writes."""

from __future__ import annotations

import signal

from broker.shells import crashpoints
from broker.shells.crashpoints import CrashingJournal, CrashPlan


class _Journal:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def tasks_started(self, starts, *, at_s=None):
        self.calls.append(("tasks_started", tuple(starts)))

    def task_started(self, task_id, attempt, node, *, at_s=None):
        self.calls.append(("task_started", (task_id, attempt, node)))

    def tasks_finished(self, results):
        self.calls.append(("tasks_finished", tuple(results)))

    def task_finished(self, task_id, attempt, result, *, node=None, at_s=None):
        self.calls.append(("task_finished", (task_id, attempt)))


def test_each_start_of_a_turns_tasks_started_is_a_task_started_kill_point(monkeypatch):
    """Issue 20: the daemon journals a turn's starts with one tasks_started call. The crash
    chains kill at ``task_started:<n>``; without this mapping that point was never reached
    and the crash test silently stopped covering the starts."""
    kills = []
    monkeypatch.setattr(crashpoints.os, "kill", lambda pid, sig: kills.append(sig))
    journal = _Journal()
    crashing = CrashingJournal(journal, CrashPlan("task_started:3"))
    crashing.tasks_started([("t0", 1, "n"), ("t1", 1, "n")], at_s=1.0)
    assert kills == [] and journal.calls == [("tasks_started", (("t0", 1, "n"), ("t1", 1, "n")))]
    crashing.tasks_started([("t2", 1, "n"), ("t3", 1, "n")])
    assert kills == [signal.SIGKILL]  # the third start: after the statement, before any commit
    crashing.task_started("t4", 1, "n")
    assert kills == [signal.SIGKILL]  # once


def test_each_result_of_a_turns_tasks_finished_is_a_task_finished_kill_point(monkeypatch):
    """Issue 20: the daemon journals a turn's successful results with one tasks_finished
    call; the crash chains' ``task_finished:<n>`` must still land on the n-th result."""
    kills = []
    monkeypatch.setattr(crashpoints.os, "kill", lambda pid, sig: kills.append(sig))
    journal = _Journal()
    crashing = CrashingJournal(journal, CrashPlan("task_finished:3"))
    crashing.tasks_finished([("t0", 1, None, "n", 1.0), ("t1", 1, None, "n", 1.0)])
    assert kills == []
    crashing.task_finished("t2", 1, None)
    assert kills == [signal.SIGKILL]
