"""The event catalogue: every structured log event the broker writes, and its fields.

This is the machine-checkable source of the README's "Event catalogue" table
(``python3 -m broker.shells.events`` prints it; ``tests/test_events_catalogue.py`` checks
that the README holds exactly that table and that a real dry run's ``events.jsonl`` holds
only catalogued events, each with its fields).

Every line also carries ``event``, ``level`` and ``timestamp`` (ISO 8601, UTC). Lines
written during ``broker run`` carry ``run_id`` (bound for the whole run by
:func:`broker.shells.logging.configure_logging`); an event about one instance carries
``instance_id`` (or ``node``, which is an instance id or a private node's name), one about
a task carries ``task``. Times named ``*_at_s`` are run time in seconds from the run's start.

An event may be written by ``broker run`` (``run`` fields), by the tools ``broker plan
--sample`` / ``broker estimate`` / ``broker simulate`` (``tool`` fields), or both with different
fields. ``optional`` fields appear only when they apply.
"""

from __future__ import annotations

from dataclasses import dataclass

# Keys every line has; ``run_id`` is added to these for lines written during a run.
BASE_KEYS = ("event", "level", "timestamp")
RUN_KEYS = BASE_KEYS + ("run_id",)


@dataclass(frozen=True, slots=True)
class EventSpec:
    name: str
    summary: str
    run: tuple[str, ...] | None = None  # fields when written during `broker run`; None: never
    tool: tuple[str, ...] | None = None  # fields when written by `broker plan`/`estimate`/`simulate`; None: never
    optional: tuple[str, ...] = ()

    def allowed(self) -> set[str]:
        return set(self.run or ()) | set(self.tool or ()) | set(self.optional)


def _spec(name: str, summary: str, run: str | None = None, tool: str | None = None, optional: str = "") -> EventSpec:
    def split(text: str | None) -> tuple[str, ...] | None:
        return None if text is None else tuple(text.split())

    return EventSpec(name, summary, split(run), split(tool), tuple(optional.split()))


CATALOGUE: dict[str, EventSpec] = {
    s.name: s
    for s in (
        _spec("run.start", "a run began", "run_dir dry_run time_scale tasks goal goal_value tick_s margin_s"),
        _spec("plan.solved", "a plan was adopted (run) or solved (`broker plan`)",
              run="makespan_s cost_usd fleet cause note",
              tool="policy goal front_points solve_ms",
              optional="work_ref_s work_upper_ref_s mean_ref_s sd_ref_s work_tasks "
                       "makespan_s cost_usd fleet status reason promise promise_text promise_why"),
        _spec("decision.notes", "the controller's notes on a decision (a budget cap, a launch cut short), "
              "when they change", "notes"),
        _spec("instance.launch", "EC2 launched an instance (cause `adopted`: found under the run's tag after its "
              "launch was recorded failed)", "instance_id type cause launched_at_s boot_s",
              optional="client_token reason"),
        _spec("instance.launch_failed", "a launch failed or fell short (or an instance stayed pending past its "
              "type's pending_timeout)", "type requested launched kind code error cause", optional="instance_id"),
        _spec("instance.ready", "an instance's agent answered (and its setup ran)",
              "instance_id type at_s boot_s slots"),
        _spec("instance.release_scheduled", "an instance's release was (re)scheduled",
              "instance_id at_s paid_until_s cause"),
        _spec("instance.terminated", "EC2 confirmed an instance's termination",
              "instance_id type cause launched_at_s at_s paid_until_s cost_usd committed_usd"),
        _spec("instance.terminate_failed", "EC2 did not confirm a termination: the instance stays `terminating` "
              "and is asked again every tick", "instance_id error retry"),
        _spec("run.instances_unconfirmed", "the run ended with instances whose termination EC2 never confirmed "
              "(exit 1; run `broker down`)", "instance_ids reason"),
        _spec("node.ready", "a private node's agent answered", "node at_s slots"),
        _spec("node.lost", "a node stopped answering, or its agent could not start (`refused`: a private node "
              "refused us, e.g. an unknown host key, and was not retried)", "node reason", optional="refused"),
        _spec("node.unreachable", "a private node did not answer at start: it is tried again in the background "
              "for its grace while the run waits for it, and joins when it answers", "node reason grace_s"),
        _spec("node.down", "a node's agent is stopping: its attempts are re-run elsewhere, the node takes "
              "no work until its agent is back", "node reason attempts"),
        _spec("node.away", "a private node stopped answering: its tasks are held and its link reconnected in "
              "the background for its grace; then its agent re-attaches, or the node is lost",
              "node reason running grace_s"),
        _spec("node.setup_failed", "the bag's setup command failed on a node", "node reason stderr_tail"),
        _spec("agent.attached", "an agent completed its handshake", "node slots running pending_results"),
        _spec("agent.lost", "an agent's connection ended", "node reason"),
        _spec("agent.reader_failed", "the thread reading an agent failed (its node is then lost)", "node error"),
        _spec("agent.tasks_lost", "an agent no longer knew attempts it had been given", "node count"),
        _spec("dispatch.refused", "an assignment hit a busy slot or a gone node", "task node slot reason"),
        _spec("task.start", "an attempt was started (or queued at the node's agent: `slot` past its slots, "
              "see Queue-ahead)", "task attempt node slot cause"),
        _spec("task.done", "an attempt succeeded (the task's result)",
              "task attempt node runtime_s exit_code runtime_ref_s"),
        _spec("task.failed", "an attempt failed; `lost`: with its node or agent (no failure of the task, "
              "not held against its retries); `final` when the task is given up",
              "task attempt node error stderr_tail final retries_left lost"),
        _spec("sample.start", "sampling began", tool="rule eps delta tasks r_max_s nodes slots run_dir seed"),
        _spec("sample.progress", "sampling progress (when stderr is not a terminal)",
              tool="completed running mean_ref_s expected_samples failures"),
        _spec("sim.progress", "`broker simulate` progress, each tenth of the bag (when stderr is not a terminal)",
              tool="done total virtual_s committed_usd"),
        _spec("sample.setup", "the setup command ran on a sampling node", tool="node runtime_s"),
        _spec("sample.timeout", "a sample hit the timeout (counted as R_max)", tool="task node runtime_s"),
        _spec("sample.failure", "a sample failed", tool="task node attempt exit_code error"),
        _spec("sample.exhausted", "the rule used up the bag (or `broker estimate`'s runtimes) before it could stop: "
              "every task was measured, so the mean is exact", tool="rule samples"),
        _spec("sample.done", "a sample finished (run) or sampling stopped (tool)",
              run="task runtime_ref_s samples mean_ref_s",
              tool="rule samples mean_ref_s eps delta capped",
              optional="exact completed extra cancelled wall_s"),
        _spec("budget.stop", "the budget cannot pay for another billing unit", "tasks_left cause committed_usd"),
        _spec("run.stop", "the user (or a signal) asked the run to stop", "reason", optional="on_stop"),
        _spec("run.left", "the run stopped with `--on-stop leave`: instances and agents keep running",
              "instances agents tasks_running committed_usd"),
        _spec("run.resume", "`broker run` resumed an unfinished run from its journal",
              "run_dir at_s tasks done failed pending reattached requeued adopted terminated committed_usd "
              "time_scale"),
        _spec("run.bag_changed", "a resume found the bag edited: tasks matched by command, environment and working "
              "directory are kept, new and changed ones run, removed ones are dropped (kept in the journal); "
              "redone: new tasks whose command a kept task has done already",
              "summary kept kept_done new dropped redone new_tasks dropped_tasks"),
        _spec("run.goal_changed", "a resume was given another goal: the run re-plans for it, and its next plan is "
              "the promise", "before after"),
        _spec("run.down", "`broker down` released a run (journal only)", "terminated failed"),
        _spec("run.report", "the final report as one object (debug level)",
              "run_id state tasks samples instances_launched makespan_s cost_usd cloud_cost_usd "
              "private_cost_usd planned deviation_pct cost_by_type_usd budget_stopped time_scale stop_reason "
              "instances_not_terminated nodes spot"),
        _spec("run.disk_full", "the run directory's disk is full: the run stops", "error"),
        _spec("run.disk_full_released", "after a full disk, the run's instances were terminated without the journal",
              "instance_ids terminated failed"),
        _spec("log.disk_full", "events.jsonl could take no more (on stderr)", "message dropped_event"),
        _spec("task.requeued", "an attempt a dead daemon started never reached its agent: back to the pool",
              "task attempt node reason"),
        _spec("task.quarantined", "a task failed too often (or the same way on several nodes): no more attempts",
              "task reason failures node stderr_tail"),
        _spec("task.outputs", "a finished task's declared outputs were fetched into RUN_DIR/outputs/<task>/",
              "task node path dest files bytes"),
        _spec("task.outputs_failed", "a finished task's declared outputs could not be fetched (the task stays done)",
              "task node path error"),
        _spec("node.quarantined", "tasks keep failing on a node while others succeed: it gets no more work",
              "node reason"),
        _spec("agent.reattached", "an agent was reached again (after a dropped link, or by a resumed run)", "node",
              optional="reason running attempt attempts agent_running pending_results"),
        _spec("agent.reattach_failed", "an agent could not be reached again: the node is lost", "node reason error"),
        _spec("agent.stop_failed", "stopping an agent failed (after a full disk)", "node error"),
        _spec("instance.type_avoided", "capacity, limit, partial-launch or timeout errors: the type is avoided "
              "for a while",
              "type kind until_s"),
        _spec("instance.type_broken", "instances of the type kept failing to come up (their agent or the "
              "bag's setup), none ever did: the run rents no more of it", "type instances"),
        _spec("instance.stray_terminated", "an instance with the run's tag that no launch intent names was "
              "terminated (on resume or at a tick)", "instance_id type reason terminated"),
        _spec("resume.stray", "on resume, an instance of the journal lacks the run's tag on EC2: left alone",
              "instance_id reason"),
        _spec("resume.reconcile_failed", "on resume, EC2 could not be asked about the run's instances", "error"),
        _spec("sample.adopted", "`broker run --samples`: the samples of `broker plan --sample` count as done",
              "source tasks_done rule mean_ref_s sd_ref_s"),
        _spec("run.done", "the run ended",
              "state makespan_s cost_usd planned_makespan_s planned_cost_usd tasks_done tasks_failed "
              "instances_launched"),
        _spec("metrics.serving", "`--metrics-port` serves Prometheus metrics", "host port url"),
        _spec("aws.run_instances", "RunInstances returned",
              "type requested idempotency_key attempts launched instance_ids reused"),
        _spec("aws.run_instances_failed", "RunInstances failed",
              "type requested idempotency_key attempts kind code error"),
        _spec("aws.run_instances_partial", "RunInstances launched fewer than asked",
              "type requested idempotency_key attempts launched instance_ids"),
        _spec("aws.terminate_instances", "TerminateInstances returned", "instance_ids attempts"),
        _spec("aws.terminate_refused", "an instance without the run's tag was not terminated",
              "instance_ids reason"),
        _spec("aws.terminate_failed", "TerminateInstances failed", "instance_ids kind code"),
        _spec("aws.describe_failed", "DescribeInstances failed", "kind code"),
        _spec("aws.reconciled", "the journal's instances compared with EC2's", "adopted missing strays"),
        _spec("instance.interruption_notice", "a spot instance's agent read EC2's two-minute notice: no more "
              "work there, the attempts that cannot end in time re-queued",
              "instance_id type action terminate_at_s requeued running"),
        _spec("instance.interrupted", "EC2 took a spot instance back (StateReason Server.SpotInstanceTermination)",
              "instance_id type noticed attempts_lost cost_usd"),
        _spec("task.interrupted", "an attempt ended by a spot interruption (no failure of the task: re-queued)",
              "task attempt node cause"),
        _spec("instance.interruption_notice_ignored", "an agent not on a spot instance of the run reported a notice",
              "node reason"),
        _spec("fault.injected", "`BROKER_DRY_RUN_FAULTS`: an EC2 fault was injected into a dry run's call "
              "(kind `idempotent`: a RunInstances answered from its client token, as EC2 does)",
              "operation kind call detail"),
        _spec("aws.retry", "an EC2 call is retried after a throttle or a transient error",
              "operation attempt code delay_s"),
        _spec("ssh.connect", "an SSH session opened", "host port user ms"),
        _spec("ssh.disconnect", "an SSH session closed", "host port user"),
        _spec("ssh.error", "an SSH connection failed", "host port user error message"),
        _spec("ssh.host_key_trusted", "a new host key was trusted on first use",
              "host port key_type fingerprint known_hosts"),
        _spec("aws.console_output_failed", "an instance's console (for its host keys) could not be read",
              "instance_id kind code"),
        _spec("ssh.retry", "an instance's sshd did not answer yet: trying again", "host port attempt error delay_s"),
        _spec("ssh.host_keys_from_console", "an instance's host keys were read from its console and pinned",
              "instance_id host key_types known_hosts"),
        _spec("stdlib.log", "a warning from a library (APScheduler, paramiko, botocore)", "logger message",
              optional="exception"),
    )
}
# Events that the planning commands also write with the `run` fields of a run.
for _name in ("ssh.connect", "ssh.disconnect", "ssh.error", "ssh.host_key_trusted", "agent.attached", "agent.lost",
              "agent.reader_failed", "agent.tasks_lost", "stdlib.log"):
    _s = CATALOGUE[_name]
    CATALOGUE[_name] = EventSpec(_s.name, _s.summary, _s.run, _s.run, _s.optional)


# What the console shows on a terminal at the default level (info): what a person follows
# (plans, launches, releases, failures, the run's start and end). Warnings and errors are
# always shown; the rest (each task's start and end, each SSH session, each EC2 call) only
# at --log-level debug. events.jsonl always holds every event.
CONSOLE_EVENTS = frozenset((
    "run.start", "run.resume", "run.bag_changed", "run.goal_changed", "run.stop", "run.left", "run.done", "run.disk_full", "run.disk_full_released",
    "plan.solved", "decision.notes", "budget.stop", "metrics.serving",
    "instance.launch", "instance.launch_failed", "instance.ready", "instance.terminated",
    "instance.terminate_failed", "instance.type_avoided", "instance.type_broken", "instance.stray_terminated",
    "run.instances_unconfirmed",
    "node.ready", "node.lost", "node.unreachable", "node.away", "node.down", "node.setup_failed", "node.quarantined", "agent.lost",
    "agent.reattach_failed",
    "task.failed", "task.quarantined", "task.outputs_failed",
    "sample.start", "sample.exhausted", "sample.failure", "sample.timeout", "sample.adopted",
))


def problems(line: dict, *, in_run: bool) -> list[str]:
    """What is wrong with one parsed log line against the catalogue; empty when nothing."""
    name = line.get("event")
    spec = CATALOGUE.get(name)  # type: ignore[arg-type]
    if spec is None:
        return [f"event {name!r} is not in the catalogue (broker/shells/events.py)"]
    fields = spec.run if in_run else spec.tool
    if fields is None:
        where = "during a run" if in_run else "outside a run"
        return [f"event {name!r} is not documented as written {where}"]
    base = RUN_KEYS if in_run else BASE_KEYS
    found = []
    missing = [k for k in (*base, *fields) if k not in line]
    if missing:
        found.append(f"event {name!r} lacks {', '.join(missing)}")
    extra = sorted(set(line) - set(base) - {"run_id"} - spec.allowed())
    if extra:
        found.append(f"event {name!r} has undocumented fields {', '.join(extra)}")
    return found


def markdown_table() -> str:
    """The README's event table, generated from :data:`CATALOGUE`."""
    rows = ["| event | written by | fields | on a terminal | what happened |", "|---|---|---|---|---|"]
    for spec in CATALOGUE.values():
        by = " + ".join(w for w, f in (("run", spec.run), ("plan/estimate/simulate", spec.tool)) if f is not None)
        if spec.run is not None and spec.tool is not None and spec.run != spec.tool:
            fields = f"run: {', '.join(spec.run)}; plan/estimate/simulate: {', '.join(spec.tool)}"
        else:
            fields = ", ".join(spec.run if spec.run is not None else spec.tool or ())
        if spec.optional:
            fields += f" (when they apply: {', '.join(spec.optional)})"
        shown = "shown" if spec.name in CONSOLE_EVENTS else "debug"
        rows.append(f"| `{spec.name}` | {by} | {fields} | {shown} | {spec.summary} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
