"""Resume after an edit: the journal's tasks matched with an edited bag's (``--resume`` as
Nextflow has it).

A task is known by its command, its environment and its working directory (the bag's
``env`` and ``workdir``), not by its place in the bag: a resume with an edited bag keeps
each task whose key is still in the bag (done stays done, running stays running, given up
stays given up), runs the new and the changed ones (a changed command is a new key), and
drops the journal's tasks whose key left the bag (their rows and attempts stay in the
journal, as ``dropped``). A key the bag holds more often than the journal has it done
runs again: those runs are counted as ``redone``.

Kept tasks keep their journal ids (an edit that inserts a line does not shift the others);
a new task keeps its own id when the journal never used it, else it gets ``<id>-2``,
``<id>-3``... (ids are never reused: a dropped task's id keeps its history).

Refused, each with why: a journal that did not record its tasks' context (written before
this rule), and a changed ``setup`` (the run's nodes were set up with the old one, and a
node is set up once).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from broker.core.control.causes import TaskState
from broker.core.model import Bag, Task

# The states a kept journal task is preferred in when a key matches several: work done or
# under way is kept first.
_PREFERENCE = {TaskState.DONE: 0, TaskState.RUNNING: 1, TaskState.SAMPLING: 1, TaskState.PENDING: 2}


class BagEditRefused(Exception):
    """Continuing with this edit would be wrong; the message says why and what to do."""


def task_context(bag: Bag, salt: str | None = None) -> dict[str, Any]:
    """What the bag's tasks run with besides their command (recorded in the journal). The
    environment holds secrets, so the journal keeps only a salted digest of it: enough to
    tell whether it changed, never its values (``salt``: the recorded context's, to compare)."""
    salt = salt or secrets.token_hex(16)
    return {"env_salt": salt, "env_sha256": _env_digest(bag.env, salt), "workdir": bag.workdir, "setup": bag.setup}


def _env_digest(env: Mapping[str, str], salt: str) -> str:
    return hashlib.sha256((salt + json.dumps(dict(sorted(env.items())), sort_keys=True)).encode()).hexdigest()


def _context_key(context: Mapping[str, Any]) -> tuple[str, str]:
    """The part of every task's key that is the bag's: its environment and working directory."""
    return context.get("env_sha256") or "", context.get("workdir") or ""


@dataclass(frozen=True, slots=True)
class BagEdit:
    """How an edited bag maps onto the run's journal."""

    bag: Bag  # the edited bag, its tasks carrying the journal's ids where kept
    kept: int
    kept_done: int
    new: tuple[str, ...]  # ids of the tasks to add (new or changed)
    dropped: tuple[str, ...]  # journal ids no longer in the bag
    redone: int  # of ``new``: a key the journal has done already (a duplicate beyond its done copies)
    context_changed: bool

    @property
    def changed(self) -> bool:
        """Anything to write: tasks to add or drop, or a new context."""
        return bool(self.new or self.dropped or self.context_changed)

    def summary(self) -> str:
        return (f"{self.kept} task{'s' if self.kept != 1 else ''} kept ({self.kept_done} done), {len(self.new)} new, "
                f"{len(self.dropped)} dropped, {self.redone} redone")

    def fields(self) -> dict[str, Any]:
        """The ``run.bag_changed`` event's fields."""
        return {"kept": self.kept, "kept_done": self.kept_done, "new": len(self.new), "dropped": len(self.dropped),
                "redone": self.redone, "new_tasks": list(self.new[:20]), "dropped_tasks": list(self.dropped[:20])}


def match_bag(live: Sequence[tuple[str, str, str]], all_ids: set[str], then: Mapping[str, Any] | None,
              bag: Bag, *, same_file: bool) -> BagEdit:
    """Match the journal's ``live`` tasks (``(id, command, state)`` in bag order, run with the
    context ``then``) with ``bag``'s. ``all_ids``: every id the journal holds, dropped ones
    too. ``same_file``: the bag file is the one the journal last recorded (a journal without
    a context can then be resumed as it is). Raises :class:`BagEditRefused`."""
    now = task_context(bag, salt=then.get("env_salt") if then else None)
    if then is None:
        if not same_file:
            raise BagEditRefused("its journal was written by a broker that did not record what its tasks ran with "
                                 "(environment, working directory), so the edited bag's tasks cannot be matched "
                                 "with its own: resume it with the bag it started with")
        then = now
    if (then.get("setup") or None) != (now.get("setup") or None):
        raise BagEditRefused("the bag's setup changed: the run's nodes were set up with the old one and a node is "
                             "set up once, so its tasks would run on nodes set up two ways: put the setup back")
    # A task's key is its command with the bag's context: with the context unchanged, the
    # command alone; with it changed, no task of the journal has a key the bag holds.
    same_context = _context_key(then) == _context_key(now)
    by_key: dict[str, deque] = defaultdict(deque)
    ranked = sorted(range(len(live)), key=lambda k: (_PREFERENCE.get(live[k][2], 3), k))
    for k in ranked if same_context else ():
        task_id, command, state = live[k]
        by_key[command].append((task_id, state))
    done_keys = {c for c, rows in by_key.items() if any(state == TaskState.DONE for _, state in rows)}
    taken = set(all_ids)
    tasks: list[Task] = []
    new: list[str] = []
    kept = kept_done = redone = 0
    for t in bag.tasks:
        rows = by_key.get(t.command)
        if rows:
            task_id, state = rows.popleft()
            kept += 1
            kept_done += state == TaskState.DONE
        else:
            task_id = _fresh_id(t.id, taken)
            taken.add(task_id)
            redone += t.command in done_keys
            new.append(task_id)
        tasks.append(t if t.id == task_id else Task(task_id, t.command, t.params, t.estimates_s))
    dropped = _left_over(live, by_key) if same_context else tuple(task_id for task_id, _, _ in live)
    return BagEdit(bag=replace(bag, tasks=tuple(tasks)), kept=kept, kept_done=kept_done, new=tuple(new),
                   dropped=dropped, redone=redone, context_changed=dict(then) != now)


def _left_over(live, by_key) -> tuple[str, ...]:
    """The journal's tasks no key of the bag took, in bag order."""
    left = {task_id for rows in by_key.values() for task_id, _ in rows}
    return tuple(task_id for task_id, _, _ in live if task_id in left)


def _fresh_id(wanted: str, taken: set[str]) -> str:
    if wanted not in taken:
        return wanted
    n = 2
    while f"{wanted}-{n}" in taken:
        n += 1
    return f"{wanted}-{n}"
