"""A run's ledger events and decisions, recorded (``DaemonOptions.trace``) and replayed.

The daemon's run state is its ledger; everything the daemon tells it is a method call, and
everything it asks the controller is a ``decide`` on the ledger's snapshot. Recording both,
in order, and replaying them through a fresh ledger and controller must give back the very
actions the daemon got: the proof that no decision hides in the shell
(``tests/test_ledger_replay.py``). One JSON object a line: a ``header`` (how the ledger and
the controller were made), then ``call`` (a ledger method, its arguments) and ``decide``
(the time, the flags and the actions) lines.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

# Ledger methods that change it (what a replay must repeat).
MUTATORS = frozenset({
    "add_tasks", "adopt_done", "add_private", "on_node_ready", "on_node_lost", "on_node_away", "on_node_back",
    "on_launched", "on_launch_sent", "on_launch_answered",
    "on_launch_failed", "schedule_release", "start", "resume_attempt", "on_result", "on_attempt_failed",
    "on_attempt_lost", "on_setup_failed", "on_released", "cancel_running", "quarantine_node", "on_tick",
    "on_budget_stop", "reattach_allowed",
})


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__, **dataclasses.asdict(value)}
    raise TypeError(f"cannot record {value!r}")


def action_json(action: Any) -> dict[str, Any]:
    return json.loads(json.dumps(action, default=_encode))


class Trace:
    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")

    def write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(entry, default=_encode) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class RecordingLedger:
    """A ledger whose changing calls are written to a :class:`Trace` before they are made."""

    def __init__(self, ledger: Any, trace: Trace) -> None:
        object.__setattr__(self, "_ledger", ledger)
        object.__setattr__(self, "_trace", trace)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ledger, name)
        if name not in MUTATORS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._trace.write({"call": name, "args": args, "kwargs": kwargs})
            return attr(*args, **kwargs)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._ledger, name, value)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _decode(value: Any, types: dict[str, type]) -> Any:
    if isinstance(value, dict) and "__type__" in value:
        fields = {k: v for k, v in value.items() if k != "__type__"}
        return types[value["__type__"]](**fields)
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [tuple(v) for v in value]
    return value


def replay(entries: Iterable[dict[str, Any]], ledger: Any, controller: Any, rng: Any, memory: Any,
           types: dict[str, type]) -> list[tuple[float, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Feed the recorded calls to ``ledger`` and ask ``controller`` at every recorded decision;
    returns ``(now, recorded actions, replayed actions)`` per decision."""
    out = []
    for entry in entries:
        if "call" in entry:
            args = [_decode(a, types) for a in entry["args"]]
            getattr(ledger, entry["call"])(*args, **entry["kwargs"])
        elif "decide" in entry:
            d = entry["decide"]
            snap = ledger.snapshot(d["now"], stopping=d["stopping"])
            decision = controller.decide(snap, memory, d["now"], rng, tick=d["tick"])
            memory = decision.memory
            out.append((d["now"], d["actions"], [action_json(a) for a in decision.actions]))
    return out
