"""``broker plan``: the Pareto front of makespan against cost for a bag, and the chosen point.

    broker plan --inventory INV [BAG | --tasks N --mean-runtime DUR [--runtime-sd DUR]]
                [--deadline DUR | --budget USD | --point K | --theta X]
                [--policy broker|bats] [--json] [--plot FILE.png]

The work planned for is the point estimate plus 1.645 standard deviations of the sum of the
task runtimes (sd x sqrt(n): a one-sided 95% upper value when runtimes are independent).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Sequence

from broker.cli import UsageError
from broker.config.durations import format_duration, parse_duration
from broker.core.plan import (
    Goal,
    NoFeasiblePlan,
    Plan,
    Work,
    bats_configuration,
    pareto_front,
    plan_for_goal,
)

# One-sided 95% normal quantile for the upper value of the total work.
_UPPER_Z = 1.645
_NO_ESTIMATES = (
    "this bag has no estimate columns: give --mean-runtime, or sample (--sample, coming with estimation)"
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print the makespan/cost Pareto front and the plan for a goal",
        description="Plan the fleet for a bag: the Pareto front of makespan against cost, "
        "with the point meeting your goal marked. Nothing is launched.",
    )
    p.add_argument("--inventory", required=True, metavar="INV", help="inventory file (YAML)")
    p.add_argument("bag", nargs="?", help="bag file; its estimate columns give the runtimes")
    p.add_argument("--tasks", type=int, metavar="N", help="number of tasks (instead of a bag)")
    p.add_argument("--mean-runtime", metavar="DUR", help="mean task runtime on a speed-1 slot, e.g. 10m")
    p.add_argument("--runtime-sd", metavar="DUR", help="standard deviation of a task's runtime")
    add_goal_arguments(p)
    p.add_argument("--policy", choices=("broker", "bats"), default="broker",
                   help="broker: the front and the ILP (default); bats: BaTS's configuration (needs --budget)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="draw the front with the chosen point (matplotlib)")
    p.set_defaults(func=run)


def add_goal_arguments(parser: argparse.ArgumentParser) -> None:
    """The goal flags ``plan``, ``simulate`` and ``run`` share (at most one of them)."""
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--deadline", metavar="DUR", help="finish within this time at least cost (e.g. 6h)")
    goal.add_argument("--budget", metavar="USD", help="finish as soon as possible spending at most this")
    goal.add_argument("--point", metavar="K", help="the K-th row of the printed front")
    goal.add_argument("--theta", metavar="X", help="weight 0..1 between time (0, fastest) and cost (1, cheapest)")


def goal_from_args(args: argparse.Namespace) -> Goal | None:
    """The goal the flags name, or None; bad values raise UsageError."""
    if getattr(args, "deadline", None) is not None:
        try:
            seconds = parse_duration(args.deadline)
        except ValueError as exc:
            raise UsageError(f"--deadline: {exc}") from None
        if seconds <= 0:
            raise UsageError("--deadline: must be more than 0 seconds")
        return Goal("deadline", seconds)
    if getattr(args, "budget", None) is not None:
        return Goal("budget", _number("--budget", args.budget.lstrip("$"), 0.0, math.inf))
    if getattr(args, "point", None) is not None:
        value = _number("--point", args.point, 1.0, math.inf)
        if value != int(value):
            raise UsageError(f"--point: a row number of the front (1, 2, ...), got {args.point!r}")
        return Goal("point", value)
    if getattr(args, "theta", None) is not None:
        return Goal("theta", _number("--theta", args.theta, 0.0, 1.0))
    return None


def _number(flag: str, text: str, lo: float, hi: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a number, got {text!r}") from None
    if not (lo <= value <= hi) or math.isnan(value):
        raise UsageError(f"{flag}: must be between {lo:g} and {hi:g}, got {text!r}")
    return value


def work_from_args(args: argparse.Namespace) -> Work:
    """Work from a bag's estimate columns, or from --tasks and --mean-runtime."""
    mean_s = _duration("--mean-runtime", args.mean_runtime)
    sd_s = _duration("--runtime-sd", args.runtime_sd) or 0.0
    if args.bag and args.tasks is not None:
        raise UsageError("give a bag or --tasks, not both")
    if args.bag:
        from broker.config.bag import load_bag

        bag = load_bag(args.bag)
        n = len(bag)
        per_task = [statistics.fmean(t.estimates_s.values()) for t in bag.tasks if t.estimates_s]
        if per_task and mean_s is None:
            mean_s = statistics.fmean(per_task)
            if args.runtime_sd is None and len(per_task) > 1:
                sd_s = statistics.stdev(per_task)
        elif mean_s is None:
            raise UsageError(_NO_ESTIMATES)
    else:
        if args.tasks is None or mean_s is None:
            raise UsageError("give a bag, or --tasks N with --mean-runtime DUR")
        if args.tasks < 1:
            raise UsageError(f"--tasks: must be at least 1, got {args.tasks}")
        n = args.tasks
    planned = n * mean_s + _UPPER_Z * sd_s * math.sqrt(n)
    return Work(total_ref_s=planned, tasks=n, mean_ref_s=mean_s, sd_ref_s=sd_s)


def _duration(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import structlog

    from broker.config.inventory import load_inventory

    goal = goal_from_args(args)
    work = work_from_args(args)
    inventory = load_inventory(args.inventory)
    types, private = inventory.types, inventory.private
    chosen: Plan | None = None
    reason: str | None = None
    front: list[Plan] = []
    if args.policy == "bats":
        if goal is None or goal.kind != "budget":
            raise UsageError("the bats policy plans for a budget: give --budget USD")
        per_type_s = {t.name: work.mean_ref_s / t.speed for t in types}
        try:
            chosen = bats_configuration(types, work.tasks, per_type_s, goal.value)
            front = [chosen]
        except NoFeasiblePlan as exc:
            reason = str(exc)
    else:
        try:
            front = pareto_front(types, private, work)
            if goal is not None:
                chosen = plan_for_goal(types, private, work, goal, front=front)
        except NoFeasiblePlan as exc:
            reason = str(exc)
        except ValueError as exc:  # a point that is not on the front
            raise UsageError(str(exc)) from None
    solve_ms = sum(p.solve_ms for p in front) + (chosen.solve_ms if chosen and chosen not in front else 0.0)
    log = structlog.get_logger()
    if chosen is not None:
        log.info("plan.solved", policy=args.policy, goal=goal.describe() if goal else None,
                 makespan_s=round(chosen.makespan_s, 1), cost_usd=round(chosen.cost_usd, 4),
                 fleet={k: v for k, v in chosen.fleet.items() if v}, status=chosen.status,
                 front_points=len(front), solve_ms=round(solve_ms, 1))
    else:
        log.info("plan.solved", policy=args.policy, goal=goal.describe() if goal else None,
                 front_points=len(front), solve_ms=round(solve_ms, 1), reason=reason)

    if args.plot:
        _plot(front, chosen, args.plot)
    if args.json:
        print(json.dumps({
            "work": {"tasks": work.tasks, "mean_ref_s": work.mean_ref_s,
                     "total_ref_s": work.tasks * work.mean_ref_s, "planned_ref_s": work.total_ref_s},
            "front": [p.row() for p in front],
            "chosen": chosen.row() if chosen else None,
            "solve_ms": round(solve_ms, 3),
        }))
        if reason:
            print(f"broker plan: {reason}", file=sys.stderr)
    else:
        print(render_table(work, types, front, chosen))
        if reason:
            print(f"cannot meet {goal.describe() if goal else 'the goal'}: {reason}")
    return 1 if reason else 0


def render_table(work: Work, types: Sequence, front: Sequence[Plan], chosen: Plan | None) -> str:
    """The front as rows: index, makespan, cost, machines per type (with billing), status."""
    lines = [
        f"work: {work.tasks} tasks x {format_duration(work.mean_ref_s)} mean on a speed-1 slot = "
        f"{work.tasks * work.mean_ref_s:.0f} ref-s; planned for {work.total_ref_s:.0f} ref-s"
    ]
    rows = [(str(k), p) for k, p in enumerate(front, 1)]
    if chosen is not None and not any(p is chosen for _, p in rows):
        rows.append(("-", chosen))
        rows.sort(key=lambda r: (r[1].makespan_s, r[1].cost_usd))
    names = [t.name for t in types]
    header = ["", "#", "makespan", "cost"] + [f"{t.name} ({t.billing.describe()})" for t in types]
    header += ["private", "status"]
    table = [header]
    for label, p in rows:
        shares = list(p.private_share.values())
        private = f"{100 * statistics.fmean(shares):.0f}%" if shares else "-"
        table.append(["*" if p is chosen else "", label, format_duration(p.makespan_s), f"${p.cost_usd:.2f}"]
                     + [str(p.fleet.get(n, 0)) for n in names] + [private, p.status])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) if c < 2 else cell.rjust(w) for c, (cell, w) in
                               enumerate(zip(row, widths))).rstrip())
    if not front:
        lines.append("(no plan)")
    return "\n".join(lines)


def _plot(front: Sequence[Plan], chosen: Plan | None, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'hybrid-broker[plot]'") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.makespan_s / 3600 for p in front], [p.cost_usd for p in front], "o-", label="Pareto front")
    if chosen is not None:
        ax.plot([chosen.makespan_s / 3600], [chosen.cost_usd], "r*", markersize=16, label="chosen")
    ax.set_xlabel("makespan (hours)")
    ax.set_ylabel("cost (USD)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
