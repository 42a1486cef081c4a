"""The live shell's loop: world events in, ledger, ``decide()``, actions out.

It drives the same :class:`~broker.core.control.controller.Controller` and keeps the same
:class:`~broker.core.control.ledger.Ledger` as the simulator (``broker/sim/engine.py``); it
differs only in real I/O: time is a :class:`~broker.shells.clock.RunClock`, instances come
from EC2 (moto in a dry run, :mod:`.actuator`), tasks run on worker agents
(:mod:`.attempts`), and every transition is written to the run's journal.

Threads. One loop thread (the caller of :meth:`Daemon.run`) owns all state. Everything else
only puts messages on the loop's inbox queue: the agent hub, one thread for every agent
(:mod:`broker.shells.agent_hub`), ``(node, Started | Result | NodeLost | TaskLost ...)``, the timers ``(None, Tick | BootDone
| ReleaseDue)``, background attaches ``(None, Attached)`` and the EC2 workers ``(None,
Ec2Answer)`` (:mod:`.actuator`: launches, terminations and describes never run on the loop).
A signal handler only sets a flag the loop reads.

One turn of the loop:

1. drain the inbox (waiting at most ``poll_s`` for the first message);
2. turn agent messages into ledger events, recording the ledger's answers in one journal
   batch, then acknowledge them to the agents (an ack means "durably recorded");
3. handle ticks, finished boots, due releases and EC2's answers (releases the ledger asked
   for during the batch are carried out here, after it committed);
4. ask the controller on the ledger's snapshot: ``tick=True`` on a monitoring tick (it may
   re-plan), ``tick=False`` when something changed (dispatch only); carry out its actions.

Faults are the ledger's rules (retries, quarantine, bad nodes, type cooldowns). A lost agent
connection is re-attached at once (at most ``FailurePolicy.reattaches`` times a run): a
surviving agent replays what finished meanwhile, a restarted one reports the attempts it
lost; only when that fails is the node lost.
"""

from __future__ import annotations

import queue
import statistics
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import structlog

from broker.core.control.actions import Assign, Cancel, Launch, Replicate, ScheduleRelease, StopForBudget
from broker.core.control.controller import Controller, ControllerConfig, Decision
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import Ledger, launch_cost_usd
from broker.core.control.snapshot import Memory
from broker.core.goal import Goal
from broker.core.model import Bag, Inventory
from broker.shells.clock import RunClock
from broker.shells.diskfull import DiskFull
from broker.shells.gctune import young_collections_batched
from broker.shells.journal import Journal
from broker.shells.logging import held_events, register_secrets_in, write_event

from .actuator import Ec2Actuator, Ec2Answer, Timers
from .attempts import AttemptsMixin, _round
from .nodes_mixin import NodesMixin
from .report import RunReport, build_report
from .spot import SpotMixin
from .sweep import SweepMixin
from .trace import RecordingLedger, Trace, action_json
from .types import (
    Attached,
    AttachRetrying,
    BootDone,
    DaemonOptions,
    Fleet,
    Nodes,
    PriorSamples,
    Reconnected,
    ReleaseDue,
    SpendRequest,
    Tick,
)

# A turn takes at most this many messages from the inbox: it bounds a turn's decision, about
# 4 us a task it hands out (bench/bench_scale.py, 1,000 fake agents answering at once: 1,000
# results a turn made 4.1 ms decisions; 500, about 2 ms). 16 local agents bring about 200 a turn.
TURN_MESSAGES = 400


class Daemon(AttemptsMixin, NodesMixin, SweepMixin, SpotMixin):
    """Runs one bag to the end (or to a stop); see the module docstring.

    ``fleet``: EC2 (:class:`~broker.shells.aws.Ec2Fleet`); ``nodes``: every node's agent
    (:class:`~broker.shells.run.nodes.RunNodes`). ``confirm`` is asked before the first
    launch; ``on_first_plan`` sees the first plan; ``on_progress(done, failed, total,
    committed_usd)`` after every finished task.
    """

    def __init__(self, inventory: Inventory, bag: Bag, goal: Goal, options: DaemonOptions, *, journal: Journal,
                 clock: RunClock, fleet: Fleet, nodes: Nodes, inbox: queue.Queue,
                 config: ControllerConfig | None = None, confirm: Callable[[SpendRequest], bool] | None = None,
                 on_first_plan: Callable[[SpendRequest], None] | None = None,
                 on_progress: Callable[[int, int, int, float], None] | None = None,
                 samples: PriorSamples | None = None, failure_policy: FailurePolicy | None = None,
                 on_notice: Callable[[str], None] | None = None) -> None:
        self.inv, self.bag, self.goal, self.opt = inventory, bag, goal, options
        self.journal, self.clock, self.fleet, self.nodes, self.inbox = journal, clock, fleet, nodes, inbox
        self.config = config or ControllerConfig(tick_s=options.tick_s)
        if self.config.queue_ahead_below_s == 0 and options.queue_ahead_s > 0:  # in the run's seconds
            self.config = replace(self.config, queue_ahead_below_s=options.queue_ahead_s * clock.time_scale)
        self.controller = Controller(goal, self.config, private=inventory.private)
        self.confirm, self.on_first_plan, self.on_progress = confirm, on_first_plan, on_progress
        self.on_notice = on_notice  # a warning line for the console (a node refused, waited for)
        self.resumed_waiting: dict[str, bool] = {}  # node -> was ready: unreachable on resume, tried again
        self.samples = samples
        self.policy = failure_policy or FailurePolicy(retries=bag.retries)
        self.types = {t.name: t for t in inventory.types}
        self.log = structlog.get_logger().bind(run_id=options.run_id)
        register_secrets_in(bag.env)  # a task printing its token must not put it in a log
        self.rng = np.random.default_rng(options.seed)
        self.tasks = {t.id: t for t in bag.tasks}
        self.estimates: dict[str, float | None] = {
            t.id: (statistics.fmean(t.estimates_s.values()) if t.estimates_s else None) for t in bag.tasks}
        self.ec2 = Ec2Actuator(fleet, journal, clock, options.run_id, post=self._post)
        self._boot_held: set[str] = set()  # booted, waiting for a describe to show them running (sweep.py)
        self._boot_checked: set[str] = set()  # ... and those a describe let through
        self.ledger: Ledger | RecordingLedger = None  # type: ignore[assignment] - made in _start
        self.trace = Trace(options.trace) if options.trace is not None else None
        self.clients: dict[str, Any] = {}  # node -> its agent client (None until attached)
        self._to_fetch: list[tuple[str, str]] = []  # (node, task) whose outputs to fetch this turn
        self._finished: list[tuple] = []  # the turn's successful results, journaled together (attempts.py)
        self.memory = Memory()
        self.first_plan: tuple[float | None, float | None] | None = None
        self.last_notes: tuple[str, ...] = ()
        self._broken_said: set[str] = set()  # types the ledger gave up on, already said
        self.budget_stopped = False
        self.confirmed = confirm is None
        self.stop_requested = False  # set by a signal handler: read by the loop only
        self.stop_reason: str | None = None
        self.stopping = False
        self.leaving = False  # stopping with on_stop="leave": nothing is released
        self.timers: Timers | None = None
        self.unterminated: tuple[str, ...] = ()  # EC2 never confirmed their termination (sweep.py)

    # -- public ------------------------------------------------------------------------------
    def request_stop(self, reason: str = "user_stop") -> None:
        """Ask the loop to stop dispatching and release everything (safe from a signal handler)."""
        self.stop_reason = self.stop_reason or reason
        self.stop_requested = True

    def run(self) -> RunReport:
        try:
            with young_collections_batched():  # a third of a 1,000-agent decision was the collector
                return self._run()
        finally:
            if self.trace is not None:
                self.trace.close()

    def _run(self) -> RunReport:
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

    def _new_ledger(self, ledger: Ledger) -> None:
        self.ledger = ledger if self.trace is None else RecordingLedger(ledger, self.trace)

    def _ledger_options(self) -> dict[str, Any]:
        ids = [t.id for t in self.bag.tasks]
        known = [e for e in self.estimates.values() if e is not None]
        mean = statistics.fmean(known) if len(known) == len(ids) and known else None
        sd = statistics.stdev(known) if mean is not None and len(known) > 1 else None
        if self.samples is not None and self.samples.mean_ref_s is not None:
            mean, sd = self.samples.mean_ref_s, self.samples.sd_ref_s
        return dict(policy=self.policy, tick_s=self.config.tick_s, replan_every_s=self.config.replan_every_s,
                    prior_mean_ref_s=mean, prior_sd_ref_s=sd,
                    budget_usd=float(self.goal.value) if self.goal.kind == "budget" else None,
                    timeout_ref_s=self._timeout_ref_s())

    def _timeout_ref_s(self) -> float | None:
        """The bag's timeout in reference seconds at the fastest speed: no task runs longer."""
        if not self.bag.timeout_s:
            return None
        speeds = [t.speed for t in self.types.values()] + [p.speed for p in self.inv.private] + [1.0]
        return self.bag.timeout_s * self.clock.time_scale * max(speeds)

    def _start(self) -> None:
        self.timers = Timers(self.clock, self._post)
        if self.opt.resume:
            from .resume import resume

            resume(self)
        else:
            self._fresh_start()
        self.timers.every(self.config.tick_s, Tick(), "tick")
        self._post(Tick())

    def _fresh_start(self) -> None:
        options = self._ledger_options()
        if self.trace is not None:
            self.trace.write({"header": {"seed": self.opt.seed, "goal": [self.goal.kind, self.goal.value],
                                         "tick_s": self.config.tick_s, "margin_s": self.config.margin_s,
                                         "queue_ahead_below_s": self.config.queue_ahead_below_s,
                                         "ledger": options}})
        self._new_ledger(Ledger(self.types, **options))
        tasks = [(t.id, self.estimates[t.id]) for t in self.bag.tasks]
        order = self.rng.permutation(len(tasks))
        if self.samples is not None:
            self._adopt_samples(self.samples)
        self.ledger.add_tasks(tasks, order)
        self._emit("run.start", run_dir=str(self.opt.run_dir), dry_run=self.opt.dry_run,
                   time_scale=self.clock.time_scale, tasks=len(tasks), goal=self.goal.kind, goal_value=self.goal.value,
                   tick_s=self.config.tick_s, margin_s=self.config.margin_s)
        now = self.clock.now_s()
        for p in self.inv.private:
            self.ledger.add_private(p)
            self.journal.record_private_node(p.name, slots=p.slots, speed=p.speed, cost_per_hour=p.cost_per_hour,
                                             at_s=now)
        self._attach_private_nodes()  # nodes_mixin.py: in parallel, retried in the background

    def _adopt_samples(self, samples: PriorSamples) -> None:
        """Count the tasks ``broker plan --sample`` ran as done, and learn from their runtimes."""
        from broker.shells.journal import AttemptResult

        adopted = [t for t in sorted(samples.done, key=lambda t: t.draw) if t.task in self.tasks]
        with self.journal.batch():
            self.journal.record_sample_draws([t.task for t in adopted])
            for t in adopted:
                self.journal.task_finished(t.task, t.attempt, AttemptResult(exit_code=t.exit_code, runtime_s=t.runtime_s),
                                           node=t.node)
                self.ledger.adopt_done(t.task, t.attempt, t.runtime_ref_s, self.estimates[t.task])
        self._emit("sample.adopted", source=samples.source, tasks_done=len(adopted), rule=samples.rule,
                   mean_ref_s=_round(samples.mean_ref_s, 3), sd_ref_s=_round(samples.sd_ref_s, 3))

    def _post(self, message: Any) -> None:
        """Timers and the loop itself talk to the loop through the inbox only."""
        self.inbox.put((None, message))

    def _over(self) -> bool:
        return self.stopping or self.ledger.finished

    # -- one turn ----------------------------------------------------------------------------
    def _turn(self) -> None:
        messages = self._drain()
        # The turn's log lines are written once it committed and sent its acks and new work
        # (held_events: in order, with the times they were logged at, one write per file).
        with held_events(), self.journal.group():  # one commit per turn; intents fsynced before their call
            self._turn_on(messages)

    def _turn_on(self, messages: list[tuple[str | None, Any]]) -> None:
        if self.stop_requested and not self.stopping:
            if self.opt.on_stop == "leave" and self.stop_reason == "user_stop":
                self.stopping = self.leaving = True
                self._emit("run.stop", reason=self.stop_reason, on_stop="leave")
                return
            self._stop_now()
            return
        tick = changed = False
        acks: dict[str, list[tuple[str, int]]] = defaultdict(list)
        control = [message for node, message in messages if node is None]
        if len(control) < len(messages):
            with self.journal.batch():
                for node, message in messages:
                    if node is not None:
                        changed |= self._on_agent_message(node, message, acks)
                self._journal_finished()
        for node, keys in acks.items():  # an ack means "durably recorded": once the turn committed
            client = self.clients.get(node)
            if client is not None:
                # held, to go with the node's new work of this turn in one write (or the flush below)
                self.journal.after_commit(lambda n=node, c=client, k=keys: self.clients.get(n) is c
                                          and c.ack(k, hold=True))
        if self._to_fetch:  # before any release this turn, so an instance goes with its outputs fetched
            self._fetch_all_outputs()
        for message in control:
            if isinstance(message, Tick):
                tick = True
            else:
                changed |= self._on_control(message)
        if tick:
            changed |= self._reconcile_fleet()
        for name in sorted(self.ledger.broken_types - self._broken_said):  # given up for the run
            self._broken_said.add(name)
            self._emit("instance.type_broken", type=name, instances=self.ledger.never_up.get(name, 0))
        if tick or changed:
            self._decide(tick)
        for node in acks:  # the acknowledgements no new work carried, after the turn's submits
            client = self.clients.get(node)
            if client is not None:
                self.journal.after_commit(lambda n=node, c=client: self.clients.get(n) is c and c.flush())
        if tick and self.ledger.on_tick(self.clock.now_s(), self.memory.budget_stopped,
                                        self.memory.private_stopped):
            self.stop_reason = "budget_stop" if self.budget_stopped else "no_capacity"
            self.stopping = True

    def _drain(self) -> list[tuple[str | None, Any]]:
        try:
            messages = [self.inbox.get(timeout=self.opt.poll_s)]
        except queue.Empty:
            return []
        while len(messages) < TURN_MESSAGES:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        return messages

    def _stop_now(self) -> None:
        """The user asked to stop: no more dispatch; the controller releases everything."""
        self.stopping = True
        self._emit("run.stop", reason=self.stop_reason or "user_stop")
        self._decide(tick=True, stopping=True)

    # -- the controller ----------------------------------------------------------------------
    def _decide(self, tick: bool, stopping: bool = False) -> None:
        now = self.clock.now_s()
        decision = self.controller.decide(self.ledger.snapshot(now, stopping=stopping), self.memory, now, self.rng,
                                          tick=tick)
        if self.trace is not None:
            self.trace.write({"decide": {"now": now, "tick": tick, "stopping": stopping,
                                         "actions": [action_json(a) for a in decision.actions]}})
        self._note_plan(decision)
        self._apply(decision)

    def _note_plan(self, decision: Decision) -> None:
        mem = decision.memory
        if decision.notes and decision.notes != self.last_notes:
            self._emit("decision.notes", notes=list(decision.notes))
        self.last_notes = decision.notes
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
                                 confidence=None if promise is None else promise.confidence)
        if self.first_plan is None:
            self.first_plan = (mem.planned_makespan_s, mem.planned_cost_usd)
            if self.on_first_plan is not None:
                self.on_first_plan(self._spend_request(decision))

    def _spend_request(self, decision: Decision) -> SpendRequest:
        launches = [a for a in decision.actions if isinstance(a, Launch)]
        usd = sum(launch_cost_usd(self.types[a.type_name], a) for a in launches)
        return SpendRequest(tuple((a.type_name, a.count) for a in launches), usd, decision.memory, decision.remaining)

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
                self._release_timer(self.ledger.schedule_release(a.instance_id, a.at_s, a.cause, self.clock.now_s()))
            elif isinstance(a, Cancel):
                self._carry_out(self.ledger.cancel_attempt(a.task_id, a.attempt, a.cause, self.clock.now_s()))
            elif isinstance(a, StopForBudget):
                self.budget_stopped = True
                self.ledger.on_budget_stop()
                self._emit("budget.stop", tasks_left=a.tasks_left, cause=a.cause,
                           committed_usd=round(self._committed_usd(), 6))
        if starts:
            self._start_attempts(starts)

    # -- events ------------------------------------------------------------------------------
    def _emit(self, name: str, **fields: Any) -> None:
        """One event, masked and encoded once: the log's line and the journal's row (write_event)."""
        self.journal.record_event(name, write_event(name, fields, context={"run_id": self.opt.run_id}))

    def _committed_usd(self) -> float:
        return self.ledger.committed_usd(self.clock.now_s())

    def _report(self, state: str) -> RunReport:
        return build_report(self.ledger, run_id=self.opt.run_id, state=state, now_s=self.clock.now_s(),
                            first_plan=self.first_plan, budget_stopped=self.budget_stopped,
                            time_scale=self.clock.time_scale, stop_reason=self.stop_reason,
                            unterminated=self.unterminated)

    # -- the end -----------------------------------------------------------------------------
    def _wind_down(self) -> str:
        """Release every instance, stop every agent, close the run in the journal."""
        self._settle_ec2()  # launches in flight answered: their instances are released below too
        now = self.clock.now_s()
        cause = "user_stop" if self.stop_reason in ("user_stop", "declined") else "bag_done"
        if self.timers is not None:
            self.timers.shutdown()
        if self.leaving:
            self.ec2.shutdown()
            return self._leave()
        self._record_heard()  # nodes_mixin.py: the last word from each agent, for the report
        for node in self.ledger.live_nodes():
            if node.type is not None:
                if node.release_at_s is None or node.release_at_s > now:
                    self._emit("instance.release_scheduled", instance_id=node.id, at_s=round(now, 3),
                               paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, now), 3),
                               cause=cause)
                self._release(node.id, cause)
        self.unterminated = self._final_sweep()
        self.ec2.shutdown()
        for name in list(self.clients):
            node = self.ledger.nodes[name]
            if node.type is None:
                with self.journal.batch():
                    self._carry_out(self.ledger.cancel_running(name, cause, now))
                self.nodes.stop(name, self.clients[name])
                self.clients[name] = None
        state = "finished" if self.ledger.settled >= self.ledger.tasks_total else "stopped"
        self.journal.finish_run(state)
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
        for node, client in self.clients.items():
            if client is not None:
                client.close()  # the connection only: the agent keeps running
                self.clients[node] = None
                agents.append(node)
        instances = [n.id for n in self.ledger.live_nodes() if n.type is not None and "#" not in n.id]
        self._emit("run.left", instances=instances, agents=agents, tasks_running=self.ledger.running_count,
                   committed_usd=round(self._committed_usd(), 6))
        return "left"

    def _release_without_journal(self, exc: DiskFull) -> None:
        """The journal cannot be written (a full disk): still stop every agent and terminate every
        instance, logging what was done (stderr keeps working); ``broker down`` can repeat it."""
        self.log.error("run.disk_full", error=str(exc))
        if self.timers is not None:
            self.timers.shutdown()
        to_terminate = []
        for node_id, client in list(self.clients.items()):
            node = self.ledger.nodes.get(node_id) if self.ledger is not None else None
            try:
                if client is not None or (node is not None and (node.type is None or node.ready_at_s is not None)):
                    self.nodes.stop(node_id, client)
            except Exception as error:  # noqa: BLE001 - keep stopping the others
                self.log.warning("agent.stop_failed", node=node_id, error=str(error))
            self.clients[node_id] = None
        if self.ledger is not None:
            to_terminate = [n.id for n in self.ledger.live_nodes() if n.type is not None and "#" not in n.id]
        to_terminate += self.ec2.launched_unjournaled()  # launches in flight, waited for
        if to_terminate:
            outcome = self.fleet.terminate(to_terminate)
            self.log.error("run.disk_full_released", instance_ids=to_terminate,
                           terminated=list(outcome.terminated) + list(outcome.already_terminated),
                           failed=list(outcome.failed))

    def _on_control(self, message: Any) -> bool:
        if isinstance(message, Ec2Answer):
            return self._on_ec2(message)
        if isinstance(message, BootDone):
            return self._on_boot(message.instance_id)
        if isinstance(message, Attached):
            return self._on_attached(message)
        if isinstance(message, AttachRetrying):
            return self._on_attach_retrying(message)
        if isinstance(message, Reconnected):
            return self._on_reconnected(message)
        if isinstance(message, ReleaseDue) and self.ledger.release_due(message.instance_id, message.version):
            self._release(message.instance_id, self.ledger.nodes[message.instance_id].release_cause or "planned")
            return True
        return False
