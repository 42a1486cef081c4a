"""The live shell: carries out the controller's actions with real agents, EC2 and a journal.

It drives the same :class:`~broker.core.control.controller.Controller` as the simulator
(``broker/sim/engine.py``) and differs from it only in real I/O: time is a
:class:`~broker.shells.clock.RunClock`, instances come from :class:`Ec2Fleet` (moto in a dry
run), tasks run on worker agents, and every step is written to the run's journal.

Threads. One loop thread (the caller of :meth:`Daemon.run`) owns all state. Everything else
only puts messages on the loop's inbox queue: each agent client's reader thread
``(node, Started | Result | NodeLost | TaskLost ...)``, and APScheduler's jobs
``(None, Tick | BootDone | ReleaseDue)`` (the monitoring tick, "instance booted", and one
release timer per instance). A signal handler only sets a flag the loop reads.

One turn of the loop:

1. drain the inbox (waiting at most ``poll_s`` for the first message);
2. record agent results in one journal batch, then acknowledge them to the agents (an ack
   means "durably recorded", so it is sent only once the batch has committed);
3. handle ticks, finished boots and due releases;
4. ask the controller: ``tick=True`` on a monitoring tick (it may re-plan), ``tick=False``
   when slots freed up or nodes became ready (dispatch only); carry out its actions.

Actions. ``Launch``: intent, ``Ec2Fleet.launch`` with client token ``<run>-<seq>``, each
instance recorded with its own ``<run>-<seq>-<k>`` token, outcome; failures are events
and the controller, seeing no new instance, re-plans (no blind retry). After the type's boot
delay (run time) the instance gets its agent (a local agent in a dry run). ``ScheduleRelease``
replaces the instance's timer; when it fires the instance's running attempts are cancelled
and re-queued, its agent is stopped, and it is terminated (only tagged instances ever are).
``Assign``/``Replicate``: the attempt is journaled, then submitted; the first successful
copy wins and the others are cancelled.

Faults (the rules are the core's :class:`~broker.core.control.failures.FailureBook`, the
same the simulator applies). A failed attempt is retried up to the bag's ``retries``; past
them, or when the same error ended it on two nodes, the task is quarantined (journal state
``quarantined``, events ``task.failed`` with ``final=true`` and ``task.quarantined`` with
the stderr tail). A node where several tasks in a row fail while others finish is not
given work again (``node.quarantined``; an instance is released). A lost agent connection
(agent killed, SSH dropped) is re-attached at once when ``reattach_agent`` is given: a
surviving agent replays what finished meanwhile, a restarted one reports the attempts it
lost, which are re-queued; only when that fails is the node lost and its attempts
re-queued. A launch refused for capacity or a limit makes the controller see its type
without room for ``type_cooldown_s``, so the next plan goes around it.
"""

from __future__ import annotations

import math
import queue
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import structlog

from broker.core.control.actions import (
    Assign,
    Cancel,
    CancelRelease,
    Launch,
    Replicate,
    ScheduleRelease,
    StopForBudget,
)
from broker.core.control.controller import Controller, ControllerConfig, Decision
from broker.core.control.failures import FailureBook, FailurePolicy, TypeCooldown, may_give_up
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Memory, NodeView, Observations, RunningTask, Snapshot
from broker.core.model import Bag, Inventory, MachineType, PrivateNode
from broker.shells.agent_client import AgentClient, NodeLost, TaskLost
from broker.shells.aws.records import LaunchErrorKind
from broker.shells.clock import RunClock
from broker.shells.diskfull import DiskFull
from broker.shells.logging import mask_secrets, register_secrets_in
from broker.shells.journal import AttemptResult, Journal
from workers.protocol import Result, Run

SETUP_TASK = "__setup__"
# Re-attaching to a node's agent is tried this many times over a run, then the node is lost.
MAX_REATTACHES = 5


# -- messages the scheduler's jobs put on the inbox ----------------------------------------
@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class BootDone:
    instance_id: str


@dataclass(frozen=True, slots=True)
class Attached:
    """An instance agent attached in the background (``client``), or could not be (``error``)."""

    instance_id: str
    client: Any
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class ReleaseDue:
    instance_id: str
    version: int


@dataclass(frozen=True, slots=True)
class SpendRequest:
    """What the first launch of a run would buy, for the user to confirm."""

    launches: tuple[tuple[str, int], ...]
    estimated_usd: float
    memory: Memory
    remaining: Any  # RemainingWork | None


@dataclass(frozen=True, slots=True)
class SampledTask:
    """A task ``broker plan --sample`` already ran to success (from its ``samples.json``)."""

    task: str
    node: str
    attempt: int
    draw: int
    runtime_s: float
    runtime_ref_s: float
    exit_code: int | None = 0


@dataclass(frozen=True, slots=True)
class PriorSamples:
    """What ``broker plan --sample`` learnt: its done tasks (not run again, their runtimes
    observed) and, when its stopping rule was met, the estimate that replaces the run's own
    sampling phase."""

    source: str
    done: tuple[SampledTask, ...]
    mean_ref_s: float | None = None
    sd_ref_s: float | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    run_dir: Path
    run_id: str
    dry_run: bool = True
    tick_s: float = 60.0  # run time between monitoring ticks
    poll_s: float = 0.05  # wall time the loop waits for a message
    seed: int = 0
    resume: bool = False  # rebuild the run from its journal instead of starting it
    on_stop: str = "release"  # on SIGINT/SIGTERM: "release" everything, or "leave" it running


@dataclass
class RunReport:
    """What the run delivered next to what was planned (thesis Table 6.6 style)."""

    run_id: str
    state: str  # finished | stopped | left (stopped with --on-stop leave: resumable)
    tasks_total: int
    tasks_done: int
    tasks_failed: int
    samples: int
    instances_launched: int
    makespan_s: float
    cost_usd: float
    cloud_cost_usd: float
    private_cost_usd: float
    planned_makespan_s: float | None
    planned_cost_usd: float | None
    cost_by_type_usd: dict[str, float]
    budget_stopped: bool
    time_scale: float
    stop_reason: str | None = None

    @staticmethod
    def deviation_pct(delivered: float, planned: float | None) -> float | None:
        if planned is None or planned <= 0:
            return None
        return 100.0 * (delivered - planned) / planned

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": self.state,
            "tasks": {"total": self.tasks_total, "done": self.tasks_done, "failed": self.tasks_failed,
                      "left": self.tasks_total - self.tasks_done - self.tasks_failed},
            "samples": self.samples,
            "instances_launched": self.instances_launched,
            "makespan_s": round(self.makespan_s, 3),
            "cost_usd": round(self.cost_usd, 6),
            "cloud_cost_usd": round(self.cloud_cost_usd, 6),
            "private_cost_usd": round(self.private_cost_usd, 6),
            "planned": {"makespan_s": _round(self.planned_makespan_s, 3), "cost_usd": _round(self.planned_cost_usd, 6)},
            "deviation_pct": {
                "makespan": _round(self.deviation_pct(self.makespan_s, self.planned_makespan_s), 2),
                "cost": _round(self.deviation_pct(self.cost_usd, self.planned_cost_usd), 2),
            },
            "cost_by_type_usd": {k: round(v, 6) for k, v in sorted(self.cost_by_type_usd.items())},
            "budget_stopped": self.budget_stopped,
            "time_scale": self.time_scale,
            "stop_reason": self.stop_reason,
        }


def failure_reason(result: Result, node: str | None = None) -> str:
    """Why an attempt failed, in words: the agent's error, a timeout, or the exit code and what
    the shell's 126/127 mean (``exit code 127: command not found on node-a (see stderr_tail)``)."""
    if result.error:
        return result.error
    if result.timed_out:
        return "timed out"
    meaning = {126: "command found but not executable", 127: "command not found"}.get(result.exit_code or 0)
    if meaning is None:
        return f"exit code {result.exit_code}"
    return f"exit code {result.exit_code}: {meaning}" + (f" on node {node}" if node else "") + " (see stderr_tail)"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class _Node:
    """A private node or an instance, as the loop tracks it (all times run seconds)."""

    id: str
    slots: int
    speed: float
    type: MachineType | None = None
    private: PrivateNode | None = None
    launched_at_s: float | None = None
    expected_ready_s: float | None = None
    ready_at_s: float | None = None  # set once its agent answered (and its setup ran)
    release_at_s: float | None = None
    release_version: int = 0
    release_cause: str | None = None
    terminated_at_s: float | None = None
    lost: bool = False
    client: AgentClient | None = None
    running: dict[int, tuple[str, int, float]] = field(default_factory=dict)  # slot -> (task, attempt, start)

    @property
    def alive(self) -> bool:
        return self.terminated_at_s is None and not self.lost

    def view(self, now_s: float, estimate_of: Callable[[str], float | None]) -> NodeView:
        running = tuple(
            RunningTask(task, attempt, slot, start, estimate_of(task))
            for slot, (task, attempt, start) in sorted(self.running.items())
        )
        if self.type is None:
            ready = None if self.ready_at_s is not None else now_s + 1.0
            return NodeView(self.id, self.slots, self.speed, running, ready_at_s=ready, lost=self.lost)
        ready = self.ready_at_s if self.ready_at_s is not None else max(self.expected_ready_s or now_s, now_s + 1.0)
        return NodeView(
            id=self.id, slots=self.slots, speed=self.speed, running=running, type_name=self.type.name,
            launched_at_s=self.launched_at_s, ready_at_s=ready,
            paid_until_s=self.type.billing.paid_until(self.launched_at_s, max(now_s, self.launched_at_s)),
            release_at_s=self.release_at_s, lost=self.lost,
        )

    def cost_usd(self, now_s: float) -> float:
        if self.type is None or self.launched_at_s is None:
            return 0.0
        end = self.terminated_at_s if self.terminated_at_s is not None else now_s
        return self.type.billing.cost_usd(max(0.0, end - self.launched_at_s), self.type.price_per_hour)


class Daemon:
    """Runs one bag to the end (or to a stop); see the module docstring.

    ``fleet`` is an :class:`~broker.shells.aws.Ec2Fleet` (moto-backed in a dry run).
    ``instance_agents`` realizes an instance as an agent (``attach(node, slots)`` and
    ``stop(node, client)``), ``private_agents`` does the same for private nodes (a callable
    taking the :class:`PrivateNode`). ``confirm`` is asked before the first launch;
    ``on_first_plan`` sees the first plan; ``on_progress(done, failed, total, committed_usd)``
    after every finished task.
    """

    def __init__(
        self,
        inventory: Inventory,
        bag: Bag,
        goal: Goal,
        options: DaemonOptions,
        *,
        journal: Journal,
        clock: RunClock,
        fleet: Any,
        instance_agents: Any,
        private_agents: Callable[[PrivateNode], AgentClient],
        stop_private_agent: Callable[[str, AgentClient | None], None],
        inbox: queue.Queue,
        config: ControllerConfig | None = None,
        confirm: Callable[[SpendRequest], bool] | None = None,
        on_first_plan: Callable[[SpendRequest], None] | None = None,
        on_progress: Callable[[int, int, int, float], None] | None = None,
        samples: PriorSamples | None = None,
        fetch_outputs: Callable[..., list[Path]] | None = None,
        reattach_agent: Callable[[str, int, AgentClient], None] | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        self.inv = inventory
        self.bag = bag
        self.goal = goal
        self.opt = options
        self.journal = journal
        self.clock = clock
        self.fleet = fleet
        self.instance_agents = instance_agents
        self.private_agents = private_agents
        self.stop_private_agent = stop_private_agent
        self.inbox = inbox
        self.config = config or ControllerConfig(tick_s=options.tick_s)
        self.controller = Controller(goal, self.config, private=inventory.private)
        self.confirm = confirm
        self.on_first_plan = on_first_plan
        self.on_progress = on_progress
        self.samples = samples
        self.fetch_outputs = fetch_outputs  # (node, workdir, path, dest, env) -> files written
        self._to_fetch: list[tuple[str, str]] = []  # (node, task) whose outputs to fetch this turn
        self.types = {t.name: t for t in inventory.types}
        self.log = structlog.get_logger().bind(run_id=options.run_id)
        register_secrets_in(bag.env)  # a task printing its token must not put it in a log
        self.rng = np.random.default_rng(options.seed)

        self.tasks = {t.id: t for t in bag.tasks}
        self.estimates: dict[str, float | None] = {
            t.id: (statistics.fmean(t.estimates_s.values()) if t.estimates_s else None) for t in bag.tasks
        }
        self.pool = TaskPool()
        self.nodes: dict[str, _Node] = {}
        self.attempts: dict[str, int] = defaultdict(int)
        self.reattach_agent = reattach_agent  # (node, slots, client): a fresh transport, re-handshaken
        self.reattaches: dict[str, int] = defaultdict(int)
        policy = failure_policy or FailurePolicy(retries=bag.retries)
        self.book = FailureBook(policy)
        self.cooldown = TypeCooldown(policy.type_cooldown_s)
        self.copies: dict[str, set[tuple[str, int, int]]] = defaultdict(set)  # task -> {(node, slot, attempt)}
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.sampled: set[str] = set()
        self.sample_keys: set[tuple[str, int]] = set()
        self.obs = Observations()
        self.memory = Memory()
        self.launch_seq = 0
        self.instances_launched = 0
        self.last_done_s = 0.0
        self.first_plan: tuple[float | None, float | None] | None = None
        self.budget_stopped = False
        self.confirmed = confirm is None
        self.stop_requested = False  # set by a signal handler: read by the loop only
        self.stop_reason: str | None = None
        self.stopping = False
        self.idle_ticks = 0
        self.scheduler = None
        self.leaving = False  # stopping with on_stop="leave": nothing is released
        self.resumed_keys: set[tuple[str, int]] = set()  # attempts a previous daemon started

    # -- public ------------------------------------------------------------------------------
    def request_stop(self, reason: str = "user_stop") -> None:
        """Ask the loop to stop dispatching and release everything (safe from a signal handler)."""
        self.stop_reason = self.stop_reason or reason
        self.stop_requested = True

    def run(self) -> RunReport:
        try:
            self._start()
        except DiskFull as exc:
            self._release_without_journal(exc)
            raise
        try:
            while not self._over():
                self._turn()
        except DiskFull as exc:
            self._release_without_journal(exc)
            raise
        except BaseException:
            self._wind_down()
            raise
        state = self._wind_down()
        return self._report(state)

    def _release_without_journal(self, exc: DiskFull) -> None:
        """The journal cannot be written (a full disk): still stop every agent and terminate every
        instance, logging what was done (stderr keeps working); ``broker down`` can repeat it."""
        self.log.error("run.disk_full", error=str(exc))
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        to_terminate = []
        for node in self.nodes.values():
            try:
                if node.type is None:
                    self.stop_private_agent(node.id, node.client)
                elif node.client is not None or node.ready_at_s is not None:
                    self.instance_agents.stop(node.id, node.client)
            except Exception as error:  # noqa: BLE001 - keep stopping the others
                self.log.warning("agent.stop_failed", node=node.id, error=str(error))
            node.client = None
            if node.type is not None and node.terminated_at_s is None:
                to_terminate.append(node.id)
        if to_terminate:
            outcome = self.fleet.terminate(to_terminate)
            self.log.error("run.disk_full_released", instance_ids=to_terminate,
                           terminated=list(outcome.terminated) + list(outcome.already_terminated),
                           failed=list(outcome.failed))

    # -- start and end -----------------------------------------------------------------------
    def _start(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        now = self.clock.now_s()
        ids = [t.id for t in self.bag.tasks]
        known = [e for e in self.estimates.values() if e is not None]
        self.prior_mean = statistics.fmean(known) if len(known) == len(ids) and known else None
        self.prior_sd = statistics.stdev(known) if self.prior_mean is not None and len(known) > 1 else None
        if self.opt.resume and self.samples is not None and self.samples.mean_ref_s is not None:
            self.prior_mean, self.prior_sd = self.samples.mean_ref_s, self.samples.sd_ref_s
        self.scheduler = BackgroundScheduler(timezone=timezone.utc)
        self.scheduler.start()
        if self.opt.resume:
            self._restore()
        else:
            self._fresh_start(now, ids)
        self.scheduler.add_job(self._post, "interval", args=(Tick(),), id="tick",
                               seconds=self.clock.wall_delay_s(self.config.tick_s),
                               coalesce=True, max_instances=1, misfire_grace_time=None)
        self._post(Tick())

    def _fresh_start(self, now: float, ids: list[str]) -> None:
        order = self.rng.permutation(len(ids))
        if self.samples is not None:
            self._adopt_samples(self.samples)
        self.pool.extend((ids[i], self.estimates[ids[i]]) for i in order if ids[i] not in self.done)
        self._emit("run.start", run_dir=str(self.opt.run_dir), dry_run=self.opt.dry_run,
                   time_scale=self.clock.time_scale, tasks=len(ids), goal=self.goal.kind, goal_value=self.goal.value,
                   tick_s=self.config.tick_s, margin_s=self.config.margin_s)
        for p in self.inv.private:
            node = _Node(p.name, p.slots, p.speed, private=p)
            self.nodes[p.name] = node
            self.journal.record_private_node(p.name, slots=p.slots, speed=p.speed, cost_per_hour=p.cost_per_hour,
                                             at_s=self.clock.to_epoch_s(now))
            try:
                node.client = self.private_agents(p)
            except Exception as exc:  # noqa: BLE001 - any failure to reach a node is reported, not fatal
                node.lost = True
                self._emit("node.lost", node=p.name, reason=f"could not start its agent: {exc}")
                continue
            self._node_attached(node)

    def _adopt_samples(self, samples: PriorSamples) -> None:
        """Count the tasks ``broker plan --sample`` ran as done, and learn from their runtimes."""
        adopted = [t for t in sorted(samples.done, key=lambda t: t.draw) if t.task in self.tasks]
        at_s = self.clock.epoch_s()
        with self.journal.batch():
            self.journal.record_sample_draws([t.task for t in adopted])
            for t in adopted:
                self.journal.task_finished(t.task, t.attempt, AttemptResult(exit_code=t.exit_code, runtime_s=t.runtime_s),
                                           node=t.node, at_s=at_s)
                self.done.add(t.task)
                self.attempts[t.task] = t.attempt
                self.sampled.add(t.task)
                self.sample_keys.add((t.task, t.attempt))
                self.obs = self.obs.add(t.runtime_ref_s, self.estimates[t.task])
        if samples.mean_ref_s is not None:
            self.prior_mean = samples.mean_ref_s
            self.prior_sd = samples.sd_ref_s
        self._emit("sample.adopted", source=samples.source, tasks_done=len(adopted), rule=samples.rule,
                   mean_ref_s=_round(samples.mean_ref_s, 3), sd_ref_s=_round(samples.sd_ref_s, 3))

    def _post(self, message: Any) -> None:
        """Scheduler jobs and the loop itself talk to the loop through the inbox only."""
        self.inbox.put((None, message))

    def _at(self, run_s: float, message: Any, job_id: str) -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=self.clock.wall_delay_s(run_s - self.clock.now_s()))
        self.scheduler.add_job(self._post, "date", args=(message,), id=job_id, run_date=when,
                               replace_existing=True, misfire_grace_time=None)

    def _over(self) -> bool:
        if self.stopping:
            return True
        settled = len(self.done) + len(self.failed) >= len(self.tasks)
        return settled and not any(n.running for n in self.nodes.values())

    def _wind_down(self) -> str:
        """Release every instance, stop every agent, close the run in the journal."""
        now = self.clock.now_s()
        cause = "user_stop" if self.stop_reason in ("user_stop", "declined") else "bag_done"
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        if self.leaving:
            return self._leave()
        for node in list(self.nodes.values()):
            if node.type is not None and node.terminated_at_s is None:
                if node.release_at_s is None or node.release_at_s > now:
                    self._emit("instance.release_scheduled", instance_id=node.id, at_s=round(now, 3),
                               paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, now), 3),
                               cause=cause)
                self._release(node, cause)
        for node in self.nodes.values():
            if node.type is None:
                self._cancel_running(node)
                self.stop_private_agent(node.id, node.client)
                node.client = None
        settled = len(self.done) + len(self.failed) >= len(self.tasks)
        state = "finished" if settled else "stopped"
        self.journal.finish_run(state, at_s=self.clock.epoch_s())
        report = self._report(state)
        self._emit("run.done", state=state, makespan_s=round(report.makespan_s, 3), cost_usd=round(report.cost_usd, 6),
                   planned_makespan_s=_round(report.planned_makespan_s, 3),
                   planned_cost_usd=_round(report.planned_cost_usd, 6),
                   tasks_done=report.tasks_done, tasks_failed=report.tasks_failed,
                   instances_launched=report.instances_launched)
        return state

    def _leave(self) -> str:
        """Stop with everything left running (``on_stop="leave"``): the agents keep their
        tasks and results, the instances stay up, the run stays ``running`` in the journal,
        so ``broker run`` on the directory resumes it and ``broker down`` releases it."""
        agents = []
        for node in self.nodes.values():
            if node.client is not None:
                node.client.close()  # the connection only: the agent keeps running
                node.client = None
                agents.append(node.id)
        instances = [n.id for n in self.nodes.values() if n.type is not None and n.terminated_at_s is None]
        self._emit("run.left", instances=instances, agents=agents,
                   tasks_running=sum(len(n.running) for n in self.nodes.values()),
                   committed_usd=round(self._committed_usd(), 6))
        return "left"

    def _report(self, state: str) -> RunReport:
        now = self.clock.now_s()
        by_type: dict[str, float] = defaultdict(float)
        for node in self.nodes.values():
            if node.type is not None:
                by_type[node.type.name] += node.cost_usd(now)
        makespan = self.last_done_s
        private_usd = sum(p.cost_per_hour for p in self.inv.private) * makespan / 3600.0
        cloud = sum(by_type.values())
        planned = self.first_plan or (None, None)
        return RunReport(
            run_id=self.opt.run_id, state=state, tasks_total=len(self.tasks), tasks_done=len(self.done),
            tasks_failed=len(self.failed), samples=len(self.sample_keys), instances_launched=self.instances_launched,
            makespan_s=makespan, cost_usd=cloud + private_usd, cloud_cost_usd=cloud, private_cost_usd=private_usd,
            planned_makespan_s=planned[0], planned_cost_usd=planned[1], cost_by_type_usd=dict(by_type),
            budget_stopped=self.budget_stopped, time_scale=self.clock.time_scale, stop_reason=self.stop_reason,
        )

    # -- one turn ----------------------------------------------------------------------------
    def _turn(self) -> None:
        messages = self._drain()
        if self.stop_requested and not self.stopping:
            if self.opt.on_stop == "leave" and self.stop_reason == "user_stop":
                self.stopping = self.leaving = True
                self._emit("run.stop", reason=self.stop_reason, on_stop="leave")
                return
            self._stop_now()
            return
        tick = changed = False
        acks: dict[str, list[tuple[str, int]]] = defaultdict(list)
        control = [message for node_id, message in messages if node_id is None]
        if len(control) < len(messages):
            with self.journal.batch():
                for node_id, message in messages:
                    if node_id is not None:
                        changed |= self._on_agent_message(node_id, message, acks)
        for node_id, keys in acks.items():
            client = self.nodes[node_id].client if node_id in self.nodes else None
            if client is not None:
                client.ack(keys)
        if self._to_fetch:  # before any release this turn, so an instance goes with its outputs fetched
            self._fetch_all_outputs()
        for message in control:
            if isinstance(message, Tick):
                tick = True
            elif isinstance(message, BootDone):
                changed |= self._on_boot(message.instance_id)
            elif isinstance(message, Attached):
                changed |= self._on_attached(message)
            elif isinstance(message, ReleaseDue):
                node = self.nodes.get(message.instance_id)
                if node is not None and node.terminated_at_s is None and node.release_version == message.version:
                    self._release(node, node.release_cause or "planned")
                    changed = True
        if tick:
            changed |= self._reconcile_fleet()
        if tick or changed:
            self._decide(tick)
        if tick:
            self._watch_for_stall()

    def _drain(self) -> list[tuple[str | None, Any]]:
        try:
            messages = [self.inbox.get(timeout=self.opt.poll_s)]
        except queue.Empty:
            return []
        while len(messages) < 1000:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        return messages

    def _stop_now(self) -> None:
        """The user asked to stop: no more dispatch; the controller releases everything."""
        self.stopping = True
        self._emit("run.stop", reason=self.stop_reason or "user_stop")
        decision = self.controller.decide(self._snapshot(stopping=True), self.memory, self.clock.now_s(), self.rng)
        self._apply(decision)

    def _watch_for_stall(self) -> None:
        """Like the simulator: with nothing running and no node left to run on, give up."""
        now = self.clock.now_s()
        running = any(n.running for n in self.nodes.values())
        alive = any(n.alive and (n.type is None or n.release_at_s is None or n.release_at_s > now)
                    for n in self.nodes.values())
        self.idle_ticks = 0 if (running or alive) else self.idle_ticks + 1
        if may_give_up(self.idle_ticks, budget_stopped=self.budget_stopped or self.memory.budget_stopped,
                       types_avoided=self.cooldown.avoided(now), tick_s=self.config.tick_s,
                       replan_every_s=self.config.replan_every_s):
            self.stop_reason = "budget_stop" if self.budget_stopped else "no_capacity"
            self.stopping = True

    # -- the controller ----------------------------------------------------------------------
    def _snapshot(self, stopping: bool = False) -> Snapshot:
        now = self.clock.now_s()
        views = tuple(n.view(now, self.estimates.get) for n in self.nodes.values()
                      if n.terminated_at_s is None)
        committed = sum(n.cost_usd(now) for n in self.nodes.values() if n.type is not None)
        types = self.cooldown.restrict(
            self.types, [n.type.name for n in self.nodes.values() if n.type is not None and n.terminated_at_s is None],
            now)
        return Snapshot(
            now_s=now, types=types, nodes=views, pending=self.pool, tasks_total=len(self.tasks),
            tasks_done=len(self.done), observations=self.obs, committed_usd=committed, started_at_s=0.0,
            prior_mean_ref_s=self.prior_mean, prior_sd_ref_s=self.prior_sd,
            budget_usd=float(self.goal.value) if self.goal.kind == "budget" else None,
            tasks_failed=len(self.failed), stopping=stopping,
            timeout_ref_s=self.bag.timeout_s * self.clock.time_scale * max(
                [t.speed for t in self.types.values()] + [p.speed for p in self.inv.private] + [1.0])
            if self.bag.timeout_s else None,
        )

    def _decide(self, tick: bool) -> None:
        snap = self._snapshot()
        decision = self.controller.decide(snap, self.memory, snap.now_s, self.rng, tick=tick)
        self._note_plan(decision)
        self._apply(decision)

    def _note_plan(self, decision: Decision) -> None:
        mem = decision.memory
        if mem.last_plan is None or mem.last_plan is self.memory.last_plan:
            return
        plan = mem.last_plan
        fleet = {k: v for k, v in plan.fleet.items() if v}
        causes = [a.cause for a in decision.actions if isinstance(a, (Launch, ScheduleRelease, StopForBudget))]
        cause = causes[0] if causes else "replan"
        rem = decision.remaining  # the work the plan covers: its point and upper values (for metrics' interval)
        work = {} if rem is None else {"work_ref_s": round(rem.point_ref_s, 3),
                                       "work_upper_ref_s": round(rem.upper_ref_s, 3), "mean_ref_s": round(rem.mean_ref_s, 3),
                                       "sd_ref_s": round(rem.sd_ref_s, 3), "work_tasks": rem.pending + rem.running}
        promise = mem.promise  # the current promise (broker.core.plan.promise.Promise) and why it is what it is
        said = {} if promise is None else {"promise": promise.to_json(), "promise_text": promise.text(),
                                           "promise_why": promise.why}
        self._emit("plan.solved", makespan_s=_round(mem.planned_makespan_s, 3), cost_usd=_round(mem.planned_cost_usd, 6),
                   fleet=fleet, cause=cause, note=mem.last_note, **work, **said)
        self.journal.record_plan(makespan_s=mem.planned_makespan_s, cost_usd=mem.planned_cost_usd, fleet=fleet,
                                 chosen=plan.row() | said, reason=mem.last_note or cause,
                                 confidence=None if promise is None else promise.confidence, at_s=self.clock.epoch_s())
        if self.first_plan is None:
            self.first_plan = (mem.planned_makespan_s, mem.planned_cost_usd)
            if self.on_first_plan is not None:
                self.on_first_plan(self._spend_request(decision))

    def _spend_request(self, decision: Decision) -> SpendRequest:
        launches = tuple((a.type_name, a.count) for a in decision.actions if isinstance(a, Launch))
        usd = 0.0
        for a in decision.actions:
            if isinstance(a, Launch):
                t = self.types[a.type_name]
                life = a.release_after_s if math.isfinite(a.release_after_s) else t.billing.unit_s
                usd += a.count * t.billing.cost_usd(max(life, t.boot_s), t.price_per_hour)
        return SpendRequest(launches, usd, decision.memory, decision.remaining)

    def _apply(self, decision: Decision) -> None:
        self.memory = decision.memory
        starts: list[Assign | Replicate] = []
        for a in decision.actions:
            if isinstance(a, (Assign, Replicate)):
                if not self.stopping:
                    starts.append(a)
            elif isinstance(a, Launch):
                if self.stopping:
                    continue
                if not self.confirmed:
                    self.confirmed = bool(self.confirm(self._spend_request(decision)))
                    if not self.confirmed:
                        self.request_stop("declined")
                        return
                self._launch(a)
            elif isinstance(a, ScheduleRelease):
                self._schedule_release(a)
            elif isinstance(a, CancelRelease):
                self._cancel_release(a.instance_id)
            elif isinstance(a, Cancel):
                self._cancel_copies(a.task_id, a.attempt)
            elif isinstance(a, StopForBudget):
                self.budget_stopped = True
                self._emit("budget.stop", tasks_left=a.tasks_left, cause=a.cause,
                           committed_usd=round(self._committed_usd(), 6))
        if starts:
            self._start_attempts(starts)

    # -- launches and releases -----------------------------------------------------------------
    def _launch(self, a: Launch) -> None:
        t = self.types[a.type_name]
        self.launch_seq += 1
        token = f"{self.opt.run_id}-{self.launch_seq}"
        intent = self.journal.intend("launch", {"type": t.name, "count": a.count, "client_token": token}, a.cause,
                                     at_s=self.clock.epoch_s())
        outcome = self.fleet.launch(t.name, a.count, client_token=token)
        now = self.clock.now_s()
        for k, record in enumerate(outcome.instances, 1):
            launched = self.clock.to_run_s(record.launched_at_s) if self.clock.time_scale == 1.0 else now
            launched = min(launched, now)
            node = _Node(record.id, t.slots, t.speed, type=t, launched_at_s=launched,
                         expected_ready_s=launched + t.boot_s)
            self.nodes[node.id] = node
            self.instances_launched += 1
            self.journal.record_launch(record.id, t.name, launched_at_s=self.clock.to_epoch_s(launched),
                                       price_per_hour=t.price_per_hour, billing=t.billing,
                                       client_token=f"{token}-{k}", action_seq=intent)
            self._emit("instance.launch", instance_id=record.id, type=t.name, cause=a.cause,
                       launched_at_s=round(launched, 3), boot_s=t.boot_s)
            self._at(node.expected_ready_s, BootDone(node.id), f"boot-{node.id}")
            if math.isfinite(a.release_after_s):
                self._set_release(node, launched + max(a.release_after_s, t.boot_s), "planned_life")
        if outcome.failure is None:
            self.journal.complete(intent, {"instances": list(outcome.instance_ids)}, at_s=self.clock.epoch_s())
        else:
            failure = outcome.failure
            self.journal.fail(intent, failure.render(), at_s=self.clock.epoch_s())
            self._emit("instance.launch_failed", type=t.name, requested=a.count, launched=len(outcome.instances),
                       kind=failure.kind.value, code=failure.code, error=failure.message, cause=a.cause)
            if failure.kind in (LaunchErrorKind.CAPACITY, LaunchErrorKind.LIMIT, LaunchErrorKind.PARTIAL):
                # No new instance: the controller re-plans, around this type for a while.
                self.cooldown.refused(t.name, now)
                self._emit("instance.type_avoided", type=t.name, kind=failure.kind.value,
                           until_s=round(now + self.cooldown.cooldown_s, 3))

    def _schedule_release(self, a: ScheduleRelease) -> None:
        node = self.nodes.get(a.instance_id)
        if node is None or node.type is None or node.terminated_at_s is not None:
            return
        now = self.clock.now_s()
        self._set_release(node, max(a.at_s, now), a.cause)
        if node.release_at_s <= now + 1e-6:
            self._release(node, a.cause)

    def _set_release(self, node: _Node, at_s: float, cause: str) -> None:
        node.release_at_s = at_s
        node.release_cause = cause
        node.release_version += 1
        self.journal.set_release(node.id, self.clock.to_epoch_s(at_s))
        paid_until = node.type.billing.paid_until(node.launched_at_s, max(at_s, node.launched_at_s))
        self._emit("instance.release_scheduled", instance_id=node.id, at_s=round(at_s, 3),
                   paid_until_s=round(paid_until, 3), cause=cause)
        if at_s > self.clock.now_s() + 1e-6:
            self._at(at_s, ReleaseDue(node.id, node.release_version), f"release-{node.id}")

    def _cancel_release(self, instance_id: str) -> None:
        node = self.nodes.get(instance_id)
        if node is None or node.terminated_at_s is not None:
            return
        node.release_at_s = None
        node.release_version += 1
        self.journal.set_release(node.id, None)
        self._unschedule(f"release-{node.id}")

    def _unschedule(self, job_id: str) -> None:
        from apscheduler.jobstores.base import JobLookupError

        try:
            self.scheduler.remove_job(job_id)
        except JobLookupError:
            pass

    def _release(self, node: _Node, cause: str) -> None:
        """Terminate an instance now: its attempts are cancelled and re-queued first."""
        now = self.clock.now_s()
        self._cancel_running(node)
        self.instance_agents.stop(node.id, node.client)  # also abandons an attach under way
        node.client = None
        self._unschedule(f"boot-{node.id}")
        self._unschedule(f"release-{node.id}")
        intent = self.journal.intend("terminate", {"instance_id": node.id}, cause, at_s=self.clock.epoch_s())
        outcome = self.fleet.terminate([node.id])
        if node.id in outcome.terminated or node.id in outcome.already_terminated:
            self.journal.complete(intent, {"terminated": [node.id]}, at_s=self.clock.epoch_s())
        else:
            error = outcome.failure.render() if outcome.failure else "refused: the instance does not carry this run's tag"
            self.journal.fail(intent, error, at_s=self.clock.epoch_s())
            self._emit("instance.terminate_failed", instance_id=node.id, error=error)
        node.terminated_at_s = now
        self.journal.record_instance_state(node.id, "terminated", at_s=self.clock.to_epoch_s(now))
        self._emit("instance.terminated", instance_id=node.id, type=node.type.name, cause=cause,
                   launched_at_s=round(node.launched_at_s, 3), at_s=round(now, 3),
                   paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, now), 3),
                   cost_usd=round(node.cost_usd(now), 6), committed_usd=round(self._committed_usd(), 6))

    def _committed_usd(self) -> float:
        now = self.clock.now_s()
        return sum(n.cost_usd(now) for n in self.nodes.values())

    # -- nodes becoming ready ------------------------------------------------------------------
    def _on_boot(self, instance_id: str) -> bool:
        node = self.nodes.get(instance_id)
        if node is None or node.terminated_at_s is not None or node.client is not None:
            return False
        self.journal.record_instance_state(node.id, "running", at_s=self.clock.epoch_s())
        in_background = getattr(self.instance_agents, "attach_in_background", None)
        if in_background is not None:  # reaching a live instance may take minutes: not in the loop
            in_background(node.id, node.slots, lambda client, error: self._post(Attached(node.id, client, error)))
            return False
        try:
            client = self.instance_agents.attach(node.id, node.slots)
        except Exception as exc:  # noqa: BLE001 - an unreachable instance is released, not fatal
            return self._on_attached(Attached(node.id, None, exc))
        return self._on_attached(Attached(node.id, client, None))

    def _on_attached(self, m: Attached) -> bool:
        node = self.nodes.get(m.instance_id)
        if node is None or not node.alive:  # released while its agent was being reached
            if m.client is not None:
                self.instance_agents.stop(m.instance_id, m.client)
            return False
        if m.error is not None:
            self._emit("node.lost", node=node.id, reason=f"could not start its agent: {m.error}")
            node.lost = True
            self._release(node, "node_lost")
            return True
        node.client = m.client
        self._node_attached(node)
        return True

    def _node_attached(self, node: _Node) -> None:
        """The agent answered: run the bag's setup first if there is one, else take work."""
        if self.bag.setup:
            node.client.submit([Run(SETUP_TASK, 1, self.bag.setup, timeout_s=self.bag.timeout_s,
                                    env=dict(self.bag.env), cwd=self.bag.workdir)])
            return
        self._mark_ready(node)

    def _mark_ready(self, node: _Node) -> None:
        now = self.clock.now_s()
        node.ready_at_s = now
        if node.type is not None:
            self._emit("instance.ready", instance_id=node.id, type=node.type.name, at_s=round(now, 3),
                       boot_s=round(now - node.launched_at_s, 3), slots=node.slots)
        else:
            self._emit("node.ready", node=node.id, at_s=round(now, 3), slots=node.slots)

    # -- attempts ------------------------------------------------------------------------------
    def _start_attempts(self, starts: list[Assign | Replicate]) -> None:
        now = self.clock.now_s()
        runs: dict[str, list[Run]] = defaultdict(list)
        with self.journal.batch():
            for a in starts:
                node = self.nodes.get(a.slot.node)
                if node is None or not node.alive or node.client is None or a.slot.index in node.running:
                    self.log.warning("dispatch.refused", task=a.task_id, node=a.slot.node, slot=a.slot.index,
                                     reason="the slot is busy or its node is gone")
                    continue
                if isinstance(a, Assign):
                    self.pool.remove(a.task_id)
                attempt = self.attempts[a.task_id] + 1
                self.attempts[a.task_id] = attempt
                node.running[a.slot.index] = (a.task_id, attempt, now)
                self.copies[a.task_id].add((node.id, a.slot.index, attempt))
                if a.cause == "sampling" and a.task_id not in self.sampled:
                    self.sampled.add(a.task_id)
                    self.sample_keys.add((a.task_id, attempt))
                    self.journal.record_sample_draws([a.task_id])
                self.journal.task_started(a.task_id, attempt, node.id, at_s=self.clock.to_epoch_s(now))
                task = self.tasks[a.task_id]
                runs[node.id].append(Run(task.id, attempt, task.command, timeout_s=self.bag.timeout_s,
                                         env=dict(self.bag.env), cwd=self.bag.workdir))
                self.log.info("task.start", task=task.id, attempt=attempt, node=node.id, slot=a.slot.index,
                              cause=a.cause)
        for node_id, batch in runs.items():  # only once the starts are durable
            self.nodes[node_id].client.submit(batch)

    def _free(self, node: _Node, task: str, attempt: int) -> float | None:
        """Take the attempt off its slot; its start time, or None if it was not running there."""
        for slot, (t, a, start) in list(node.running.items()):
            if t == task and a == attempt:
                del node.running[slot]
                self.copies[task].discard((node.id, slot, attempt))
                if not self.copies[task]:
                    del self.copies[task]
                return start
        return None

    def _requeue(self, task: str, retry: bool = False) -> None:
        if task in self.done or task in self.failed or task in self.pool or self.copies.get(task):
            return
        self.pool.add(task, self.estimates[task], last=retry)

    def _cancel_running(self, node: _Node) -> None:
        """Cancel (not fail) every attempt on the node; their tasks go back to the pool."""
        if not node.running:
            return
        keys = [(t, a) for t, a, _ in node.running.values()]
        with self.journal.batch():
            for task, attempt in keys:
                self._free(node, task, attempt)
                self.journal.attempt_cancelled(task, attempt, at_s=self.clock.epoch_s())
                self._requeue(task)
        if node.client is not None:
            node.client.cancel(keys)

    def _cancel_copies(self, task: str, attempt: int) -> None:
        for node_id, slot, att in list(self.copies.get(task, ())):
            if att == attempt:
                node = self.nodes[node_id]
                self._free(node, task, att)
                self.journal.attempt_cancelled(task, att, at_s=self.clock.epoch_s())
                if node.client is not None:
                    node.client.cancel([(task, att)])
        self._requeue(task)

    # -- agent messages ------------------------------------------------------------------------
    def _on_agent_message(self, node_id: str, message: Any, acks: dict[str, list[tuple[str, int]]]) -> bool:
        node = self.nodes.get(node_id)
        if node is None:
            return False
        if isinstance(message, Result):
            acks[node_id].append((message.task, message.attempt))
            if message.task == SETUP_TASK:
                return self._on_setup(node, message)
            return self._on_result(node, message)
        if isinstance(message, NodeLost):
            return self._on_node_lost(node, message.reason)
        if isinstance(message, TaskLost):
            if self._free(node, message.task, message.attempt) is None:
                return False
            if (message.task, message.attempt) in self.resumed_keys:
                # Journaled as started by the daemon that died, but its Run never reached
                # the agent: not a failure of the task, so it simply goes back to the pool.
                self.journal.attempt_cancelled(message.task, message.attempt, at_s=self.clock.epoch_s())
                self._requeue(message.task)
                self.log.info("task.requeued", task=message.task, attempt=message.attempt, node=node.id,
                              reason=message.reason)
                return True
            self.journal.task_failed(message.task, message.attempt, mask_secrets(message.reason), node=node.id,
                                     at_s=self.clock.epoch_s())
            self._after_failure(message.task, message.attempt, node.id, message.reason, signature=None)
            return True
        return False  # Started and Progress change nothing the controller reads

    def _on_setup(self, node: _Node, result: Result) -> bool:
        if result.ok:
            self._mark_ready(node)
            return True
        why = failure_reason(result, node.id)
        self._emit("node.setup_failed", node=node.id, reason=why, stderr_tail=result.stderr_tail[-500:])
        node.lost = True
        if node.type is not None:  # released by the loop, after this batch of results commits
            node.release_version += 1
            node.release_cause = "setup_failed"
            self._post(ReleaseDue(node.id, node.release_version))
        return True

    def _on_result(self, node: _Node, r: Result) -> bool:
        start = self._free(node, r.task, r.attempt)
        if start is None or r.cancelled:
            return False  # a cancelled copy, or an attempt already written off
        now = self.clock.now_s()
        outcome = AttemptResult(exit_code=r.exit_code, runtime_s=r.runtime_s, timed_out=r.timed_out,
                                stdout_tail=mask_secrets(r.stdout_tail), stderr_tail=mask_secrets(r.stderr_tail),
                                error=mask_secrets(r.error))
        self.journal.task_finished(r.task, r.attempt, outcome, node=node.id, at_s=self.clock.to_epoch_s(now))
        if not outcome.ok:
            why = failure_reason(r, node.id)
            self._after_failure(r.task, r.attempt, node.id, why, outcome.stderr_tail, signature=_signature(r))
            return True
        if r.task in self.done:
            return True  # a replica that lost the race
        self.book.succeeded(node.id)
        self.done.add(r.task)
        self.last_done_s = now
        if self.bag.outputs is not None and self.fetch_outputs is not None:
            self._to_fetch.append((node.id, r.task))
        runtime_ref_s = r.runtime_s * self.clock.time_scale * node.speed
        self.obs = self.obs.add(runtime_ref_s, self.estimates[r.task])
        self._emit("task.done", task=r.task, attempt=r.attempt, node=node.id, runtime_s=round(r.runtime_s, 4),
                   exit_code=r.exit_code, runtime_ref_s=round(runtime_ref_s, 3))
        if (r.task, r.attempt) in self.sample_keys:
            self._emit("sample.done", task=r.task, runtime_ref_s=round(runtime_ref_s, 3),
                       samples=self.obs.count, mean_ref_s=round(self.obs.mean_ref_s, 3))
        for other_node, _slot, other_attempt in list(self.copies.get(r.task, ())):
            other = self.nodes[other_node]
            self._free(other, r.task, other_attempt)
            self.journal.attempt_cancelled(r.task, other_attempt, at_s=self.clock.epoch_s())
            if other.client is not None:
                other.client.cancel([(r.task, other_attempt)])
        if self.on_progress is not None:
            self.on_progress(len(self.done), len(self.failed), len(self.tasks), self._committed_usd())
        return True

    def _after_failure(self, task: str, attempt: int, node: str, why: str, stderr_tail: str = "",
                       signature: str | None = None) -> None:
        """An attempt ended without a result (the journal has counted it): retry or quarantine,
        as the core's failure rules say. ``signature`` is the error as compared across nodes
        (None for a lost attempt, which says nothing about the task)."""
        if task in self.done or task in self.failed:
            self._emit("task.failed", task=task, attempt=attempt, node=node, error=why,
                       stderr_tail=stderr_tail[-500:], final=False, retries_left=0)
            return
        others = sum(1 for n in self.nodes.values() if n.id != node and n.alive)
        verdict = self.book.failed(task, node, signature, others)
        self._emit("task.failed", task=task, attempt=attempt, node=node, error=why, stderr_tail=stderr_tail[-500:],
                   final=verdict.quarantined, retries_left=verdict.retries_left)
        if verdict.quarantined:
            self._quarantine(task, node, verdict.reason, verdict.failures, stderr_tail)
        else:
            self._requeue(task, retry=True)
        if verdict.bad_node:
            self._quarantine_node(node, why)

    def _quarantine(self, task: str, node: str, reason: str, failures: int, stderr_tail: str) -> None:
        """Give up on a task: no more attempts; copies still running are cancelled."""
        self.failed.add(task)
        if task in self.pool:
            self.pool.remove(task)
        for other_node, _slot, other_attempt in list(self.copies.get(task, ())):
            other = self.nodes[other_node]
            self._free(other, task, other_attempt)
            self.journal.attempt_cancelled(task, other_attempt, at_s=self.clock.epoch_s())
            if other.client is not None:
                other.client.cancel([(task, other_attempt)])
        tail = stderr_tail[-500:]
        self.journal.quarantine(task, f"{reason}; last stderr: {tail}" if tail else reason)
        self._emit("task.quarantined", task=task, reason=reason, failures=failures, node=node, stderr_tail=tail)

    def _quarantine_node(self, node_id: str, why: str) -> None:
        """Several tasks in a row failed on this node while others ran: give it no more work."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return
        node.lost = True
        self._emit("node.quarantined", node=node.id, reason=f"tasks keep failing there ({why})")
        if node.type is not None:  # released by the loop, after this batch of results commits
            node.release_version += 1
            node.release_cause = "bad_node"
            self._post(ReleaseDue(node.id, node.release_version))

    def _reattach(self, node: _Node, reason: str) -> bool:
        """The connection to the node's agent broke: open a new one and re-handshake. The
        agent replays results finished meanwhile; attempts it does not know come back as
        TaskLost (or as failed Results, if the agent was restarted), and are re-queued."""
        if self.reattach_agent is None or node.client is None or self.reattaches[node.id] >= MAX_REATTACHES:
            return False
        self.reattaches[node.id] += 1
        try:
            self.reattach_agent(node.id, node.slots, node.client)
        except Exception as exc:  # noqa: BLE001 - the node is then lost, which is reported
            self._emit("agent.reattach_failed", node=node.id, reason=reason, error=str(exc))
            return False
        self._emit("agent.reattached", node=node.id, reason=reason, running=len(node.running),
                   attempt=self.reattaches[node.id])
        return True

    def _on_node_lost(self, node: _Node, reason: str, reattach: bool = True) -> bool:
        """``reattach``: try to reach the node's agent again first (not for an instance EC2
        says is gone)."""
        if not node.alive:
            return False
        if reattach and self._reattach(node, reason):
            return True
        node.lost = True
        self._emit("node.lost", node=node.id, reason=reason)
        self.journal.requeue_running(node.id, at_s=self.clock.epoch_s())  # each a failure, as below
        for slot, (task, attempt, _start) in list(node.running.items()):
            self._free(node, task, attempt)
            self._after_failure(task, attempt, node.id, f"node {node.id} lost: {reason}", signature=None)
        if node.type is not None:  # released by the loop, after this batch of results commits
            node.release_version += 1
            node.release_cause = "node_lost"
            self._post(ReleaseDue(node.id, node.release_version))
        return True

    def _fetch_all_outputs(self) -> None:
        """Fetch each finished task's ``outputs`` into ``run_dir/outputs/<task>/``; a failure is
        reported (``task.outputs_failed``), the task stays done."""
        from urllib.parse import quote

        from broker.config.bag import output_path

        fetches, self._to_fetch = self._to_fetch, []
        for node_id, task_id in fetches:
            path = output_path(self.bag, self.tasks[task_id])
            dest = Path(self.opt.run_dir) / "outputs" / quote(task_id, safe="")
            try:
                files = self.fetch_outputs(node_id, self.bag.workdir, path, dest, dict(self.bag.env))
            except Exception as exc:  # noqa: BLE001 - a missing output is reported, never fatal
                self._emit("task.outputs_failed", task=task_id, node=node_id, path=path, error=str(exc))
                continue
            self._emit("task.outputs", task=task_id, node=node_id, path=path, dest=str(dest), files=len(files),
                       bytes=sum(f.stat().st_size for f in files))

    # -- the fleet against EC2, every tick ---------------------------------------------------
    def _reconcile_fleet(self) -> bool:
        """One DescribeInstances by the run's tag: an instance terminated from outside (or
        gone for any reason) is a lost node, its tasks re-queued now. An instance EC2 does
        not list yet is given one tick (describe is eventually consistent after a launch).
        A failed describe changes nothing (the fleet logs it). True when something changed."""
        alive = [n for n in self.nodes.values() if n.type is not None and n.alive]
        if not alive:
            return False
        described = self.fleet.describe()
        if described.failure is not None:
            return False
        by_id = {r.id: r for r in described.instances}
        now = self.clock.now_s()
        changed = False
        for node in alive:
            record = by_id.get(node.id)
            if record is not None and not record.state.gone:
                continue
            if record is None and now - (node.launched_at_s or now) < self.config.tick_s:
                continue
            state = "not listed by EC2" if record is None else record.state.value
            changed |= self._on_node_lost(node, f"instance {state}: terminated outside the broker", reattach=False)
        return changed

    # -- resume --------------------------------------------------------------------------------
    def _restore(self) -> None:
        """Rebuild a run from its journal after the daemon died (or left): tasks, spend,
        observations, instances reconciled with EC2 by the run's tag, agents re-attached,
        release timers re-created. See README "Resuming a run"."""
        from broker.shells.aws.fleet import TOKEN_TAG

        j = self.journal
        now = self.clock.now_s()
        run_s = self.clock.to_run_s
        records = {r.id: r for r in j.instances()}
        speed = {p.name: p.speed for p in self.inv.private}
        speed.update({r.id: self.types[r.type_name].speed for r in records.values() if r.type_name in self.types})

        # Tasks: what is done stays done, what failed stays failed; counters carried over.
        done_attempt: dict[str, int | None] = {}
        for row in j.task_rows():
            self.attempts[row.id] = row.attempts
            if row.failures:
                self.failures[row.id] = row.failures
            if row.sample_order is not None:
                self.sampled.add(row.id)
            if row.state == "done":
                self.done.add(row.id)
                done_attempt[row.id] = row.done_attempt
            elif row.state in ("failed", "quarantined", "cancelled"):
                self.failed.add(row.id)
        first_attempt: dict[str, int] = {}
        for a in j.attempt_rows():
            first_attempt[a.task_id] = min(first_attempt.get(a.task_id, a.attempt), a.attempt)
            if done_attempt.get(a.task_id) == a.attempt and a.outcome == "ok" and a.runtime_s is not None:
                self.obs = self.obs.add(a.runtime_s * self.clock.time_scale * speed.get(a.node, 1.0),
                                        self.estimates.get(a.task_id))
                if a.ended_at_s is not None:
                    self.last_done_s = max(self.last_done_s, run_s(a.ended_at_s))
        self.sample_keys = {(t, first_attempt[t]) for t in self.sampled if t in first_attempt}
        plan = j.first_plan()
        if plan is not None:
            self.first_plan = (plan.makespan_s, plan.cost_usd)

        # Launches so far: the next client token continues their numbering.
        launches = j.actions("launch")
        self.confirmed = self.confirmed or bool(launches)
        prefix = f"{self.opt.run_id}-"
        for act in launches:
            token = str(act.payload.get("client_token", ""))
            if token.startswith(prefix) and token[len(prefix):].isdigit():
                self.launch_seq = max(self.launch_seq, int(token[len(prefix):]))
        by_token = {act.payload.get("client_token"): act for act in launches}

        # Instances: the journal against EC2 under the run's tag.
        reconciled = self.fleet.reconcile(list(records))
        if reconciled.failure is not None:
            self._emit("resume.reconcile_failed", error=reconciled.failure.render())
        adopted = terminated = 0
        for inst in reconciled.adopted:
            if inst.state.gone:
                continue
            token = inst.tags.get(TOKEN_TAG)
            act = by_token.get(token)
            t = self.types.get(inst.type_name)
            if act is None or t is None:
                outcome = self.fleet.terminate([inst.id])
                self._emit("instance.stray_terminated", instance_id=inst.id, type=inst.type_name,
                           reason="tagged with this run but launched by no intent in its journal",
                           terminated=bool(outcome.terminated or outcome.already_terminated))
                continue
            # Launched between RunInstances and its journal row: adopt it under its intent.
            launched = run_s(act.created_at_s) if self.clock.time_scale != 1.0 else run_s(inst.launched_at_s)
            launched = min(launched, now)
            j.record_launch(inst.id, t.name, launched_at_s=self.clock.to_epoch_s(launched),
                            price_per_hour=t.price_per_hour, billing=t.billing,
                            client_token=f"{token}-adopted-{inst.id}", action_seq=act.seq)
            adopted += 1
            self._emit("instance.launch", instance_id=inst.id, type=t.name, cause="adopted_on_resume",
                       launched_at_s=round(launched, 3), boot_s=t.boot_s)
        for instance_id in reconciled.missing:
            r = records[instance_id]
            if r.state == "terminated":
                continue
            j.record_instance_state(instance_id, "terminated", at_s=self.clock.epoch_s())
            self.instance_agents.stop(instance_id, None)
            terminated += 1
            self._emit("instance.terminated", instance_id=instance_id, type=r.type_name, cause="gone_on_resume",
                       launched_at_s=round(run_s(r.launched_at_s), 3), at_s=round(now, 3),
                       paid_until_s=round(run_s(r.billing.paid_until(r.launched_at_s, self.clock.epoch_s())), 3),
                       cost_usd=round(r.committed_usd(self.clock.epoch_s()), 6),
                       committed_usd=round(j.committed_usd(self.clock.epoch_s()), 6))
        for instance_id in reconciled.strays:
            self._emit("resume.stray", instance_id=instance_id,
                       reason="in the journal but without this run's tag on EC2: left alone")

        # Actions the dead daemon began and never closed.
        records = {r.id: r for r in j.instances()}
        self.instances_launched = len(records)
        redo_terminate: set[str] = set()
        for intent in j.pending_intents():
            if intent.kind == "launch":
                token = str(intent.payload.get("client_token"))
                found = [r.id for r in records.values() if r.client_token
                         and (r.client_token.rsplit("-", 1)[0] == token
                              or r.client_token.startswith(f"{token}-adopted-"))]
                if found:
                    j.complete(intent.seq, {"instances": found, "resumed": True}, at_s=self.clock.epoch_s())
                else:
                    j.fail(intent.seq, "the daemon stopped before EC2 answered; no instance carries its client "
                           "token", at_s=self.clock.epoch_s())
            else:
                if intent.kind == "terminate":
                    redo_terminate.add(str(intent.payload.get("instance_id")))
                j.fail(intent.seq, "interrupted: the daemon stopped; redone on resume", at_s=self.clock.epoch_s())

        # Nodes and their agents.
        running_by_node: dict[str, list] = defaultdict(list)
        for a in j.running_attempts():
            running_by_node[a.node].append(a)
        ready = {e.get("node") or e.get("instance_id")
                 for name in ("node.ready", "instance.ready") for _, _, e in j.events(name)}
        reattached = 0
        for p in self.inv.private:
            node = _Node(p.name, p.slots, p.speed, private=p)
            self.nodes[p.name] = node
            j.record_private_node(p.name, slots=p.slots, speed=p.speed, cost_per_hour=p.cost_per_hour,
                                  at_s=self.clock.to_epoch_s(now))
            reattached += self._reattach_on_resume(node, running_by_node.pop(p.name, []), p.name in ready,
                                         lambda expect, p=p: self.private_agents(p, expect))
        releases: list[tuple[_Node, float | None]] = []
        for r in records.values():
            t = self.types[r.type_name]
            launched = run_s(r.launched_at_s)
            node = _Node(r.id, t.slots, t.speed, type=t, launched_at_s=launched, expected_ready_s=launched + t.boot_s)
            self.nodes[r.id] = node
            if r.state == "terminated":
                node.terminated_at_s = run_s(r.terminated_at_s)
                continue
            if r.ready_at_s is not None or now >= node.expected_ready_s:
                if r.ready_at_s is None:
                    j.record_instance_state(r.id, "running", at_s=self.clock.epoch_s())
                reattached += self._reattach_on_resume(node, running_by_node.pop(r.id, []), r.id in ready,
                                             lambda expect, r=r, t=t: self.instance_agents.attach(r.id, t.slots, expect))
            else:
                self._at(node.expected_ready_s, BootDone(node.id), f"boot-{node.id}")
            releases.append((node, None if r.release_at_s is None else run_s(r.release_at_s)))
        # Attempts on nodes that are gone: back to the pool (no failure: the daemon died).
        requeued = 0
        with j.batch():
            for attempts in running_by_node.values():
                for a in attempts:
                    j.attempt_cancelled(a.task_id, a.attempt, at_s=self.clock.epoch_s())
                    requeued += 1
        ids = [t.id for t in self.bag.tasks]
        for i in self.rng.permutation(len(ids)):
            tid = ids[i]
            if tid not in self.done and tid not in self.failed and not self.copies.get(tid):
                self.pool.add(tid, self.estimates[tid])

        # Release timers: as journaled, else at the paid-until minus the margin.
        for node, release_at in releases:
            if node.id in redo_terminate:
                self._release(node, "interrupted_release")
                continue
            if release_at is None:
                paid_until = node.type.billing.paid_until(node.launched_at_s, max(now, node.launched_at_s))
                release_at = paid_until - self.config.margin_s
            self._set_release(node, max(release_at, now), "resumed")
            if release_at <= now:
                self._release(node, "resumed_past_release")
        self._emit("run.resume", run_dir=str(self.opt.run_dir), at_s=round(now, 3), tasks=len(ids),
                   done=len(self.done), failed=len(self.failed), pending=len(self.pool),
                   reattached=reattached, requeued=requeued, adopted=adopted, terminated=terminated,
                   committed_usd=round(self._committed_usd(), 6), time_scale=self.clock.time_scale)

    def _reattach_on_resume(self, node: _Node, running: list, was_ready: bool, attach: Callable[[tuple], AgentClient]) -> int:
        """Reach the node's agent again, telling it which attempts the journal says it runs:
        those it runs or replays stay; the others come back as TaskLost (then re-queued).
        Returns how many attempts were re-attached."""
        runs = tuple(Run(a.task_id, a.attempt, self.tasks[a.task_id].command, timeout_s=self.bag.timeout_s,
                         env=dict(self.bag.env), cwd=self.bag.workdir)
                     for a in running if a.task_id in self.tasks)
        try:
            node.client = attach(runs)
        except Exception as exc:  # noqa: BLE001 - an unreachable node is reported, not fatal
            node.lost = True
            self._emit("node.lost", node=node.id, reason=f"could not reach its agent on resume: {exc}")
            if node.type is not None:
                node.release_version += 1
                node.release_cause = "node_lost"
                self._post(ReleaseDue(node.id, node.release_version))
            with self.journal.batch():
                for a in running:
                    self.journal.attempt_cancelled(a.task_id, a.attempt, at_s=self.clock.epoch_s())
            return 0
        now = self.clock.now_s()
        for slot, a in enumerate(r for r in running if r.task_id in self.tasks):
            start = self.clock.to_run_s(a.started_at_s) if a.started_at_s is not None else now
            node.running[slot] = (a.task_id, a.attempt, start)
            self.copies[a.task_id].add((node.id, slot, a.attempt))
            self.resumed_keys.add((a.task_id, a.attempt))
        hello = node.client.hello
        self._emit("agent.reattached", node=node.id, attempts=len(node.running),
                   agent_running=len(hello.running) if hello else 0,
                   pending_results=hello.pending_results if hello else 0)
        if was_ready:
            node.ready_at_s = now
        else:
            self._node_attached(node)
        return len(node.running)

    # -- events ------------------------------------------------------------------------------
    def _emit(self, name: str, **fields: Any) -> None:
        self.log.info(name, **fields)
        self.journal.record_event(name, mask_secrets(fields), at_s=self.clock.epoch_s())


def _signature(r: Result) -> str | None:
    """A failed result's error as compared across nodes: its exit code, a timeout, or the
    agent's error text; None when the attempt was lost with its agent (no fault of the task)."""
    if r.timed_out:
        return "timed out"
    if r.exit_code is not None:
        return f"exit code {r.exit_code}"
    if r.error and "agent stopped while this attempt ran" in r.error:
        return None
    return r.error or None
