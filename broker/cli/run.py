"""``broker run``: execute a bag, on EC2 or (``--dry-run``) on moto and local agents.

    broker run --inventory INV BAG [--deadline DUR | --budget USD | --point K | --theta X]
               [--run-dir DIR] [--dry-run] [--yes] [--time-scale K] [--tick DUR] [--json-report]

The plan table (the front, the chosen point marked) is printed when the first plan is
solved, before any money is spent; the first launch asks "Launch N instances (~$X)?" unless
``--yes``. Without a terminal and without ``--yes`` the command refuses at once (exit 2).
Exit status: 0 when every task is done, 1 when the run ended with tasks left or failed.
"""

from __future__ import annotations

import argparse
import json
import queue
import secrets
import signal
import sys
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from broker.cli import UsageError
from broker.cli.plan import add_goal_arguments, goal_from_args
from broker.config.durations import format_duration, parse_duration

DRY_RUN_TIME_SCALE = 60.0
RUNS_DIR = Path("runs")
EVENTS_FILE = "events.jsonl"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a bag: plan, confirm, launch, dispatch, release (--dry-run: moto + local agents)",
        description="Run a bag of tasks within a goal. The plan table is printed before anything is "
        "spent. Resuming an interrupted run is not built yet: `broker down RUN_DIR` releases what it "
        "holds.",
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
    inventory = load_inventory(args.inventory, live=not args.dry_run)
    bag = load_bag(args.bag)
    if not args.dry_run and inventory.types:
        raise UsageError("a live run on EC2 instances needs their SSH bootstrap, which is not built yet: "
                         "use --dry-run, or an inventory without aws types")

    run_dir = Path(args.run_dir) if args.run_dir else None
    from broker.shells.journal import JOURNAL_FILE, Journal

    if run_dir is not None and (run_dir / JOURNAL_FILE).is_file():
        existing = Journal.open(run_dir, readonly=True)
        try:
            record = existing.run()
        finally:
            existing.close()
        if record is not None:
            if record.state != "running":
                raise UsageError(f"run {record.id} in {run_dir} already ended ({record.state}); "
                                 "start a new run directory to run again")
            raise UsageError(f"{run_dir} holds the unfinished run {record.id}: resuming a run is not "
                             f"built yet; `broker down {run_dir}` releases what it holds")
    run_id = new_run_id()
    run_dir = run_dir or RUNS_DIR / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s)


def _execute(args, inventory, bag, goal, run_id, run_dir, scale, tick_s, margin_s) -> int:
    import structlog

    import broker.core.plan  # noqa: F401 - pulp's import is paid before the run clock starts
    from broker.core.control.controller import ControllerConfig
    from broker.shells.aws import Ec2Fleet
    from broker.shells.clock import RunClock
    from broker.shells.daemon import Daemon, DaemonOptions
    from broker.shells.journal import Journal
    from broker.shells.logging import configure_logging
    from broker.shells.nodes import LocalAgents, SshAgents

    with ExitStack() as stack:
        events = stack.enter_context(open(run_dir / EVENTS_FILE, "a", encoding="utf-8"))
        configure_logging(level=args.log_level, extra_files=[events], bind={"run_id": run_id})
        stack.callback(configure_logging, level=args.log_level)  # stop writing to the closed file
        if args.dry_run:
            from broker.shells.moto_world import mock_ec2

            client, settings = stack.enter_context(mock_ec2(inventory.aws, run_id))
            fleet = Ec2Fleet(client, settings, run_id)
        else:
            import boto3

            fleet = Ec2Fleet(boto3.Session(), inventory.aws, run_id)
        # The run's time starts once the set-up above is done (at K = 1800 a second of moto
        # set-up would be half an hour of billing).
        clock = RunClock(scale)
        if args.metrics_port is not None:  # before the journal: a port in use leaves no run behind
            from broker.shells.metrics import MetricsUnavailable, serve_metrics

            try:
                metrics = serve_metrics(run_dir, args.metrics_port, now_s=clock.epoch_s)
            except MetricsUnavailable as exc:
                raise UsageError(str(exc)) from None
            stack.callback(metrics.close)
            structlog.get_logger().info("metrics.serving", host=metrics.host, port=metrics.port, url=metrics.url)
        journal = stack.enter_context(Journal.open(run_dir, clock=clock.epoch_s))
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

        def private_agent(node):
            return local.attach(node.name, node.slots) if node.local else remote.attach(node)

        def stop_private(name, client):
            node = next(p for p in inventory.private if p.name == name)
            (local.stop(name, client) if node.local else remote.stop(name, client))

        printer = _Printer(inventory, len(bag.tasks), args.yes, json_report=args.json_report)
        printer.budget_usd = goal.value if goal.kind == "budget" else None
        daemon = Daemon(
            inventory, bag, goal,
            DaemonOptions(run_dir=run_dir, run_id=run_id, dry_run=args.dry_run, tick_s=tick_s),
            journal=journal, clock=clock, fleet=fleet, instance_agents=local,
            private_agents=private_agent, stop_private_agent=stop_private, inbox=inbox,
            config=ControllerConfig(tick_s=tick_s, margin_s=margin_s),
            confirm=printer.confirm, on_first_plan=printer.show_plan, on_progress=printer.progress,
        )
        previous = {sig: signal.signal(sig, lambda *_: daemon.request_stop("user_stop"))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(f"run {run_id} in {run_dir} ({'dry run, ' if args.dry_run else ''}time scale {scale:g}, "
                  f"{len(bag.tasks)} tasks)", file=printer.out, flush=True)
            report = daemon.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        structlog.get_logger().debug("run.report", **report.to_json())
    if args.json_report:
        print(json.dumps(report.to_json()))
    else:
        from broker.cli.report import print_report

        print_report(run_dir)
    if report.stop_reason == "declined":
        return 1
    return 0 if report.tasks_done == report.tasks_total else 1


class _Printer:
    """What the user sees on stdout: the plan table, the launch question, progress lines."""

    def __init__(self, inventory, total: int, yes: bool, json_report: bool) -> None:
        self.inventory = inventory
        self.yes = yes
        self.every = max(1, total // 10)
        self.out = sys.stderr if json_report else sys.stdout
        self.plan_shown = False
        self.width = 0
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
            text = progress_text(phase, done, failed, total, committed_usd, self.budget_usd)
            print("\r" + text.ljust(self.width), end="\n" if last else "", file=self.out, flush=True)
            self.width = len(text)
        elif done % self.every == 0 or last:
            print(f"progress: {done}/{total} done, {failed} failed, ${committed_usd:.2f} committed"
                  + (" (sampling)" if phase == "sampling" else ""), file=self.out, flush=True)
