"""``broker run``: execute a bag, on EC2 or (``--dry-run``) on moto and local agents.

    broker run --inventory INV BAG [--deadline DUR | --budget USD | --point K | --theta X]
               [--run-dir DIR] [--dry-run] [--yes] [--time-scale K] [--tick DUR] [--json-report]
               [--on-stop release|leave]

The plan table (the front, the chosen point marked) is printed when the first plan is
solved, before any money is spent; the first launch asks "Launch N instances (~$X)?" unless
``--yes``. Without a terminal and without ``--yes`` the command refuses at once (exit 2).
Exit status: 0 when every task is done, 1 when the run ended with tasks left or failed.

Resume: on a ``--run-dir`` whose journal holds an unfinished run (the daemon was killed, or
stopped with ``--on-stop leave``), the same command resumes it (``broker/shells/run/resume.py``),
with the bag, goal and inventory given now: an edited bag is matched with the journal's tasks
by command, environment and working directory, another goal re-plans; what would make
continuing wrong is refused (``broker/cli/run_resume.py``). The run's clock, tick and margin
continue from the journal.

Stop: SIGINT/SIGTERM stop dispatching; ``--on-stop release`` (default) then cancels what
runs, releases every instance and ends the run ``stopped``; ``--on-stop leave`` leaves the
instances, the agents and their tasks running and the run resumable.

A dry run's EC2 is a moto server process per run directory (``moto_world.dry_run_ec2``),
started by the first ``broker run --dry-run`` and stopped when the run ends or by
``broker down``; it survives a killed daemon so that a resume finds its instances.
``BROKER_DRY_RUN_FAULTS`` (``KIND[:TYPE|OPERATION][:N],...``, see ``faults.parse_fault_spec``)
makes that EC2 fail on purpose: capacity, limits, throttles, timeouts, partial launches, and
spot interruptions (``spot_interrupt:TYPE:RATE``: a notice the instance's agent reads from a
fake metadata service on 127.0.0.1, then the instance terminated; ``spot_faults.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import signal
import sys
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path

from broker.cli import UsageError
from broker.cli.plan import add_goal_arguments, goal_from_args, promise_options
from broker.cli.runview import RunConsole
from broker.core.control.failures import FailurePolicy
from broker.core.units import parse_duration

DRY_RUN_TIME_SCALE = 60.0
# Set (to anything) to keep a dry run's moto server after the run, to inspect it; `broker
# down RUN_DIR` stops it.
KEEP_MOTO_ENV = "BROKER_DRY_RUN_KEEP_MOTO"
# EC2 faults to inject into a dry run's moto (broker/shells/faults.py, parse_fault_spec).
FAULTS_ENV = "BROKER_DRY_RUN_FAULTS"
# A file to record the run ledger's events and the controller's decisions in, for the replay
# test (broker/shells/run/trace.py); not for users.
TRACE_ENV = "BROKER_LEDGER_TRACE"
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
    p.add_argument("--max-spot-attempts", type=int, default=2, metavar="N",
                   help="a task interrupted N times on spot runs on on-demand or private nodes only (default 2)")
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
    from broker.core.goal import Goal

    goal_arg = goal_from_args(args)
    promise_options(args)  # a bad --confidence or --estimate-bias exits 2 before anything starts
    goal = goal_arg or Goal()  # no goal: the cheapest plan
    tick_s = _duration("--tick", args.tick)
    margin_s = _duration("--margin", args.margin)
    scale = args.time_scale if args.time_scale is not None else (DRY_RUN_TIME_SCALE if args.dry_run else 1.0)
    if not scale > 0:
        raise UsageError(f"--time-scale: must be positive, got {scale:g}")
    if not args.dry_run and scale != 1.0:
        raise UsageError("--time-scale is for --dry-run only: a live run is billed in real time")
    if args.max_spot_attempts < 1:
        raise UsageError(f"--max-spot-attempts: must be at least 1, got {args.max_spot_attempts}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port: {args.metrics_port} is not a TCP port (0-65535)")
    if not args.yes and not sys.stdin.isatty():
        raise UsageError("refusing to run without confirmation: standard input is not a terminal, so "
                         "nobody can answer the launch question; pass --yes to launch without asking")
    if os.environ.get(FAULTS_ENV, "").strip() and not args.dry_run:
        raise UsageError(f"{FAULTS_ENV} is set ({os.environ[FAULTS_ENV].strip()!r}): faults are injected into "
                         f"dry runs only; unset it or add --dry-run")
    inventory = load_inventory(args.inventory, live=not args.dry_run, rents=False)
    bag = load_bag(args.bag)
    args.fault_entries = _fault_entries(args, inventory)
    args.prior_samples = load_samples(args.samples, bag, args.bag) if args.samples else None
    args.ec2, args.no_ec2_reason = ("on", None) if args.dry_run else _ec2_mode(args.inventory, inventory, goal)
    if args.ec2 == "on" and not args.dry_run:
        _preflight(inventory)  # before a run directory, a sample or an agent: refusals cost nothing

    run_dir = Path(args.run_dir) if args.run_dir else None
    _check_before_creating(args, run_dir)
    run_id = new_run_id()
    run_dir = run_dir or RUNS_DIR / run_id
    from broker.shells.private_files import private_dir

    private_dir(run_dir)  # 0700, even one the user made beforehand
    with _attached(run_dir):
        return _run_in(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s)


def _check_before_creating(args, run_dir: Path | None) -> None:
    """Traps that must stop the run before it creates anything (nothing is left behind)."""
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir: {run_dir} is a file, not a directory: name a directory (it is created "
                         "if missing)")
    if args.metrics_port:  # 0 takes any free port
        import socket

        from broker.shells.metrics import METRICS_HOST

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((METRICS_HOST, args.metrics_port))
            except OSError as exc:
                raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen on {METRICS_HOST}:"
                                 f"{args.metrics_port} ({exc.strerror or exc}): give another port, or 0 for any "
                                 "free one") from None


@contextmanager
def _attached(run_dir: Path):
    """Hold the run directory's daemon lock (``broker status`` tells whether a daemon is attached;
    a second ``broker run`` on the directory is refused)."""
    from broker.shells.runlock import RunDirInUse, hold

    try:
        with hold(run_dir):
            yield
    except RunDirInUse as exc:
        raise UsageError(str(exc)) from None


def _run_in(args, inventory, bag, goal, run_id: str, run_dir: Path, scale, tick_s, margin_s) -> int:
    """Resume the unfinished run in ``run_dir``, or start a new one there."""
    from broker.shells.journal import JOURNAL_FILE, Journal

    if (run_dir / JOURNAL_FILE).is_file():
        from broker.shells.journal import JournalError

        try:
            existing = Journal.open(run_dir, readonly=True)
        except JournalError as exc:
            raise UsageError(f"{run_dir}: {exc}") from None
        from broker.cli.run_resume import prepare_resume

        try:
            record = existing.run()
            if record is not None and record.state != "running":
                raise UsageError(f"run {record.id} in {run_dir} already ended ({record.state}); "
                                 "start a new run directory to run again")
            plan = None if record is None else prepare_resume(args, record, existing, goal, scale, inventory, bag,
                                                              run_dir)
        finally:
            existing.close()
        if plan is not None:
            return _execute(args, inventory, plan.bag, goal, record.id, run_dir, plan.scale, plan.tick_s,
                            plan.margin_s, resume=record, resume_plan=plan)
    return _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s)


def _preflight(inventory) -> None:
    """Ask AWS whether a live run can work (``broker/shells/aws/preflight.py``); every problem
    at once, exit 2. An inventory without EC2 types needs no AWS: nothing is asked."""
    from broker.config.errors import ConfigError
    from broker.shells.aws.preflight import preflight

    report = preflight(inventory)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if report.problems:
        raise ConfigError(report.problems)
    print(f"preflight: {'; '.join(report.checked)}", file=sys.stderr, flush=True)


# What renting takes, besides credentials: the launch fields and the key to log in with.
_RENT_FIELDS = ("region", "ami", "key_name", "security_group", "key")


def _ec2_mode(path: str, inventory, goal) -> tuple[str, str | None]:
    """How a live run uses EC2, and why not when it does not:

    - ``off``: it can never rent (``broker/core/rent.py``): no AWS section, credentials,
      preflight or EC2 call, on start, resume or ``broker down``;
    - ``unconfigured``: it may rent, but the ``aws`` section lacks what renting takes: it runs
      on the private nodes, asks nothing of AWS, and a plan that wants an instance is told
      what is missing (refused, exit 2, when there is no private node to run on);
    - ``on``: it may rent and can (the AWS preflight applies).
    """
    from broker.config.inventory import load_inventory
    from broker.core.rent import why_no_ec2

    reason = why_no_ec2(inventory, goal)
    if reason is not None:
        return "off", reason
    missing = [f"aws.{name}" for name in _RENT_FIELDS if not getattr(inventory.aws, name)]
    if not missing:
        return "on", None
    if not inventory.private:  # EC2 is all there is to run on: what is missing is bad input
        load_inventory(path, live=True)  # ConfigError: every missing launch field, with its line
        raise UsageError(f"{path}: a live run logs in to its EC2 instances over SSH: give aws.key, the private "
                         "key file of the key pair aws.key_name (or use --dry-run)")
    return "unconfigured", f"{', '.join(missing)} missing in {path}, so this run cannot rent EC2 instances"


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


def _resume_clock(record, scale: float, journal_latest_s: float | None):
    """The run clock continued: run time kept passing (and billing) while no daemon ran."""
    import time

    from broker.shells.clock import RunClock

    anchor = float(record.options.get("epoch_anchor_s", record.created_at_s))
    elapsed = scale * (time.time() - anchor)
    if journal_latest_s is not None:
        elapsed = max(elapsed, journal_latest_s - anchor)
    return RunClock(scale, offset_s=max(0.0, elapsed), epoch_anchor_s=anchor)


def _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s, resume=None,
             resume_plan=None) -> int:
    import structlog

    server_process = None
    if args.dry_run:  # the moto server loads while this process imports
        from broker.shells.moto_world import DEFAULT_REGION, spawn_moto_server

        server_process = spawn_moto_server(run_dir, inventory.aws.region or DEFAULT_REGION)
    import broker.core.plan  # noqa: F401 - pulp's import is paid before the run clock starts
    from broker.shells.crashpoints import CrashingFleet, CrashingJournal, plan_from_env
    from broker.shells.journal import Journal
    from broker.shells.logging import configure_logging

    crash = plan_from_env()
    state = {"left": False}
    with ExitStack() as stack:
        events = stack.enter_context(open(run_dir / EVENTS_FILE, "a", encoding="utf-8"))
        configure_logging(level=args.log_level, extra_files=[events], bind={"run_id": run_id})
        stack.callback(configure_logging, level=args.log_level)  # stop writing to the closed file
        fleet = _fleet(args, inventory, run_id, run_dir, server_process, resume, stack, state, scale)
        if crash is not None:
            fleet = CrashingFleet(fleet, crash)
        clock = _clock(run_dir, scale, resume)
        if args.metrics_port is not None:  # before the journal: a port in use leaves no run behind
            from broker.shells.metrics import MetricsUnavailable, serve_metrics

            try:
                metrics = serve_metrics(run_dir, args.metrics_port, now_s=clock.epoch_s)
            except MetricsUnavailable as exc:
                raise UsageError(str(exc)) from None
            stack.callback(metrics.close)
            structlog.get_logger().info("metrics.serving", host=metrics.host, port=metrics.port, url=metrics.url)
        # The journal speaks run seconds: the clock's, stored from the run's epoch anchor.
        journal = stack.enter_context(Journal.open(run_dir, clock=clock.now_s, anchor_s=clock.epoch_anchor_s))
        if crash is not None:
            journal = CrashingJournal(journal, crash)
        if resume_plan is None:
            _set_up_journal(journal, args, bag, goal, run_id, clock, scale, tick_s, margin_s)
        else:  # an edited bag, a changed goal (a journal left with no tasks gets them here)
            from broker.cli.run_resume import record_resume

            record_resume(journal, resume_plan, args, goal)
        report, out = _run_daemon(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s, resume,
                                  journal, clock, fleet)
        state["left"] = report.state == "left"
        structlog.get_logger().debug("run.report", **report.to_json())
        if report.state == "left":
            print(f"left the run's instances and agents running: `broker run` with the same arguments and "
                  f"--run-dir {run_dir} resumes it, `broker down {run_dir}` releases them", file=out, flush=True)
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
    if report.unterminated:
        print(f"EC2 has not confirmed the termination of {', '.join(report.unterminated)}: they may still bill; "
              f"run `broker down {run_dir}`", file=sys.stderr, flush=True)
        return 1
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


def _fleet(args, inventory, run_id, run_dir, server_process, resume, stack, state, scale=1.0):
    """EC2 for the run: the run directory's moto server in a dry run (faults injected if
    asked, EC2's client-token idempotency emulated always, durations in run time; stopped at
    the end unless the run was left), boto3 otherwise (or no EC2 at all for a run that never
    rents: :func:`_live_fleet`)."""
    from broker.shells.aws import Ec2Fleet

    if not args.dry_run:
        return _live_fleet(args, inventory, run_id, run_dir, resume)
    import structlog

    from broker.shells.moto_world import dry_run_ec2, stop_moto_server

    client, settings, _server = stack.enter_context(dry_run_ec2(inventory.aws, run_id, run_dir, process=server_process))
    if resume is not None and server_process is not None:
        print(f"note: the dry run's moto server for {run_dir} was gone: its instances went with it", file=sys.stderr)

    def stop_server() -> None:
        if not state["left"] and not os.environ.get(KEEP_MOTO_ENV):
            stop_moto_server(run_dir)

    stack.callback(stop_server)
    import time

    from broker.shells.faults import SpecFaultInjector

    injector = SpecFaultInjector(getattr(args, "fault_entries", None) or (), clock=lambda: time.monotonic() * scale)
    injector.on_inject = lambda i: structlog.get_logger().warning(
        "fault.injected", operation=i.operation, kind=i.kind.value, call=i.operation_call, detail=i.detail)
    injector.attach(client)
    if any(t.is_spot for t in inventory.types):
        args.spot_metadata = _spot_interruptions(args, injector, client, _server, settings.region, run_id, stack,
                                                 scale)
    return Ec2Fleet(client, settings, run_id)


def _spot_interruptions(args, injector, client, server, region, run_id, stack, scale):
    """A dry run with spot offers: a fake metadata service on 127.0.0.1 that spot instances'
    agents watch, where ``spot_interrupt`` faults post notices (``shells/spot_faults.py``)."""
    import time
    import zlib

    from broker.shells.fake_imds import FakeMetadata
    from broker.shells.moto_world import server_client
    from broker.shells.spot_faults import SpotInterrupter, spot_rates

    metadata = stack.enter_context(FakeMetadata())
    interrupter = SpotInterrupter(spot_rates(getattr(args, "fault_entries", None) or ()), injector,
                                  server_client(server, region), metadata, clock=lambda: time.monotonic() * scale,
                                  time_scale=scale, seed=zlib.crc32(run_id.encode()))
    interrupter.attach(client)
    stack.callback(interrupter.close)
    return metadata


def _clock(run_dir, scale, resume):
    """The run clock: it starts now (once the set-up is done: at K = 1800 a second of moto
    set-up would be half an hour of billing), or continues a resumed run's."""
    from broker.shells.clock import RunClock
    from broker.shells.journal import Journal

    if resume is None:
        return RunClock(scale)
    with Journal.open(run_dir, readonly=True) as probe:
        return _resume_clock(resume, scale, probe.latest_time_s())


def _run_daemon(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s, resume, journal, clock, fleet):
    """The daemon on its nodes, run to its end with SIGINT/SIGTERM asking it to stop;
    returns its report and where the user's lines go."""
    from broker.core.control.controller import ControllerConfig
    from broker.shells.journal import Journal
    from broker.shells.nodes import LocalAgents, SshAgents
    from broker.shells.run import Daemon, DaemonOptions, RunNodes

    inbox: queue.Queue = queue.Queue()
    local = LocalAgents(run_dir, inbox)
    metadata = getattr(args, "spot_metadata", None)
    if args.dry_run and metadata is not None:  # spot instances' agents watch the fake metadata
        local.spot_metadata_of, local.spot_poll_s = metadata.base_url, max(0.05, 5.0 / scale)
    instances = local if args.dry_run else _instance_agents(run_id, run_dir, inbox, inventory.aws, fleet)
    nodes = RunNodes(inventory, local=local, remote=SshAgents(run_id, inbox), instances=instances)
    # The console reads the run's figures (its ETA) as `broker status` does: through a reader.
    reader = Journal.open(run_dir, readonly=True)
    printer = RunConsole(inventory, goal, len(bag.tasks), args.yes, json_report=args.json_report,
                         journal=reader, clock=clock, resumed=resume is not None)
    daemon = Daemon(
        inventory, bag, goal,
        DaemonOptions(run_dir=run_dir, run_id=run_id, dry_run=args.dry_run, tick_s=tick_s,
                      resume=resume is not None, on_stop=args.on_stop,
                      trace=Path(os.environ[TRACE_ENV]) if os.environ.get(TRACE_ENV) else None),
        journal=journal, clock=clock, fleet=fleet, nodes=nodes, inbox=inbox,
        config=ControllerConfig(tick_s=tick_s, margin_s=margin_s, **promise_options(args)),
        confirm=printer.confirm, on_first_plan=printer.show_plan, on_progress=printer.progress,
        samples=args.prior_samples, on_notice=printer.say,
        failure_policy=FailurePolicy(retries=bag.retries, max_spot_attempts=args.max_spot_attempts),
    )
    nodes.is_spot = daemon.is_spot_node
    previous = {sig: signal.signal(sig, lambda *_: daemon.request_stop("user_stop"))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"{'resuming ' if resume is not None else ''}run {run_id} in {run_dir} "
              f"({'dry run, ' if args.dry_run else ''}time scale {scale:g}, {len(bag.tasks)} tasks)",
              file=printer.out, flush=True)
        printer.start()
        try:
            return daemon.run(), printer.out
        finally:
            printer.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reader.close()


def _set_up_journal(journal, args, bag, goal, run_id, clock, scale, tick_s, margin_s) -> None:
    """The run's row and its tasks, in one transaction (a kill leaves both or neither), with
    what the tasks run with besides their command (a resume matches an edited bag by it)."""
    from broker.shells.run.bagedit import task_context

    journal.create_run(
        run_id, goal_kind="theta" if goal.kind == "none" else goal.kind,
        goal_value=1.0 if goal.kind == "none" else goal.value,
        budget_usd=goal.value if goal.kind == "budget" else None,
        deadline_s=goal.value if goal.kind == "deadline" else None,
        retries=bag.retries, inventory_path=os.path.abspath(args.inventory),
        bag_path=os.path.abspath(args.bag),
        # cwd: where the inventory's relative key paths are read from (broker down, elsewhere)
        options={"dry_run": args.dry_run, "time_scale": scale, "tick_s": tick_s, "margin_s": margin_s,
                 "epoch_anchor_s": clock.epoch_anchor_s, "cwd": os.getcwd(), "ec2": args.ec2},
        tasks=bag.tasks, task_context=task_context(bag),
    )


def load_samples(path: str, bag, bag_path: str):
    """The ``samples.json`` of ``broker plan --sample``, checked against ``bag``.

    Every task it names must be in the bag (else it was sampled from another bag); its done
    draws become :class:`~broker.shells.daemon.SampledTask`; the estimate, when the rule was
    met, the run's prior (sd: the spread of the draws the rule used, capped at the timeout).
    """
    import statistics

    from broker.shells.run import PriorSamples, SampledTask

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


def _live_fleet(args, inventory, run_id, run_dir, resume):
    """The EC2 fleet of a live run, or one that never calls EC2 (see :func:`_ec2_mode`)."""
    from broker.shells.aws import Ec2Fleet
    from broker.shells.aws.absent import NoEc2Fleet

    if args.ec2 != "on" and resume is not None:
        from broker.shells.journal import Journal

        with Journal.open(run_dir, readonly=True) as journal:
            launched = bool(journal.instances() or journal.actions("launch"))
        if launched and args.ec2 == "unconfigured":
            raise UsageError(f"cannot resume run {run_id} in {run_dir}: its journal holds EC2 launches, and "
                             f"{args.no_ec2_reason}: restore the aws section, or `broker down {run_dir}`")
        args.ec2 = "on" if launched else args.ec2
    if args.ec2 != "on":
        what = "EC2 is not used" if args.ec2 == "off" else "warning: EC2 is not available"
        print(f"{what}: {args.no_ec2_reason}; the run works on the private nodes and asks nothing of AWS",
              file=sys.stderr, flush=True)
        return NoEc2Fleet(run_id, args.no_ec2_reason)
    import boto3

    return Ec2Fleet(boto3.Session(), inventory.aws, run_id)


def _instance_agents(run_id, run_dir, inbox, aws, fleet):
    """A live run's instances: reached over SSH at the address EC2 reports (aws.address)."""
    from broker.shells.nodes import InstanceAgents

    if not aws.key:  # an inventory without types never launches: nothing to reach
        return None
    return InstanceAgents(run_id, run_dir, inbox, aws, address_of=lambda i: fleet.address_of(i, aws.address),
                          console_of=fleet.console_output)
