"""What a failure means: retry, quarantine the task, stop using a node, avoid a type.

One set of rules for the simulator and the live daemon, so both give up on the same tasks:
the run ledger (``ledger/``) keeps the book and asks it; the shells only report what
happened. Pure: times come in as arguments, nothing reads a clock.

Tasks. Every attempt that ends without a result by the task's own doing counts one
failure (a non-zero exit, a timeout, the agent's error running it). An attempt *lost* with
its infrastructure (its node vanished, its agent was killed or stopped, its link dropped for
good: no signature) is no fault of the task: it counts against no ``retries``, only against
``lost_attempts``, a separate bound so that a task that brings its node down each time it
runs cannot loop for ever. Cancelled attempts (the losing replica, a planned release) count
nothing. A task is *quarantined* (never re-queued) when

- it failed more than ``retries`` times (the bag's ``retries``, as AWS Batch counts
  attempts), or
- the same error (``signature``: the exit code, "timed out", the agent's error text) ended
  it on ``distinct_nodes`` different nodes: a poison task, which more retries would only
  spread over the fleet (lost attempts carry no signature: a task is not poison because
  the instances under it were taken away), or
- more than ``lost_attempts`` of its attempts were lost with their node or agent.

Nodes. A node on which ``node_strikes`` different tasks failed in a row is a *bad node* (a
full disk, a missing library, HTCondor's "black hole": it fails fast, so it would eat every
task's retries) when either other nodes finished work meanwhile, or ``node_strikes`` of
those tasks failed that way nowhere else. The ledger stops giving it work. When the same tasks fail
alike everywhere, the tasks are at fault, not the node: they are quarantined by their own
rules and no node is blamed; nor is the last node a run has (``others`` = 0).

Types. A launch refused for capacity or a limit makes its type *avoided* for
``type_cooldown_s``: the shell shows the controller that type with no room for new
instances, so the next plan is made around it (EC2's capacity comes back by itself; asking
again at once only fails again).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from ..model import MachineType


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    retries: int = 2  # failures allowed: the task is quarantined at failure retries + 1
    distinct_nodes: int = 2  # the same error on this many nodes quarantines the task (0: off)
    node_strikes: int = 3  # distinct tasks failing in a row on one node make it bad (0: off)
    type_cooldown_s: float = 1800.0  # a type refused for capacity or a limit is avoided this long
    reattaches: int = 5  # a node's agent is re-attached at most this many times a run, then lost
    lost_attempts: int = 5  # attempts lost with their node or agent: past this many, quarantined
    max_spot_attempts: int = 2  # a task interrupted this often on spot runs on on-demand/private only

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.distinct_nodes < 0 or self.distinct_nodes == 1:
            raise ValueError(f"distinct_nodes must be 0 (off) or >= 2, got {self.distinct_nodes}")
        if self.node_strikes < 0:
            raise ValueError(f"node_strikes must be >= 0, got {self.node_strikes}")
        if self.type_cooldown_s < 0:
            raise ValueError(f"type_cooldown_s must be >= 0, got {self.type_cooldown_s}")
        if self.reattaches < 0:
            raise ValueError(f"reattaches must be >= 0, got {self.reattaches}")
        if self.lost_attempts < 0:
            raise ValueError(f"lost_attempts must be >= 0, got {self.lost_attempts}")
        if self.max_spot_attempts < 1:
            raise ValueError(f"max_spot_attempts must be >= 1, got {self.max_spot_attempts}")


# What a lost agent reports for the attempts it was running: no fault of the task.
AGENT_STOPPED = "agent stopped while this attempt ran"
# What a stopping agent (SIGTERM: a node rebooting) answers a Run it will not start.
AGENT_STOPPING = "the agent is shutting down"


def signature(exit_code: int | None, timed_out: bool, error: str | None) -> str | None:
    """A failed attempt's error as compared across nodes: a timeout, its exit code, or the
    agent's error text; None when the attempt went with its agent (no fault of the task)."""
    if timed_out:
        return "timed out"
    if exit_code is not None:
        return f"exit code {exit_code}"
    if error and (AGENT_STOPPED in error or AGENT_STOPPING in error):
        return None
    return error or None


class Outcome(enum.Enum):
    RETRY = "retry"
    QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    failures: int
    retries_left: int
    reason: str = ""  # why quarantined; empty for a retry
    bad_node: bool = False  # this failure made its node a bad node (just now)
    lost: bool = False  # the attempt was lost with its node or agent: no failure of the task

    @property
    def quarantined(self) -> bool:
        return self.outcome is Outcome.QUARANTINE


@dataclass
class _Streak:
    tasks: set[str] = field(default_factory=set)
    successes_before: int = 0  # successes anywhere when the streak began


class FailureBook:
    """Failures per task and per node; mutable, owned by one shell."""

    def __init__(self, policy: FailurePolicy = FailurePolicy()) -> None:
        self.policy = policy
        self.failures: dict[str, int] = {}
        self.losses: dict[str, int] = {}  # task -> attempts lost with their node or agent
        self._errors: dict[str, dict[str, set[str]]] = {}  # task -> signature -> nodes
        self._streaks: dict[str, _Streak] = {}
        self._successes = 0
        self.bad_nodes: set[str] = set()
        self.quarantined: dict[str, str] = {}  # task -> reason

    def failed(self, task: str, node: str, signature: str | None, others: int = 1) -> Verdict:
        """An attempt of ``task`` on ``node`` ended without a result; ``signature`` names the
        error (None for a lost node); ``others``: how many other nodes could still take
        work. Returns what to do with the task."""
        n = self.failures.get(task, 0) + 1
        self.failures[task] = n
        p = self.policy
        reason = ""
        if n > p.retries:
            reason = f"failed {n} times (retries: {p.retries})"
        if signature is not None:
            nodes = self._errors.setdefault(task, {}).setdefault(signature, set())
            nodes.add(node)
            if p.distinct_nodes and len(nodes) >= p.distinct_nodes and not reason:
                reason = f"{signature!s} on {len(nodes)} nodes ({', '.join(sorted(nodes))})"
        became_bad = False
        if signature is not None and p.node_strikes and node not in self.bad_nodes and others > 0:
            streak = self._streaks.setdefault(node, _Streak(successes_before=self._successes))
            streak.tasks.add(task)
            if len(streak.tasks) >= p.node_strikes and (
                self._successes > streak.successes_before or self._own(streak.tasks, node) >= p.node_strikes
            ):
                self.bad_nodes.add(node)
                became_bad = True
        left = max(0, p.retries + 1 - n)
        if reason:
            self.quarantined[task] = reason
            return Verdict(Outcome.QUARANTINE, n, 0, reason, became_bad)
        return Verdict(Outcome.RETRY, n, left, "", became_bad)

    def lost(self, task: str, node: str) -> Verdict:
        """An attempt of ``task`` was lost with ``node`` or its agent: no failure of the task
        (its ``retries`` are untouched); quarantined only past ``lost_attempts`` such losses."""
        n = self.losses.get(task, 0) + 1
        self.losses[task] = n
        p = self.policy
        failures = self.failures.get(task, 0)
        if n > p.lost_attempts:
            reason = (f"lost with its node or agent {n} times (lost_attempts: {p.lost_attempts}): "
                      f"it may be what brings its nodes down (last: {node})")
            self.quarantined[task] = reason
            return Verdict(Outcome.QUARANTINE, failures, 0, reason, lost=True)
        return Verdict(Outcome.RETRY, failures, max(0, p.retries + 1 - failures), lost=True)

    def _own(self, tasks: set[str], node: str) -> int:
        """How many of ``tasks`` failed on ``node`` with errors seen on no other node."""
        return sum(
            1 for task in tasks
            if not any(node in nodes and len(nodes) > 1 for nodes in self._errors.get(task, {}).values())
        )

    def succeeded(self, node: str) -> None:
        """A task finished on ``node``: its streak of failures ends."""
        self._successes += 1
        self._streaks.pop(node, None)

    def is_quarantined(self, task: str) -> bool:
        return task in self.quarantined


class TypeCooldown:
    """Instance types refused for capacity or a limit, avoided until a time (run seconds)."""

    def __init__(self, cooldown_s: float = FailurePolicy().type_cooldown_s) -> None:
        self.cooldown_s = cooldown_s
        self.until_s: dict[str, float] = {}

    def refused(self, type_name: str, now_s: float) -> None:
        self.until_s[type_name] = now_s + self.cooldown_s

    def avoided(self, now_s: float) -> set[str]:
        return {name for name, until in self.until_s.items() if until > now_s}

    def restrict(self, types: Mapping[str, MachineType], live: Mapping[str, int] | Iterable[str],
                 now_s: float) -> Mapping[str, MachineType]:
        """``types`` as the controller should see them: an avoided type keeps the instances
        it has (``live``: count per type, or the type names of live instances) and gets no
        room for more. The same mapping when nothing is avoided."""
        avoided = self.avoided(now_s)
        if not avoided:
            return types
        if not isinstance(live, Mapping):
            counts: dict[str, int] = {}
            for name in live:
                counts[name] = counts.get(name, 0) + 1
            live = counts
        return {name: (replace(t, limit=min(t.limit, live.get(name, 0))) if name in avoided else t)
                for name, t in types.items()}


# A run with nothing running and no node left to run on waits this many monitoring ticks
# before it may give up (a node may be between release and its replacement).
IDLE_TICKS_TO_GIVE_UP = 3


def may_give_up(idle_ticks: int, *, budget_stopped: bool, types_avoided: bool, tick_s: float,
                replan_every_s: float) -> bool:
    """Whether a run with no node left and nothing running for ``idle_ticks`` ticks ends.

    Not before ``IDLE_TICKS_TO_GIVE_UP`` ticks; at once after that when the budget has
    stopped (nothing more can be bought); otherwise only once no type is avoided after a
    capacity or limit error and a whole re-plan interval has passed, so that losing every
    instance at once does not end a run its budget can still pay for. The run ledger asks
    this at every tick (``Ledger.on_tick``).
    """
    if idle_ticks <= IDLE_TICKS_TO_GIVE_UP:
        return False
    if budget_stopped:
        return True
    if types_avoided:
        return False
    return idle_ticks * tick_s > replan_every_s + tick_s
