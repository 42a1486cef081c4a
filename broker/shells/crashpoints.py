"""Kill points for crash tests: ``BROKER_CRASH_AT=<point>:<n>`` SIGKILLs the daemon there.

The live shell wraps its journal and its EC2 fleet in the proxies below when the variable
is set (``broker run`` does; nothing else reads it). The process then sends itself SIGKILL
(the same as ``kill -9``: no ``finally``, no ``atexit``, no flush) right after the ``n``-th
occurrence of the named point, so a test can kill a real daemon at an exact place:

- a journal write, named by its method: ``intend:launch``, ``intend:terminate``,
  ``complete``, ``fail``, ``record_launch``, ``record_instance_state``, ``set_release``,
  ``task_started`` (each start of a turn's ``tasks_started`` too), ``task_finished`` (each result of a
  turn's ``tasks_finished`` too), ``task_failed``, ``attempt_lost``, ``attempt_cancelled``,
  ``requeue_running``, ``record_sample_draws``, ``record_plan``, ``add_tasks``,
  ``create_run``, ``finish_run``, and ``batch`` (the end of a batch of results or starts);
  inside a batch, or a batch inside the turn's group, the kill lands before the commit, so
  the batch (the whole group so far) is lost, as a real crash would lose it;
- ``group``: right after a turn's group committed, before what waited for the commit (the
  results' acknowledgements, the started attempts sent to their agents) is carried out;
- an event, ``event:<name>`` (``event:task.done``, ``event:instance.launch``, ...): after
  it is written to the journal;
- an EC2 call that returned, before its outcome is journaled: ``fleet.launch``,
  ``fleet.terminate`` (the instances exist, or are gone, and the journal does not know).

Several points may be given, separated by commas; the first reached kills.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

ENV = "BROKER_CRASH_AT"

_WRITES = frozenset({
    "intend", "complete", "fail", "record_launch", "record_instance_state", "set_release", "task_started",
    "tasks_started", "tasks_finished",
    "task_finished", "task_failed", "attempt_lost", "attempt_cancelled", "requeue_running", "record_sample_draws",
    "record_plan", "add_tasks", "create_run", "finish_run", "record_event", "record_private_node",
    "quarantine", "cancel_pending", "set_estimates",
})

_EACH = {"tasks_started": "task_started", "tasks_finished": "task_finished"}


class CrashPlan:
    """The parsed variable: point name -> the occurrence that kills."""

    def __init__(self, spec: str) -> None:
        self.at: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, count = part.rpartition(":")
            if not sep or not name or not count.isdigit() or int(count) < 1:
                raise ValueError(f"{ENV}: expected <point>:<n> with n >= 1, got {part!r}")
            self.at[name] = int(count)
        self.seen: Counter[str] = Counter()

    def hit(self, name: str) -> None:
        if name not in self.at:
            return
        self.seen[name] += 1
        if self.seen[name] == self.at[name]:
            os.kill(os.getpid(), signal.SIGKILL)


def plan_from_env() -> CrashPlan | None:
    spec = os.environ.get(ENV, "").strip()
    return CrashPlan(spec) if spec else None


class CrashingJournal:
    """A journal whose writes are kill points (see the module docstring)."""

    def __init__(self, journal: Any, plan: CrashPlan) -> None:
        self._journal = journal
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._journal, name)
        if name not in _WRITES:
            return attr
        plan = self._plan

        def write(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if name == "intend":
                plan.hit(f"intend:{args[0] if args else kwargs.get('kind')}")
            elif name == "record_event":
                plan.hit(f"event:{args[0] if args else kwargs.get('name')}")
            elif name in _EACH:  # a turn's starts (results) at once: each is a task_started (finished) point
                for _each in args[0] if args else kwargs.get("starts", kwargs.get("results", ())):
                    plan.hit(_EACH[name])
            else:
                plan.hit(name)
            return result

        return write

    @contextmanager
    def batch(self) -> Iterator["CrashingJournal"]:
        with self._journal.batch():
            yield self
        self._plan.hit("batch")

    @contextmanager
    def group(self) -> Iterator["CrashingJournal"]:
        with self._journal.group():
            self._journal.after_commit(lambda: self._plan.hit("group"))  # the first thing after the commit
            yield self

    def __enter__(self) -> "CrashingJournal":
        return self

    def __exit__(self, *exc: object) -> None:
        self._journal.close()


class CrashingFleet:
    """An EC2 fleet whose launch and terminate calls are kill points once they return."""

    def __init__(self, fleet: Any, plan: CrashPlan) -> None:
        self._fleet = fleet
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fleet, name)

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        outcome = self._fleet.launch(*args, **kwargs)
        self._plan.hit("fleet.launch")
        return outcome

    def terminate(self, *args: Any, **kwargs: Any) -> Any:
        outcome = self._fleet.terminate(*args, **kwargs)
        self._plan.hit("fleet.terminate")
        return outcome
