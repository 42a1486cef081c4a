"""The sampling phase, live: a :class:`~broker.core.estimate.SamplingDriver` run against agents.

The driver (pure logic) decides which task to draw next and feeds its stopping rule in draw
order; this shell carries that out on real nodes (ALGORITHMS.md 2.1, "Rules that make it
correct in a live system"):

* the bag's ``setup`` command runs once on every node, before any draw goes there;
* every slot of every node is kept busy with draws (fastest nodes first) for as long as the
  driver wants them; results come back in any order and go to the driver as they arrive
  (it buffers them into draw order);
* runtimes are normalised by the node's declared speed: reference seconds = wall seconds x
  speed. A draw that hits the bag's timeout counts as ``Z = 1`` (its runtime is recorded as at
  least ``R_max / speed``, so the driver caps it at ``R_max`` whatever the node's speed) and
  is logged as ``sample.timeout``;
* a draw that fails (non-zero exit, or the agent could not run it) is a problem of the bag:
  it is retried (a new attempt, within the bag's ``retries``) so that the draw order keeps no
  hole, and sampling stops with :class:`SamplingFailed`, naming the task and the tail of its
  stderr, at the ``max_failures``-th failure or once a task has no retry left;
* when the rule is satisfied, draws still running are extra, real work: they are waited for
  up to ``drain_means`` estimated mean runtimes (on the slowest node) and kept; those still
  running then are cancelled (they will run again under ``broker run``). One mean is the
  default: a running draw has already done part of its work, so most finish within it, and
  the plan is not held up by a long tail;
* every completed draw is returned with its runtime and exit code (used by the rule or
  extra), so that ``broker run`` can count the successful ones as done.

Agents are attached by the caller with one shared inbox (:func:`attached_nodes` does it for
the inventory's private nodes, local or over SSH, and always stops them). The runner never stops an
agent itself. Ctrl-C, a lost node, failing tasks: a :class:`SamplingStopped` subclass
carrying the draws completed so far, so that none of that work is forgotten. A bag too small
for the rule is not an error: once every task ran, the mean is the bag's, exactly
(``Estimate.exact``), and sampling ends with it.

Events: ``sample.setup`` (node, runtime_s), ``sample.timeout`` (task, node, runtime_s),
``sample.failure`` (task, node, attempt, exit_code, error), ``sample.done`` (rule, samples,
mean_ref_s, eps, delta, capped, exact, completed, extra, cancelled, wall_s).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from broker.core.estimate import Estimate, SamplingDriver, StoppingRule
from broker.core.model import Bag, PrivateNode
from broker.shells.agent_client import AgentClient, NodeLost, TaskLost
from broker.shells.nodes import LocalAgents, SshAgents, agent_dir
from workers.protocol import Result, Run

log = structlog.get_logger()

SETUP_TASK_ID = "broker.setup"
DEFAULT_MAX_FAILURES = 3
# Once cancelled, a draw's Result is waited for at most this long (the agent's SIGTERM to
# SIGKILL grace is shorter); a draw still unreported is counted as cancelled anyway.
_CANCEL_WAIT_S = 15.0
_POLL_S = 0.25


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class SampleNode:
    """An attached agent that draws may run on: ``slots`` at once, each at ``speed``, in the
    working directory ``cwd`` on that node (``None``: the agent's home)."""

    name: str
    client: AgentClient
    slots: int
    speed: float = 1.0
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class SampledTask:
    """One draw that completed. ``draw`` is its position in the draw order (1 = first);
    ``used`` says whether the stopping rule consumed it (else it is extra work)."""

    task_id: str
    node: str
    attempt: int
    draw: int
    runtime_s: float
    runtime_ref_s: float
    exit_code: int | None
    timed_out: bool
    used: bool = False

    @property
    def ok(self) -> bool:
        """The task is done: ``broker run`` need not run it again."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """An attempt that failed during sampling (for the user: which, where, why)."""

    task_id: str
    node: str
    attempt: int
    exit_code: int | None
    error: str | None
    stderr_tail: str

    def describe(self) -> str:
        why = self.error or (f"exit code {self.exit_code}" if self.exit_code is not None else "no exit code")
        tail = "\n".join("    " + line for line in self.stderr_tail.rstrip().splitlines()[-5:])
        return f"task {self.task_id} (attempt {self.attempt} on {self.node}): {why}" + (
            f"\n  stderr ends with:\n{tail}" if tail else "\n  (nothing on stderr)"
        )


@dataclass(frozen=True, slots=True)
class SampleProgress:
    """Where sampling stands: draws completed and running, and their mean so far."""

    completed: int
    running: int
    mean_ref_s: float | None  # of the completed draws, capped at R_max
    sd_ref_s: float | None
    failures: int
    finished: bool = False  # the last report: the rule is satisfied and the extra draws settled


@dataclass(frozen=True, slots=True)
class SamplingOutcome:
    """The estimate, and every draw that completed (in draw order)."""

    estimate: Estimate
    tasks: Mapping[str, SampledTask]
    cancelled: tuple[str, ...] = ()
    failures: tuple[TaskFailure, ...] = ()
    r_max_s: float = math.inf

    @property
    def done_task_ids(self) -> frozenset[str]:
        """Tasks that finished successfully while sampling: work ``broker run`` can skip."""
        return frozenset(t.task_id for t in self.tasks.values() if t.ok)

    @property
    def used_ref_s(self) -> tuple[float, ...]:
        """The reference runtimes the rule consumed, capped at ``R_max``, in draw order."""
        return tuple(min(t.runtime_ref_s, self.r_max_s) for t in self.tasks.values() if t.used)


class SamplingStopped(Exception):
    """Sampling ended without an estimate. ``tasks`` holds the draws completed until then."""

    def __init__(self, message: str, tasks: Mapping[str, SampledTask], failures: Sequence[TaskFailure] = ()):
        super().__init__(message)
        self.tasks = dict(tasks)
        self.failures = tuple(failures)


class SamplingFailed(SamplingStopped):
    """Tasks (or the setup command) failed, or a node was lost: a problem to fix first."""


class SamplingExhausted(SamplingStopped):  # no longer raised: a used-up bag gives its exact mean
    """The rule wanted more samples than the bag holds."""


class SamplingInterrupted(SamplingStopped):
    """The user interrupted sampling (Ctrl-C)."""


# --------------------------------------------------------------------------- the runner


def sample_bag(
    bag: Bag,
    nodes: Sequence[SampleNode],
    inbox: queue.Queue[tuple[str, Any]],
    rule: StoppingRule,
    rng: np.random.Generator,
    *,
    max_failures: int = DEFAULT_MAX_FAILURES,
    drain_means: float | None = 1.0,
    on_progress: Callable[[SampleProgress], None] | None = None,
) -> SamplingOutcome:
    """Estimate the bag's mean runtime by running random draws of its tasks on ``nodes``.

    ``inbox`` is the queue every node's client delivers to. ``rule`` sees ``R_max`` = the
    bag's timeout. ``drain_means`` bounds the wait for draws still running once the rule is
    satisfied, in estimated mean runtimes on the slowest node (``None``: wait for all of
    them; ``0``: cancel them at once). Raises a :class:`SamplingStopped` subclass when no
    estimate can be given.
    """
    runner = _Runner(bag, nodes, inbox, rule, rng, max_failures, on_progress)
    try:
        return runner.run(drain_means)
    except KeyboardInterrupt:
        raise SamplingInterrupted("sampling interrupted", runner.in_draw_order(), runner.failures) from None


class _Runner:
    def __init__(
        self,
        bag: Bag,
        nodes: Sequence[SampleNode],
        inbox: queue.Queue[tuple[str, Any]],
        rule: StoppingRule,
        rng: np.random.Generator,
        max_failures: int,
        on_progress: Callable[[SampleProgress], None] | None,
    ) -> None:
        if not nodes:
            raise ValueError("sampling needs at least one node")
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        if any(task.id == SETUP_TASK_ID for task in bag.tasks):
            raise ValueError(f"the task id {SETUP_TASK_ID!r} is reserved for the setup command")
        self.bag = bag
        self.r_max_s = bag.timeout_s
        # Fastest nodes first: draws go where they finish soonest.
        self.nodes = sorted(nodes, key=lambda n: -n.speed)
        self.by_name = {n.name: n for n in self.nodes}
        self.inbox = inbox
        self.max_failures = max_failures
        self.on_progress = on_progress
        self.driver = SamplingDriver(len(bag), rule, rng, bag.timeout_s, slots=sum(n.slots for n in nodes))
        self.free = {n.name: n.slots for n in self.nodes}
        self.running: dict[str, tuple[str, int]] = {}  # task id -> (node, attempt)
        self.index_of = {task.id: i for i, task in enumerate(bag.tasks)}
        self.draw_of: dict[str, int] = {}
        self.completed: dict[str, SampledTask] = {}
        self.failures: list[TaskFailure] = []
        self.cancelled: list[str] = []

    # ----------------------------------------------------------------- phases

    def run(self, drain_means: float | None) -> SamplingOutcome:
        started = time.monotonic()
        if self.bag.setup:
            self._set_up_nodes()
        while not self.driver.finished:
            self._fill_slots()
            if not self.running:
                raise RuntimeError("the sampling driver wants samples but gave no task to run")  # a driver bug
            self._handle(self._next_events())
        # The rule is satisfied, or the whole bag ran and its mean is exact (Estimate.exact).
        estimate = self.driver.estimate()
        if estimate.exact:
            log.info("sample.exhausted", rule=estimate.rule, samples=estimate.samples)
        slowest = min(n.speed for n in self.nodes)
        self._drain(None if drain_means is None else drain_means * estimate.mean_ref_s / slowest)
        outcome = SamplingOutcome(
            estimate=estimate,
            tasks=self.in_draw_order(),
            cancelled=tuple(self.cancelled),
            failures=tuple(self.failures),
            r_max_s=self.r_max_s,
        )
        extra = sum(1 for t in outcome.tasks.values() if not t.used)
        if self.on_progress is not None:
            self.on_progress(self._progress(finished=True))
        log.info("sample.done", rule=estimate.rule, samples=estimate.samples, mean_ref_s=estimate.mean_ref_s,
                 eps=estimate.eps, delta=estimate.delta, capped=estimate.capped, exact=estimate.exact,
                 completed=len(outcome.tasks),
                 extra=extra, cancelled=len(self.cancelled), wall_s=round(time.monotonic() - started, 3))
        return outcome

    def _set_up_nodes(self) -> None:
        """Run the bag's setup command once on every node, all at once; any failure stops."""
        for node in self.nodes:
            node.client.submit([self._run_of(SETUP_TASK_ID, 1, self.bag.setup or "", None, node)])
        pending = {n.name for n in self.nodes}
        while pending:
            for name, event in self._next_events():
                if isinstance(event, NodeLost):
                    raise SamplingFailed(f"lost the agent on {name} during setup: {event.reason}", {})
                if not (isinstance(event, Result) and event.task == SETUP_TASK_ID):
                    continue
                self.by_name[name].client.ack([(event.task, event.attempt)])
                if not event.ok:
                    failure = _failure_of(event, name)
                    raise SamplingFailed(
                        f"the bag's setup command failed on {name}: {failure.describe()}", {}, [failure]
                    )
                log.info("sample.setup", node=name, runtime_s=round(event.runtime_s, 3))
                pending.discard(name)

    def _fill_slots(self) -> None:
        """Give every free slot a draw while the driver wants more."""
        for node in self.nodes:
            runs = []
            while self.free[node.name] > 0:
                index = self.driver.next_draw()
                if index is None:
                    break
                task = self.bag.tasks[index]
                self.draw_of[task.id] = len(self.draw_of) + 1
                runs.append(self._start(task.id, node.name, 1))
            node.client.submit(runs)

    def _start(self, task_id: str, node: str, attempt: int) -> Run:
        self.free[node] -= 1
        self.running[task_id] = (node, attempt)
        command = self.bag.tasks[self.index_of[task_id]].command
        return self._run_of(task_id, attempt, command, self.r_max_s, self.by_name[node])

    def _run_of(self, task_id: str, attempt: int, command: str, timeout_s: float | None, node: SampleNode) -> Run:
        return Run(task_id, attempt, command, timeout_s=timeout_s, env=dict(self.bag.env), cwd=node.cwd)

    def _drain(self, drain_s: float | None) -> None:
        """Keep the extra draws that finish within ``drain_s``; cancel the rest."""
        deadline = math.inf if drain_s is None else time.monotonic() + drain_s
        cancel_deadline: float | None = None
        while self.running:
            now = time.monotonic()
            if cancel_deadline is None and now >= deadline:
                for name in {node for node, _ in self.running.values()}:
                    keys = [(task, attempt) for task, (node, attempt) in self.running.items() if node == name]
                    self.by_name[name].client.cancel(keys)
                cancel_deadline = now + _CANCEL_WAIT_S
            if cancel_deadline is not None and now >= cancel_deadline:
                self.cancelled.extend(self.running)  # unreported: they did not count either way
                self.running.clear()
                break
            self._handle(self._next_events(min(_POLL_S, max(0.0, deadline - now))))

    # ----------------------------------------------------------------- events

    def _next_events(self, timeout_s: float = _POLL_S) -> list[tuple[str, Any]]:
        """The events that arrived, waiting up to ``timeout_s`` for the first."""
        events = []
        try:
            events.append(self.inbox.get(timeout=timeout_s))
            while True:
                events.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return events

    def _handle(self, events: list[tuple[str, Any]]) -> None:
        results = 0
        for name, event in events:
            if isinstance(event, Result):
                self._on_result(name, event)
                results += 1
            elif isinstance(event, TaskLost):
                self._on_lost(name, event)
            elif isinstance(event, NodeLost):
                raise SamplingFailed(
                    f"lost the agent on {name}: {event.reason}", self.in_draw_order(), self.failures
                )
        if results and self.on_progress is not None:
            self.on_progress(self._progress())

    def _on_result(self, name: str, result: Result) -> None:
        node = self.by_name[name]
        node.client.ack([(result.task, result.attempt)])
        if self.running.get(result.task) != (name, result.attempt):
            return  # a stale attempt (replayed after a re-attach): already settled
        del self.running[result.task]
        self.free[name] += 1
        if result.cancelled:
            self.cancelled.append(result.task)
            return
        if result.ok or result.timed_out:
            self._record(node, result)
            return
        failure = _failure_of(result, name)
        self.failures.append(failure)
        log.warning("sample.failure", task=result.task, node=name, attempt=result.attempt,
                    exit_code=result.exit_code, error=result.error)
        if len(self.failures) >= self.max_failures or result.attempt > self.bag.retries:
            why = (f"{len(self.failures)} sampled tasks failed" if len(self.failures) >= self.max_failures
                   else f"task {result.task} failed {result.attempt} times (the bag allows {self.bag.retries} retries)")
            raise SamplingFailed(
                f"{why}; fix the bag before planning. Last failure: {failure.describe()}",
                self.in_draw_order(),
                self.failures,
            )
        if not self.driver.done:  # its result is still needed, in its place in the draw order
            node.client.submit([self._start(result.task, name, result.attempt + 1)])

    def _on_lost(self, name: str, lost: TaskLost) -> None:
        """The agent forgot an attempt (it restarted): run it again, not as a failure."""
        if self.running.get(lost.task) != (name, lost.attempt):
            return
        del self.running[lost.task]
        self.free[name] += 1
        self.by_name[name].client.submit([self._start(lost.task, name, lost.attempt + 1)])

    def _record(self, node: SampleNode, result: Result) -> None:
        runtime_s = result.runtime_s
        if result.timed_out:  # Z = 1 on any node, whatever its speed
            runtime_s = max(runtime_s, self.r_max_s / node.speed)
            log.warning("sample.timeout", task=result.task, node=node.name, runtime_s=round(result.runtime_s, 3))
        self.driver.record(self.index_of[result.task], runtime_s, node.speed)
        self.completed[result.task] = SampledTask(
            task_id=result.task,
            node=node.name,
            attempt=result.attempt,
            draw=self.draw_of[result.task],
            runtime_s=result.runtime_s,
            runtime_ref_s=runtime_s * node.speed,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
        )

    # ----------------------------------------------------------------- results

    def in_draw_order(self) -> dict[str, SampledTask]:
        """Completed draws by draw position, each marked used if the rule consumed it."""
        extra = self.driver.extra if self.driver.done else {}
        in_order = sorted(self.completed.values(), key=lambda t: t.draw)
        return {
            t.task_id: _replace_used(t, self.driver.finished and self.index_of[t.task_id] not in extra)
            for t in in_order
        }

    def _progress(self, finished: bool = False) -> SampleProgress:
        capped = [min(self.completed[t].runtime_ref_s, self.r_max_s) for t in self.completed]
        return SampleProgress(
            completed=len(capped),
            running=len(self.running),
            mean_ref_s=float(np.mean(capped)) if capped else None,
            sd_ref_s=float(np.std(capped, ddof=1)) if len(capped) > 1 else None,
            failures=len(self.failures),
            finished=finished,
        )


def _replace_used(task: SampledTask, used: bool) -> SampledTask:
    return SampledTask(task.task_id, task.node, task.attempt, task.draw, task.runtime_s, task.runtime_ref_s,
                       task.exit_code, task.timed_out, used)


def _failure_of(result: Result, node: str) -> TaskFailure:
    return TaskFailure(result.task, node, result.attempt, result.exit_code, result.error, result.stderr_tail)


# --------------------------------------------------------------------------- nodes


def local_agent_dir(run_dir: str | os.PathLike[str], node: str) -> Path:
    """Where the agent of local node ``node`` keeps its state and the tasks' outputs."""
    return agent_dir(Path(run_dir), node)


@contextlib.contextmanager
def attached_nodes(
    nodes: Sequence[PrivateNode], run_dir: str | os.PathLike[str], run_id: str
) -> Iterator[tuple[list[SampleNode], queue.Queue[tuple[str, Any]]]]:
    """Start an agent on each private node and yield them (as :class:`SampleNode`) with their
    shared inbox; stop every one of them on the way out, whatever happens (their running
    tasks are cancelled).

    ``local: true`` nodes get an agent under ``run_dir/agents/<node>``; the others are
    reached over SSH (known_hosts checked), their agent state under ``~/.broker/runs/<run_id>``
    on the node, as for ``broker run`` (:mod:`broker.shells.nodes`). A node that cannot be
    reached raises :class:`SamplingFailed` naming it.
    """
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
    local, remote = LocalAgents(Path(run_dir), inbox), SshAgents(run_id, inbox)
    attached: list[tuple[PrivateNode, AgentClient | None]] = []
    try:
        for node in nodes:
            attached.append((node, None))  # stopped even if the handshake fails half-way
            try:
                client = local.attach(node.name, node.slots) if node.local else remote.attach(node)
            except (ConnectionError, OSError, ValueError) as exc:
                raise SamplingFailed(f"cannot start the agent on {node.name}: {exc}", {}) from exc
            attached[-1] = (node, client)
        yield [SampleNode(n.name, c, n.slots, n.speed) for n, c in attached if c is not None], inbox
    finally:
        for node, client in attached:
            (local if node.local else remote).stop(node.name, client)


# --------------------------------------------------------------------------- the record


def samples_document(
    tasks: Mapping[str, SampledTask],
    estimate: Estimate | None = None,
    cancelled: Sequence[str] = (),
    failures: Sequence[TaskFailure] = (),
) -> dict[str, Any]:
    """What ``run_dir/samples.json`` holds: the estimate (if any), and every completed draw
    (task id -> runtime, exit code, ...) so that ``broker run`` can count the done ones."""
    return {
        "estimate": None if estimate is None else {
            "rule": estimate.rule, "samples": estimate.samples, "mean_ref_s": estimate.mean_ref_s,
            "eps": estimate.eps, "delta": estimate.delta, "capped": estimate.capped, "exact": estimate.exact,
        },
        "tasks": {
            t.task_id: {"node": t.node, "attempt": t.attempt, "draw": t.draw, "runtime_s": t.runtime_s,
                        "runtime_ref_s": t.runtime_ref_s, "exit_code": t.exit_code, "timed_out": t.timed_out,
                        "used": t.used, "done": t.ok}
            for t in tasks.values()
        },
        "cancelled": list(cancelled),
        "failures": [
            {"task": f.task_id, "node": f.node, "attempt": f.attempt, "exit_code": f.exit_code, "error": f.error,
             "stderr_tail": f.stderr_tail}
            for f in failures
        ],
    }
