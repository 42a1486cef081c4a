"""``broker run``: execute a bag, on EC2 or (``--dry-run``) on moto and local agents.

    broker run --inventory INV BAG [--deadline DUR | --budget USD | --point K | --theta X]
               [--run-dir DIR] [--dry-run] [--yes] [--time-scale K] [--tick DUR] [--json-report]
               [--on-stop release|leave]

The plan table (the front, the chosen point marked) is printed when the first plan is
solved, before any money is spent; the first launch asks "Launch N instances (~$X)?" unless
``--yes``. Without a terminal and without ``--yes`` the command refuses at once (exit 2).
Exit status: 0 when every task is done, 1 when the run ended with tasks left or failed.

Resume: on a ``--run-dir`` whose journal holds an unfinished run (the daemon was killed, or
stopped with ``--on-stop leave``), the same command resumes it (``Daemon._restore``). The
bag must be the same file content (its SHA-256 is in the journal), the goal, ``--dry-run``
and the time scale the same; the run's clock, tick and margin continue from the journal.

Stop: SIGINT/SIGTERM stop dispatching; ``--on-stop release`` (default) then cancels what
runs, releases every instance and ends the run ``stopped``; ``--on-stop leave`` leaves the
instances, the agents and their tasks running and the run resumable.

A dry run's EC2 is a moto server process per run directory (``moto_world.dry_run_ec2``),
started by the first ``broker run --dry-run`` and stopped when the run ends or by
``broker down``; it survives a killed daemon so that a resume finds its instances.
``BROKER_DRY_RUN_FAULTS`` (``KIND[:TYPE|OPERATION][:N],...``, see ``faults.parse_fault_spec``)
makes that EC2 fail on purpose: capacity, limits, throttles, timeouts, partial launches.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import signal
import sys
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from broker.cli import UsageError
from broker.cli.terminal import RedrawnLine
from broker.cli.plan import add_goal_arguments, confidence_from_args, goal_from_args
from broker.config.durations import format_duration, parse_duration

DRY_RUN_TIME_SCALE = 60.0
# Set (to anything) to keep a dry run's moto server after the run, to inspect it; `broker
# down RUN_DIR` stops it.
KEEP_MOTO_ENV = "BROKER_DRY_RUN_KEEP_MOTO"
# EC2 faults to inject into a dry run's moto (broker/shells/faults.py, parse_fault_spec).
FAULTS_ENV = "BROKER_DRY_RUN_FAULTS"
RUNS_DIR = Path("runs")
EVENTS_FILE = "events.jsonl"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a bag: plan, confirm, launch, dispatch, release (--dry-run: moto + local agents)",
        description="Run a bag of tasks within a goal. The plan table is printed before anything is "
        "spent. The same command on the --run-dir of an unfinished run resumes it; `broker down "
        "RUN_DIR` releases what it holds instead.",
    )
    p.add_argument("--inventory", required=True, metavar="INV", help="inventory file (YAML)")
    p.add_argument("bag", help="bag file (YAML)")
    add_goal_arguments(p)
    p.add_argument("--run-dir", metavar="DIR", help="where the journal, events and agents live "
                   "(default: ./runs/<run-id>/)")
    p.add_argument("--dry-run", action="store_true",
                   help="EC2 served by moto in this process, each instance a local agent; tasks really run")
    p.add_argument("--yes", action="store_true", help="launch without asking")
    p.add_argument("--time-scale", type=float, metavar="K",
                   help=f"run time passes K times faster than wall time: an hourly billing unit lasts "
                   f"3600/K wall seconds, boot delays and release timers shrink alike, but tasks really "
                   f"run, so they look K times longer to the planner (default: {DRY_RUN_TIME_SCALE:g} with "
                   f"--dry-run, so the examples finish in well under a minute; 1 otherwise, the only value "
                   f"a live run accepts)")
    p.add_argument("--tick", default="60s", metavar="DUR", help="monitoring interval in run time (default 60s)")
    p.add_argument("--margin", default="2m", metavar="DUR",
                   help="release this long before a billing boundary, in run time (default 2m)")
    p.add_argument("--json-report", action="store_true", help="print the final report as one JSON object")
    p.add_argument("--samples", metavar="FILE",
                   help="samples.json written by `broker plan --sample` for this bag: its done tasks are not "
                   "run again and its estimate replaces the run's own sampling phase")
    p.add_argument("--on-stop", choices=("release", "leave"), default="release",
                   help="on Ctrl-C or SIGTERM: 'release' (default) cancels running tasks, releases every "
                   "instance and ends the run; 'leave' keeps instances, agents and their tasks running so "
                   "that `broker run` on the same --run-dir resumes (or `broker down` releases them)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics while the run lasts "
                   "(0: any free port, logged as metrics.serving; needs prometheus-client)")
    p.set_defaults(func=run)


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _duration(flag: str, text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if value <= 0:
        raise UsageError(f"{flag}: must be more than 0 seconds")
    return value


def run(args: argparse.Namespace) -> int:
    from broker.config.bag import load_bag
    from broker.config.inventory import load_inventory
    from broker.core.control.snapshot import Goal

    goal_arg = goal_from_args(args)
    confidence_from_args(args)  # a bad --confidence exits 2 before anything starts
    goal = Goal() if goal_arg is None else Goal(goal_arg.kind, goal_arg.value)
    tick_s = _duration("--tick", args.tick)
    margin_s = _duration("--margin", args.margin)
    scale = args.time_scale if args.time_scale is not None else (DRY_RUN_TIME_SCALE if args.dry_run else 1.0)
    if not scale > 0:
        raise UsageError(f"--time-scale: must be positive, got {scale:g}")
    if not args.dry_run and scale != 1.0:
        raise UsageError("--time-scale is for --dry-run only: a live run is billed in real time")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port: {args.metrics_port} is not a TCP port (0-65535)")
    if not args.yes and not sys.stdin.isatty():
        raise UsageError("refusing to run without confirmation: standard input is not a terminal, so "
                         "nobody can answer the launch question; pass --yes to launch without asking")
    if os.environ.get(FAULTS_ENV, "").strip() and not args.dry_run:
        raise UsageError(f"{FAULTS_ENV} is set ({os.environ[FAULTS_ENV].strip()!r}): faults are injected into "
                         f"dry runs only; unset it or add --dry-run")
    inventory = load_inventory(args.inventory, live=not args.dry_run)
    bag = load_bag(args.bag)
    args.fault_entries = _fault_entries(args, inventory)
    args.prior_samples = load_samples(args.samples, bag, args.bag) if args.samples else None
    if not args.dry_run and inventory.types and not inventory.aws.key:
        raise UsageError(f"{args.inventory}: a live run logs in to its EC2 instances over SSH: give aws.key, "
                         "the private key file of the key pair aws.key_name (or use --dry-run)")

    run_dir = Path(args.run_dir) if args.run_dir else None
    from broker.shells.journal import JOURNAL_FILE, Journal

    if run_dir is not None and (run_dir / JOURNAL_FILE).is_file():
        from broker.shells.journal import JournalError

        try:
            existing = Journal.open(run_dir, readonly=True)
        except JournalError as exc:
            raise UsageError(f"{run_dir}: {exc}") from None
        try:
            record = existing.run()
            instance_types = {i.type_name for i in existing.instances()}
        finally:
            existing.close()
        if record is not None:
            if record.state != "running":
                raise UsageError(f"run {record.id} in {run_dir} already ended ({record.state}); "
                                 "start a new run directory to run again")
            scale, tick_s, margin_s = _check_resume(args, record, goal, scale, inventory, instance_types, run_dir)
            return _execute(args, inventory, bag, goal, record.id, run_dir, scale, tick_s, margin_s, resume=record)
    run_id = new_run_id()
    run_dir = run_dir or RUNS_DIR / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s)


def _fault_entries(args, inventory) -> list | None:
    """The EC2 faults ``BROKER_DRY_RUN_FAULTS`` names, for a dry run only."""
    spec = os.environ.get(FAULTS_ENV, "").strip()
    if not spec:
        return None
    from broker.shells.faults import parse_fault_spec

    try:
        entries = parse_fault_spec(spec, FAULTS_ENV)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    known = {t.name for t in inventory.types}
    for entry in entries:
        if entry.target is not None and "." in entry.target and entry.target not in known:
            raise UsageError(f"{FAULTS_ENV}: instance type {entry.target!r} is not in {args.inventory} "
                             f"(types: {', '.join(sorted(known)) or 'none'})")
    return entries


def _check_resume(args, record, goal, scale, inventory, instance_types, run_dir) -> tuple[float, float, float]:
    """Refuse to resume with inputs other than the run's; return its scale, tick and margin."""
    from broker.shells.journal import file_sha256

    how = f"resume it with the same inputs, or `broker down {run_dir}` and start a new run directory"
    sha = file_sha256(args.bag)
    if record.bag_sha256 is not None and sha != record.bag_sha256:
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: the bag {args.bag} differs from the one "
                         f"it started with ({record.bag_path}; sha256 {sha[:12]}... now, "
                         f"{record.bag_sha256[:12]}... then): {how}")
    options = record.options
    if bool(options.get("dry_run")) != bool(args.dry_run):
        then = "a dry run" if options.get("dry_run") else "a live run"
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: it is {then}; "
                         f"{'add' if options.get('dry_run') else 'drop'} --dry-run")
    kind = "theta" if goal.kind == "none" else goal.kind
    value = 1.0 if goal.kind == "none" else goal.value
    if kind != record.goal_kind or (value is not None and record.goal_value is not None
                                    and abs(float(value) - float(record.goal_value)) > 1e-9):
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: its goal is --{record.goal_kind} "
                         f"{record.goal_value:g}, not --{kind} {value:g}: {how}")
    run_scale = float(options.get("time_scale", scale))
    if args.time_scale is not None and abs(args.time_scale - run_scale) > 1e-9:
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: it runs at time scale {run_scale:g}, "
                         f"not {args.time_scale:g}")
    missing = sorted(instance_types - {t.name for t in inventory.types})
    if missing:
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: its instances are of type(s) "
                         f"{', '.join(missing)}, which {args.inventory} no longer lists: {how}")
    return run_scale, float(options.get("tick_s", 60.0)), float(options.get("margin_s", 120.0))


def _resume_clock(record, scale: float, journal_latest_s: float | None):
    """The run clock continued: run time kept passing (and billing) while no daemon ran."""
    import time

    from broker.shells.clock import RunClock

    anchor = float(record.options.get("epoch_anchor_s", record.created_at_s))
    elapsed = scale * (time.time() - anchor)
    if journal_latest_s is not None:
        elapsed = max(elapsed, journal_latest_s - anchor)
    return RunClock(scale, offset_s=max(0.0, elapsed), epoch_anchor_s=anchor)


def _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s, resume=None) -> int:
    import structlog

    server_process = None
    if args.dry_run:  # the moto server loads while this process imports
        from broker.shells.moto_world import DEFAULT_REGION, spawn_moto_server

        server_process = spawn_moto_server(run_dir, inventory.aws.region or DEFAULT_REGION)
    import broker.core.plan  # noqa: F401 - pulp's import is paid before the run clock starts
    from broker.core.control.controller import ControllerConfig
    from broker.shells.aws import Ec2Fleet
    from broker.shells.clock import RunClock
    from broker.shells.crashpoints import CrashingFleet, CrashingJournal, plan_from_env
    from broker.shells.daemon import Daemon, DaemonOptions
    from broker.shells.journal import Journal
    from broker.shells.logging import configure_logging
    from broker.shells.nodes import LocalAgents, SshAgents

    crash = plan_from_env()
    state = {"left": False}
    with ExitStack() as stack:
        events = stack.enter_context(open(run_dir / EVENTS_FILE, "a", encoding="utf-8"))
        configure_logging(level=args.log_level, extra_files=[events], bind={"run_id": run_id})
        stack.callback(configure_logging, level=args.log_level)  # stop writing to the closed file
        if args.dry_run:
            from broker.shells.moto_world import dry_run_ec2, stop_moto_server

            client, settings, server = stack.enter_context(
                dry_run_ec2(inventory.aws, run_id, run_dir, process=server_process))
            if resume is not None and server_process is not None:
                print(f"note: the dry run's moto server for {run_dir} was gone: its instances went with it",
                      file=sys.stderr)

            def stop_server() -> None:
                if not state["left"] and not os.environ.get(KEEP_MOTO_ENV):
                    stop_moto_server(run_dir)

            stack.callback(stop_server)
            if getattr(args, "fault_entries", None):
                from broker.shells.faults import SpecFaultInjector

                injector = SpecFaultInjector(args.fault_entries)
                injector.on_inject = lambda i: structlog.get_logger().warning(
                    "fault.injected", operation=i.operation, kind=i.kind.value, call=i.operation_call,
                    detail=i.detail)
                injector.attach(client)
            fleet = Ec2Fleet(client, settings, run_id)
        else:
            import boto3

            fleet = Ec2Fleet(boto3.Session(), inventory.aws, run_id)
        if crash is not None:
            fleet = CrashingFleet(fleet, crash)
        if resume is None:
            # The run's time starts once the set-up above is done (at K = 1800 a second of moto
            # set-up would be half an hour of billing).
            clock = RunClock(scale)
        else:
            with Journal.open(run_dir, readonly=True) as probe:
                clock = _resume_clock(resume, scale, probe.latest_time_s())
        if args.metrics_port is not None:  # before the journal: a port in use leaves no run behind
            from broker.shells.metrics import MetricsUnavailable, serve_metrics

            try:
                metrics = serve_metrics(run_dir, args.metrics_port, now_s=clock.epoch_s)
            except MetricsUnavailable as exc:
                raise UsageError(str(exc)) from None
            stack.callback(metrics.close)
            structlog.get_logger().info("metrics.serving", host=metrics.host, port=metrics.port, url=metrics.url)
        journal = stack.enter_context(Journal.open(run_dir, clock=clock.epoch_s))
        if crash is not None:
            journal = CrashingJournal(journal, crash)
        if resume is None:
            journal.create_run(
                run_id, goal_kind="theta" if goal.kind == "none" else goal.kind,
                goal_value=1.0 if goal.kind == "none" else goal.value,
                budget_usd=goal.value if goal.kind == "budget" else None,
                deadline_s=goal.value if goal.kind == "deadline" else None,
                retries=bag.retries, inventory_path=args.inventory, bag_path=args.bag,
                options={"dry_run": args.dry_run, "time_scale": scale, "tick_s": tick_s, "margin_s": margin_s,
                         "epoch_anchor_s": clock.epoch_anchor_s},
                at_s=clock.epoch_s(),
            )
            journal.add_tasks(bag.tasks)
        inbox: queue.Queue = queue.Queue()
        local = LocalAgents(run_dir, inbox)
        remote = SshAgents(run_id, inbox)
        instances = local if args.dry_run else _instance_agents(run_id, run_dir, inbox, inventory.aws, fleet)

        def private_agent(node, expect=()):
            return local.attach(node.name, node.slots, expect) if node.local else remote.attach(node, expect)

        def fetch_outputs(node_id, *request):
            private = next((p for p in inventory.private if p.name == node_id), None)
            agents = instances if private is None else (local if private.local else remote)
            return agents.fetch(node_id, *request)

        def reattach_agent(name, slots, client):
            node = next((p for p in inventory.private if p.name == name), None)
            if node is not None and not node.local:
                remote.reattach(node, client)
            elif node is not None or args.dry_run:  # the local node, or a dry run's instance
                local.reattach(name, slots, client)
            else:  # an EC2 instance over SSH
                instances.reattach(name, slots, client)

        def stop_private(name, client):
            node = next(p for p in inventory.private if p.name == name)
            (local.stop(name, client) if node.local else remote.stop(name, client))

        printer = _Printer(inventory, len(bag.tasks), args.yes, json_report=args.json_report)
        printer.budget_usd = goal.value if goal.kind == "budget" else None
        daemon = Daemon(
            inventory, bag, goal,
            DaemonOptions(run_dir=run_dir, run_id=run_id, dry_run=args.dry_run, tick_s=tick_s,
                          resume=resume is not None, on_stop=args.on_stop),
            journal=journal, clock=clock, fleet=fleet, instance_agents=instances,
            private_agents=private_agent, stop_private_agent=stop_private, inbox=inbox,
            config=ControllerConfig(tick_s=tick_s, margin_s=margin_s, confidence=confidence_from_args(args)),
            confirm=printer.confirm, on_first_plan=printer.show_plan, on_progress=printer.progress,
            samples=args.prior_samples, fetch_outputs=fetch_outputs, reattach_agent=reattach_agent,
        )
        previous = {sig: signal.signal(sig, lambda *_: daemon.request_stop("user_stop"))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(f"{'resuming ' if resume is not None else ''}run {run_id} in {run_dir} "
                  f"({'dry run, ' if args.dry_run else ''}time scale {scale:g}, {len(bag.tasks)} tasks)",
                  file=printer.out, flush=True)
            report = daemon.run()
            state["left"] = report.state == "left"
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        structlog.get_logger().debug("run.report", **report.to_json())
        if report.state == "left":
            print(f"left the run's instances and agents running: `broker run` with the same arguments and "
                  f"--run-dir {run_dir} resumes it, `broker down {run_dir}` releases them",
                  file=printer.out, flush=True)
    verdict = run_verdict(goal, report)
    if args.json_report:
        document = report.to_json()
        document["goal"] = {"met": verdict.met, "summary": verdict.summary, "causes": list(verdict.causes)}
        print(json.dumps(document))
    else:
        from broker.cli.report import print_report

        print_report(run_dir)
        if report.state != "left":
            print(verdict.text(), flush=True)
    if report.stop_reason == "declined":
        return 1
    return 0 if verdict.met and report.tasks_done == report.tasks_total else 1


def run_verdict(goal, report):
    """Was the goal met (a deadline by the makespan, a budget by the total cost)? See
    :mod:`broker.cli.verdict`."""
    from broker.cli.verdict import RunFacts, judge

    facts = RunFacts(
        makespan_s=report.makespan_s, cost_usd=report.cost_usd, tasks_total=report.tasks_total,
        tasks_done=report.tasks_done, budget_stopped=report.budget_stopped, tasks_failed=report.tasks_failed,
        first_planned_makespan_s=report.planned_makespan_s,
    )
    return judge(goal.kind, goal.value, facts)


def load_samples(path: str, bag, bag_path: str):
    """The ``samples.json`` of ``broker plan --sample``, checked against ``bag``.

    Every task it names must be in the bag (else it was sampled from another bag); its done
    draws become :class:`~broker.shells.daemon.SampledTask`; the estimate, when the rule was
    met, the run's prior (sd: the spread of the draws the rule used, capped at the timeout).
    """
    import statistics

    from broker.shells.daemon import PriorSamples, SampledTask

    def bad(why: str) -> UsageError:
        return UsageError(f"--samples {path}: {why}")

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad("file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON (line {exc.lineno}: {exc.msg}); give the samples.json `broker plan --sample` "
                  "wrote") from None
    tasks = document.get("tasks") if isinstance(document, dict) else None
    if not isinstance(tasks, dict):
        raise bad("no 'tasks' object: is this the samples.json `broker plan --sample` wrote?")
    ids = {t.id for t in bag.tasks}
    unknown = sorted(set(tasks) - ids)
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise bad(f"{len(unknown)} task{'s' if len(unknown) != 1 else ''} not in the bag {bag_path} ({shown}): "
                  "were the samples taken from another bag?")
    done, used = [], []
    for task_id, t in tasks.items():
        try:
            if not t.get("done"):
                continue
            sample = SampledTask(task=task_id, node=str(t["node"]), attempt=int(t["attempt"]), draw=int(t["draw"]),
                                 runtime_s=float(t["runtime_s"]), runtime_ref_s=float(t["runtime_ref_s"]),
                                 exit_code=t.get("exit_code"))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise bad(f"task {task_id}: missing or malformed field ({type(exc).__name__}: {exc})") from None
        done.append(sample)
        if t.get("used"):
            used.append(min(sample.runtime_ref_s, bag.timeout_s))
    estimate = document.get("estimate")
    mean = sd = rule = None
    if isinstance(estimate, dict) and isinstance(estimate.get("mean_ref_s"), (int, float)):
        mean, rule = float(estimate["mean_ref_s"]), estimate.get("rule")
        sd = statistics.stdev(used) if len(used) > 1 else None
    return PriorSamples(source=str(path), done=tuple(done), mean_ref_s=mean, sd_ref_s=sd, rule=rule)


def _instance_agents(run_id, run_dir, inbox, aws, fleet):
    """A live run's instances: reached over SSH at the address EC2 reports (aws.address)."""
    from broker.shells.nodes import InstanceAgents

    if not aws.key:  # an inventory without types never launches: nothing to reach
        return None
    return InstanceAgents(run_id, run_dir, inbox, aws, address_of=lambda i: fleet.address_of(i, aws.address),
                          console_of=fleet.console_output)


class _Printer:
    """What the user sees on stdout: the plan table, the launch question, progress lines."""

    def __init__(self, inventory, total: int, yes: bool, json_report: bool) -> None:
        self.inventory = inventory
        self.yes = yes
        self.every = max(1, total // 10)
        self.out = sys.stderr if json_report else sys.stdout
        self.plan_shown = False
        self.line = RedrawnLine(self.out)
        self.budget_usd = None

    def show_plan(self, request) -> None:
        from broker.cli.plan import render_table
        from broker.core.plan import NoFeasiblePlan, Work, pareto_front

        rem = request.remaining
        if rem is None:
            return
        work = Work(total_ref_s=max(rem.upper_ref_s, 1e-6), tasks=max(rem.pending + rem.running, 1),
                    mean_ref_s=rem.mean_ref_s, sd_ref_s=rem.sd_ref_s)
        try:
            front = pareto_front(self.inventory.types, self.inventory.private, work)
        except NoFeasiblePlan:
            front = []
        plan = request.memory.last_plan
        print(render_table(work, self.inventory.types, front, plan), file=self.out)
        if request.memory.planned_makespan_s is not None:
            print(f"plan: makespan {format_duration(request.memory.planned_makespan_s)} (run time), "
                  f"cost ${request.memory.planned_cost_usd:.2f}", file=self.out, flush=True)
        if request.memory.promise is not None:  # before anything is bought: what can be promised
            print(f"promise: {request.memory.promise.text()}", file=self.out, flush=True)
        note = request.memory.last_note
        if note and note.startswith("deadline"):  # cannot be met, or not at the confidence
            print(f"warning: {note}", file=self.out, flush=True)
        self.plan_shown = True

    def confirm(self, request) -> bool:
        count = sum(c for _, c in request.launches)
        fleet = ", ".join(f"{c} x {t}" for t, c in request.launches)
        question = f"Launch {count} instance{'s' if count != 1 else ''} ({fleet}, ~${request.estimated_usd:.2f})? [y/N] "
        if self.yes:
            print(question + "yes (--yes)", file=self.out, flush=True)
            return True
        try:
            answer = input(question)
        except EOFError:
            answer = ""
        return answer.strip().lower() in ("y", "yes")

    def progress(self, done: int, failed: int, total: int, committed_usd: float) -> None:
        """A bar redrawn in place on a terminal; a plain line every tenth of the bag otherwise.
        Tasks finished before the first plan are the sampling phase."""
        from broker.cli.status import progress_text

        phase = "running" if self.plan_shown else "sampling"
        last = done + failed == total
        if self.out.isatty():
            self.line.draw(progress_text(phase, done, failed, total, committed_usd, self.budget_usd))
            if last:
                self.line.close()
        elif done % self.every == 0 or last:
            print(f"progress: {done}/{total} done, {failed} failed, ${committed_usd:.2f} committed"
                  + (" (sampling)" if phase == "sampling" else ""), file=self.out, flush=True)
