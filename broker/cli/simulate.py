"""``broker simulate``: a virtual-time run of a workload or a runtime trace under a policy."""

from __future__ import annotations

import json
import sys
import time


def register(sub) -> None:
    from broker.cli.plan import add_goal_arguments

    p = sub.add_parser(
        "simulate",
        help="virtual-time run of a workload model or a runtime trace under a policy",
        description="Run a bag in virtual time with the same controller a live run uses. "
        "Workloads: a YAML file or a built-in name (short, long, mixture, LS, LM, LL, bats).",
    )
    p.add_argument("--inventory", required=True, help="inventory YAML (only EC2 types and private nodes are used)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="workload YAML file or built-in name")
    src.add_argument("--runtimes", help="CSV with a runtime_s column (reference seconds), optional estimate_s")
    p.add_argument("--tasks", type=int, help="override the workload's number of tasks")
    p.add_argument("--policy", default="broker",
                   choices=["broker", "list", "rr", "bats", "firstfit", "1vm4all", "autoscale-idle", "adaptive", "batch",
                            "static", "panda"],
                   help="broker, or a baseline: List_eta, round robin, BaTS, FirstFit, 1VM4All, the Ray/Parsl "
                   "autoscaler (autoscale-idle), Dask Adaptive, AWS Batch, condor_annex (static), the thesis's PANDA")
    p.add_argument("--eta", type=int, help="List_eta: the number of most cost-efficient machines used")
    p.add_argument("--list-order", choices=["longest", "random"], default="longest",
                   help="List_eta: tasks longest first (default) or at random")
    p.add_argument("--idle-timeout", default="5m",
                   help="autoscale-idle: terminate an instance idle this long (Ray 5m, the default; Parsl 120s)")
    p.add_argument("--lease", default="50m", help="static: condor_annex's lease, renewed while work is left (50m)")
    p.add_argument("--tick", default="60s", help="monitoring interval (default 60s)")
    p.add_argument("--speed-noise", type=float, default=0.0, help="actual speed = declared x U(1-x, 1+x)")
    p.add_argument("--failure-rate", type=float, default=0.0, help="probability an attempt fails part-way")
    spot = p.add_argument_group("spot interruptions (types with market: spot)")
    spot.add_argument("--spot-rate", type=float, default=1.0, metavar="X",
                      help="x each spot type's interruptions_per_hour (default 1; 0: no interruptions)")
    spot.add_argument("--spot-notice", default="2m", metavar="DUR", help="EC2's notice before it interrupts (2m)")
    spot.add_argument("--spot-loss-at", metavar="DUR", help="a whole spot type is lost at this time")
    spot.add_argument("--spot-loss-rate", type=float, default=0.0, metavar="R",
                      help="... or at the events of a Poisson process of R an hour")
    spot.add_argument("--spot-loss-type", metavar="TYPE",
                      help="the type lost (e.g. c5.xlarge@spot; default: the spot type with most instances)")
    spot.add_argument("--spot-capacity-back", default="1h", metavar="DUR",
                      help="a lost type's launches are refused for capacity this long (1h)")
    spot.add_argument("--max-spot-attempts", type=int, default=2, metavar="N",
                      help="a task interrupted N times runs on on-demand or private nodes only (2)")
    add_goal_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from broker.cli import UsageError
    from broker.cli.plan import goal_from_args, promise_options
    from broker.cli.verdict import facts_of_simulation, judge
    from broker.core.units import format_duration, parse_duration
    from broker.config.inventory import load_inventory
    from broker.core.control.controller import ControllerConfig
    from broker.core.goal import Goal
    from broker.sim.engine import SimOptions, Simulation
    from broker.sim.workloads import WorkloadError, load_runtimes_csv, load_workload

    inventory = load_inventory(args.inventory)
    try:
        if args.workload:
            workload = load_workload(args.workload, args.seed, tasks=args.tasks)
        else:
            workload = load_runtimes_csv(args.runtimes)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    goal = goal_from_args(args) or Goal()  # no goal: the cheapest plan
    if args.policy == "list" and args.eta is None:
        raise UsageError("--policy list needs --eta K (the number of most cost-efficient machines)")
    try:
        tick_s = parse_duration(args.tick)
    except ValueError as exc:
        raise UsageError(f"--tick: {exc}") from None
    from broker.core.control.peers import PeerOptions

    try:
        peer = PeerOptions(idle_timeout_s=parse_duration(args.idle_timeout), lease_s=parse_duration(args.lease))
    except ValueError as exc:
        raise UsageError(f"--idle-timeout/--lease: {exc}") from None
    config = ControllerConfig(policy=args.policy, eta=args.eta, tick_s=tick_s, peer=peer, list_order=args.list_order,
                              **promise_options(args))
    options = SimOptions(seed=args.seed, speed_noise=args.speed_noise, failure_rate=args.failure_rate,
                         spot=spot_faults_from_args(args, inventory),
                         failures=spot_policy_from_args(args))
    progress = ProgressView()
    try:
        result = Simulation(inventory, workload, goal, config, options).run(on_progress=progress)
    finally:
        progress.close()
    verdict = judge(goal.kind, goal.value, facts_of_simulation(result))
    if args.json:
        document = result.to_json()
        document["goal"] = {"met": verdict.met, "summary": verdict.summary, "causes": list(verdict.causes)}
        print(json.dumps(document))
        return 0 if verdict.met else 1
    r = result
    out = sys.stdout
    print(f"policy {r.policy}: {r.tasks_done}/{r.tasks_total} tasks in {format_duration(r.makespan_s)} "
          f"for ${r.cost_usd:.2f} (cloud ${r.cloud_cost_usd:.2f}, private ${r.private_cost_usd:.2f})", file=out)
    if r.planned_makespan_s is not None:
        print(f"planned: {format_duration(r.planned_makespan_s)} for ${r.planned_cost_usd:.2f}", file=out)
    if r.promise is not None:
        print(f"promised: {r.promise.text()}", file=out)
    if r.budget_usd is not None:
        print(f"budget ${r.budget_usd:.2f}: peak committed ${r.max_committed_usd:.2f}"
              + (" (stopped for budget)" if r.budget_stopped else ""), file=out)
    print(f"instances launched {r.instances_launched}, at most {r.max_concurrent} at once; "
          f"samples {r.samples}; simulated in {r.sim_wall_s:.2f}s", file=out)
    if r.spot is not None:
        sp, by = r.spot, r.spot["cost_usd_by_market"]
        print(f"spot: {sp['interruptions']} interruptions ({sp['notices']} notices), {sp['attempts_interrupted']} "
              f"attempts interrupted, {sp['lost_work_ref_s'] / 3600:.2f} ref-h of work lost, {sp['fallback_tasks']} "
              f"tasks moved to on-demand; spent ${by['spot']:.2f} on spot, ${by['on-demand']:.2f} on-demand",
              file=out)
        for name, rate in sp.get("rates", {}).items():
            if rate["interruptions"]:
                print(f"  {name}: {rate['interruptions']} interruptions in {rate['instance_hours']:.2f} instance-h: "
                      f"{rate['learned_per_hour']:.3g}/h learned (declared {rate['declared_per_hour']:.3g}/h)", file=out)
    if r.tasks_left:
        print(f"{r.tasks_left} tasks left unfinished", file=out)
    print(verdict.text(), file=out)
    return 0 if verdict.met else 1


def spot_faults_from_args(args, inventory):
    """The simulator's spot options (``--spot-*``), checked against the inventory."""
    from broker.cli import UsageError
    from broker.core.units import parse_duration
    from broker.sim.spot import SpotFaults

    try:
        notice = parse_duration(args.spot_notice)
        back = parse_duration(args.spot_capacity_back)
        at = None if args.spot_loss_at is None else parse_duration(args.spot_loss_at)
    except ValueError as exc:
        raise UsageError(f"--spot-notice/--spot-loss-at/--spot-capacity-back: {exc}") from None
    spot_types = sorted(t.name for t in inventory.types if t.is_spot)
    if args.spot_loss_type is not None and args.spot_loss_type not in spot_types:
        raise UsageError(f"--spot-loss-type {args.spot_loss_type!r} is not a spot type of the inventory "
                         f"(spot types: {', '.join(spot_types) or 'none'})")
    if (at is not None or args.spot_loss_rate > 0) and not spot_types:
        raise UsageError("--spot-loss-at/--spot-loss-rate: the inventory has no spot type (market: spot)")
    try:
        return SpotFaults(rate_scale=args.spot_rate, notice_s=notice, loss_at_s=at,
                          loss_rate_per_hour=args.spot_loss_rate, loss_type=args.spot_loss_type,
                          capacity_back_after_s=back)
    except ValueError as exc:
        raise UsageError(f"--spot-*: {exc}") from None


def spot_policy_from_args(args):
    from broker.cli import UsageError
    from broker.core.control.failures import FailurePolicy

    try:
        return FailurePolicy(max_spot_attempts=args.max_spot_attempts)
    except ValueError as exc:
        raise UsageError(f"--max-spot-attempts: {exc}") from None


class ProgressView:
    """Simulation progress on stderr: a live bar on a terminal (redrawn at most five times a
    second; log lines print above it), else a ``sim.progress`` event each time another tenth of
    the bag is done. stdout is left to the result (``--json`` prints exactly one object there)."""

    def __init__(self, stream=None, clock=time.monotonic) -> None:
        from broker.cli.terminal import ProgressBoard, is_terminal

        stream = sys.stderr if stream is None else stream
        self.tty = is_terminal(stream)
        self.board = ProgressBoard(stream) if self.tty else None
        self.clock = clock
        self.drawn_at = -float("inf")
        self.logged_tenths = 0

    def __call__(self, p) -> None:
        from broker.core.units import format_duration

        if self.board is not None:
            now = self.clock()
            if now - self.drawn_at < 0.2 and p.done < p.total:
                return
            self.drawn_at = now
            if not self.board.tasks:
                self.board.bar("sim", "simulating", p.total)
                self.board.start()
            self.board.update("sim", completed=p.done, total=p.total, count=f"{p.done:,}/{p.total:,}",
                              info=f"{format_duration(p.virtual_s)} of virtual time, ${p.committed_usd:,.2f} committed")
            return
        tenths = (10 * p.done) // max(p.total, 1)
        if tenths > self.logged_tenths and p.done < p.total:
            import structlog

            self.logged_tenths = tenths
            structlog.get_logger().info("sim.progress", done=p.done, total=p.total, virtual_s=round(p.virtual_s, 1),
                                        committed_usd=round(p.committed_usd, 4))

    def close(self) -> None:
        if self.board is not None:
            self.board.stop()
