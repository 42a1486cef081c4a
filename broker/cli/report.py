"""``broker report RUN_DIR [--json] [--plot FILE.png]``: what a run delivered against its plan.

Read from the run directory alone (the journal, read-only), so it works for a finished run,
a stopped one, and one still running (figures so far). ``broker run`` prints the same report
when it ends.

- proposed vs delivered makespan and cost with the deviation, as in the thesis's Table 6.6
  (proposed: the first plan adopted, the one the user confirmed; delivered: the last task's
  end and the committed spend);
- cost per instance type, and the private nodes' cost;
- utilization per type: busy slot-time over the slot-time instances were up (launch to
  termination), private nodes from joining to the run's end;
- tasks done, failed (each with the error of every attempt) and left; samples used;
- ``--json``: one JSON object (shape in :func:`build`); ``--plot``: the first plan's Pareto
  front (re-solved from the run's inventory), the proposed and the delivered points, and the
  utilization per type (matplotlib, ``pip install 'hybrid-broker[plot]'``).

All times are run time (at a dry run's time scale K, tasks look K times longer than they ran).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from broker.cli import UsageError
from broker.cli.terminal import goal_text, promise_figures, promise_text
from broker.core.units import format_duration
from broker.shells.spot_figures import spot_figures, spot_line
from broker.shells.journal import JOURNAL_FILE, Journal, JournalError
from broker.shells.metrics import anchor_s, figures, run_now_s
from broker.shells.node_view import node_rows


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="proposed vs delivered makespan and cost, cost and utilization per type, failures",
        description="Report what a run delivered against its plan, from its run directory (read-only).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds journal.sqlite)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the front, the proposed and delivered points, and "
                   "utilization per type (matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    try:
        journal = Journal.open(run_dir, readonly=True)
    except JournalError as exc:
        raise UsageError(str(exc)) from None
    with journal:
        report = build(journal, run_dir)
    if report is None:
        raise UsageError(f"{run_dir / JOURNAL_FILE} holds no run yet")
    if args.plot:
        plot(report, run_dir, args.plot)
    print(json.dumps(report) if args.json else render(report))
    return 0


def first_promise(plans, start_s: float) -> dict[str, Any] | None:
    """The first promise with an interval the run made for its goal (the forecast a plan
    carries: its median and its interval of makespan from the run's start and of cost), with
    when it was made and whether it is the first plan's (a bag without estimates gets its
    first after 30 runtimes)."""
    for k, (at, _, fields) in enumerate(plans):
        promise = fields.get("promise")
        if isinstance(promise, dict) and promise.get("makespan_s_range") and promise.get("cost_usd_range"):
            return {**promise_figures(promise), "made_at_s": round(at - start_s, 3), "of_first_plan": k == 0,
                    "text": fields.get("promise_text")}  # as `broker status` and the run's console say it
    return None


def deviation_pct(delivered: float | None, planned: float | None) -> float | None:
    if delivered is None or planned is None or planned <= 0:
        return None
    return round(100.0 * (delivered - planned) / planned, 2)


def build(journal: Journal, run_dir: Path, now_s: float | None = None) -> dict[str, Any] | None:
    """The report as a JSON-ready dict; None when the journal holds no run."""
    record = journal.run()
    if record is None:
        return None
    now = now_s if now_s is not None else run_now_s(record, time.time())
    fig = figures(journal, now)
    start = anchor_s(record)
    end = record.ended_at_s if record.ended_at_s is not None else now
    status = fig.overview.status
    done_events = journal.events("run.done")
    first_plans = journal.goal_plans()  # the promise: the first plan for the run's (last) goal
    first = first_plans[0][2] if first_plans else {}
    planned = {"makespan_s": first.get("makespan_s"), "cost_usd": first.get("cost_usd")}
    if done_events:
        last = done_events[-1][2]
        delivered = {"makespan_s": last["makespan_s"], "cost_usd": last["cost_usd"]}
    else:  # still running, or killed: the last successful attempt's end and the spend so far
        delivered = {"makespan_s": _last_done_s(run_dir, start), "cost_usd": round(status["committed_usd"], 6)}
    by_type: dict[str, float] = defaultdict(float)
    for inst in fig.overview.fleet:
        by_type[inst.type_name] += inst.committed_usd(end)
    private_usd = journal.committed_usd(end) - sum(by_type.values())
    failed = [{"task": task, "attempts": len(errors), "errors": errors} for task, errors in sorted(fig.failures.items())]
    for row in _noted_failures(run_dir):  # failed without a task.failed event (e.g. its node was lost)
        if row["task"] not in fig.failures:
            failed.append(row)
    quarantined = {f["task"]: f for _, _, f in journal.events("task.quarantined")}
    for row in failed:  # why the broker gave up, and the task's own last words
        q = quarantined.get(row["task"])
        if q is not None:
            row["quarantined"] = q.get("reason", "")
            row["stderr_tail"] = q.get("stderr_tail", "")
    budget_stops = journal.events("budget.stop")
    tasks = status["tasks"]
    stop_reason = _stop_reason(journal, record.state, bool(budget_stops))
    if tasks["left"] > 0:
        # What a partial run delivered is no makespan or cost of the bag: a deviation from the
        # plan (which covers the whole bag) would read as a result (-34.7% for a stopped run).
        deviation = {"makespan": None, "cost": None}
    else:
        deviation = {"makespan": deviation_pct(delivered["makespan_s"], planned["makespan_s"]),
                     "cost": deviation_pct(delivered["cost_usd"], planned["cost_usd"])}
    return {
        "run_id": record.id,
        "state": record.state,
        "stop_reason": stop_reason,
        "goal": {"kind": record.goal_kind, "value": record.goal_value},
        "tasks": {"total": tasks["total"], "done": tasks["done"], "failed": tasks["failed"], "left": tasks["left"]},
        "samples": fig.samples,
        "instances_launched": len(fig.overview.fleet),
        "planned": planned,
        "promise": promise_figures(first) if first else None,
        "first_promise": first_promise(first_plans, start),
        "delivered": delivered,
        "deviation_pct": deviation,
        "cost_by_type_usd": {k: round(v, 6) for k, v in sorted(by_type.items())},
        "private_cost_usd": round(max(private_usd, 0.0), 6),
        "utilization_by_type": utilization(run_dir, journal, end),
        "failed_tasks": failed,
        "nodes": nodes_lost(journal, run_dir, start) | {"list": node_rows(journal, end, start)},
        "time_scale": float(record.options.get("time_scale", 1.0)),
        "budget_stopped": bool(budget_stops),
        "first_plan": first,
        # what resumes changed: the bag (kept, new, dropped, redone) and the goal
        "resumed_with": [text for _, text in sorted(
            [(at, f["summary"]) for at, _, f in journal.events("run.bag_changed")]
            + [(at, f"goal {f['before']} -> {f['after']}") for at, _, f in journal.events("run.goal_changed")])],
        "first_plan_at_s": round(first_plans[0][0] - start, 3) if first_plans else None,
        "inventory_path": record.inventory_path,
        # spot interruptions: counts, lost work, the on-demand fallback (None: no spot instance)
        "spot": spot_figures(journal, run_dir, dict(by_type)),
    }


def _stop_reason(journal: Journal, state: str, budget_stopped: bool) -> str | None:
    """Why the run ended short of its bag: the last stop since the last resume (a run left with
    --on-stop leave and resumed to the end was 'finished (user_stop)'); none when it finished."""
    if state == "finished":
        return None
    resumed = [at for at, _, _ in journal.events("run.resume")]
    since = resumed[-1] if resumed else -float("inf")
    stops = [f.get("reason") for at, _, f in journal.events("run.stop") if at >= since]
    if stops:
        return stops[-1]
    return "budget_stop" if budget_stopped else None


def _db(run_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{(run_dir / JOURNAL_FILE).resolve().as_posix()}?mode=ro", uri=True)


def _last_done_s(run_dir: Path, start_s: float) -> float | None:
    db = _db(run_dir)
    try:
        (last,) = db.execute("SELECT max(ended_at) FROM attempts WHERE outcome = 'ok'").fetchone()
    finally:
        db.close()
    return None if last is None else round(last - start_s, 3)


# What takes a node out of a run (its reason field says why), and what brings it back.
_NODE_GONE = ("node.lost", "node.quarantined", "node.setup_failed")
_NODE_BACK = ("node.ready", "agent.reattached", "instance.ready")


def nodes_lost(journal: Journal, run_dir: Path, start_s: float) -> dict[str, Any]:
    """The nodes a run lost (its agent could not start or be reached again, an instance gone,
    a bad node, a failed setup) and had not back at the end, with when and why; those lost
    that came back (``rejoined``); and the private nodes it was given."""
    events = sorted(((at, name, f) for name in _NODE_GONE + _NODE_BACK for at, _, f in journal.events(name)),
                    key=lambda e: e[0])
    lost: dict[str, dict[str, Any]] = {}
    rejoined: set[str] = set()
    for at, name, f in events:
        node = f.get("node") or f.get("instance_id")
        if node is None:
            continue
        if name in _NODE_GONE:
            lost[node] = {"node": node, "at_s": round(at - start_s, 3), "reason": str(f.get("reason", name))}
            if f.get("refused"):  # it refused us at start (host key, our key): not retried
                lost[node]["refused"] = True
        elif node in lost:
            rejoined.add(node)
            del lost[node]
    db = _db(run_dir)
    try:
        private = [name for (name,) in db.execute("SELECT name FROM private_nodes ORDER BY rowid")]
    finally:
        db.close()
    for row in lost.values():
        row["private"] = row["node"] in private
    return {"private": private, "lost": sorted(lost.values(), key=lambda r: r["at_s"]),
            "rejoined": sorted(rejoined)}


def _nodes_lines(report: dict[str, Any]) -> list[str]:
    """The nodes lost (human report); a finished run that ended on fewer private nodes than it
    was given says so (the run still succeeded: exit 0)."""
    nodes = report.get("nodes") or {}
    lines = [_node_line(n, report["state"] == "running") for n in nodes.get("list", [])]
    lines += [f"  node {'refused' if n.get('refused') else 'lost'}: {n['node']} at "
              f"{format_duration(max(0.0, n['at_s']))} ({n['reason']})" for n in nodes.get("lost", [])]
    given = nodes.get("private", [])
    gone = [f"{n['node']} {'refused' if n.get('refused') else 'lost'}" for n in nodes.get("lost", []) if n.get("private")]
    if "list" in nodes:  # also those never reached (still tried when the bag was done)
        gone = [f"{n['node']} {_SHORT[n['state']]}" for n in nodes["list"] if n["state"] in _SHORT
                and not (n["state"] in ("starting", "waiting") and (n["done"] or n["last_heard_s"] is not None))]
    if gone and report["state"] == "finished":
        lines.append(f"  finished on {len(given) - len(gone)} of the {len(given)} private nodes it was given "
                     f"({', '.join(gone)})")
    if nodes.get("rejoined"):
        lines.append(f"  rejoined after being lost: {', '.join(nodes['rejoined'])}")
    return lines


# A private node's state (node_view) that means the run finished without it, as the report says it.
_SHORT = {"starting": "never reached", "waiting": "never reached", "lost": "lost", "refused": "refused",
          "quarantined": "quarantined"}


def _node_line(n: dict[str, Any], running: bool) -> str:
    """One private node: ``node h0: up, 2 slots, 6 tasks done, last heard 1s before the end``."""
    heard = "never heard from" if n["last_heard_ago_s"] is None else \
        f"last heard {format_duration(n['last_heard_ago_s'])} {'ago' if running else 'before the end'}"
    return (f"  node {n['node']}: {n['state']}, {n['slots']} slot{'s' if n['slots'] != 1 else ''}, "
            f"{n['done']} task{'s' if n['done'] != 1 else ''} done, {heard}")


def _noted_failures(run_dir: Path) -> list[dict[str, Any]]:
    db = _db(run_dir)
    try:
        rows = db.execute("SELECT id, failures, note FROM tasks WHERE state IN ('failed', 'quarantined')"
                          " ORDER BY rowid").fetchall()
    finally:
        db.close()
    return [{"task": t, "attempts": n, "errors": [note or "no error recorded"]} for t, n, note in rows]


def utilization(run_dir: Path, journal: Journal, end_s: float) -> dict[str, float]:
    """Busy slot-time over up slot-time, per instance type (and ``private`` for owned nodes)."""
    slots = {f["instance_id"]: f["slots"] for _, _, f in journal.events("instance.ready")}
    type_slots = {}
    node_type: dict[str, str] = {}
    up: dict[str, float] = defaultdict(float)
    for inst in journal.instances(end_s):
        node_type[inst.id] = inst.type_name
        n = slots.get(inst.id)
        if n is not None:
            type_slots[inst.type_name] = n
    for inst in journal.instances(end_s):
        n = slots.get(inst.id, type_slots.get(inst.type_name))
        if n is not None:
            stop = inst.terminated_at_s if inst.terminated_at_s is not None else end_s
            up[inst.type_name] += n * max(0.0, stop - inst.launched_at_s)
    db = _db(run_dir)
    try:
        for name, n, joined in db.execute("SELECT name, slots, joined_at FROM private_nodes"):
            node_type[name] = "private"
            up["private"] += n * max(0.0, end_s - joined)
        busy: dict[str, float] = defaultdict(float)
        for node, started, ended in db.execute(
            "SELECT node, started_at, coalesce(ended_at, ?) FROM attempts WHERE started_at IS NOT NULL", (end_s,)
        ):
            kind = node_type.get(node)
            if kind is not None:
                busy[kind] += max(0.0, min(ended, end_s) - started)
    finally:
        db.close()
    return {k: round(min(busy[k] / up[k], 1.0), 4) for k in sorted(up) if up[k] > 0}


def render(report: dict[str, Any]) -> str:
    """Planned against delivered (thesis Table 6.6 style), then costs, utilization, tasks."""
    def row(name: str, key: str, fmt) -> str:
        p, d = report["planned"][key], report["delivered"][key]
        dev = report["deviation_pct"]["makespan" if key == "makespan_s" else "cost"]
        return (f"  {name:<10} {fmt(p) if p is not None else '-':>12} {fmt(d) if d is not None else '-':>12} "
                f"{f'{dev:+.1f}%' if dev is not None else '-':>10}")

    tasks = report["tasks"]
    goal = report.get("goal") or {}
    lines = [
        f"run {report['run_id']}: {report['state']}" + (f" ({report['stop_reason']})" if report["stop_reason"] else "")
        + (f", goal {goal_text(goal.get('kind'), goal.get('value'))}" if goal else ""),
        f"  {'':<10} {'proposed':>12} {'delivered':>12} {'deviation':>10}",
        row("makespan", "makespan_s", format_duration),
        row("cost", "cost_usd", lambda v: f"${v:.2f}"),
        f"  tasks: {tasks['done']} done, {tasks['failed']} failed, {tasks['left']} left of {tasks['total']}; "
        f"{report['samples']} samples",
        f"  instances launched: {report['instances_launched']}"
        + ("; budget stop" if report["budget_stopped"] else ""),
    ]
    lines += [f"  resumed with an edit: {change}" for change in report.get("resumed_with", ())]
    if tasks["left"] > 0:
        lines.insert(4, f"  (no deviation: {tasks['left']} task{'s' if tasks['left'] != 1 else ''} left, so what "
                        "was delivered is not the bag's makespan or cost)")
    promise = report.get("promise") or {}
    interval = report.get("first_promise")
    if "makespan_s_range" in promise or "cost_usd_range" in promise:
        lines.insert(4, f"  promised  {promise_text(promise)}")
    elif interval:  # the forecast's median and interval (the plan's own figures are "proposed")
        when = "by the first plan" if interval["of_first_plan"] else \
            f"first made {format_duration(interval['made_at_s'])} into the run"
        lines.insert(4, f"  promised  {interval.get('text') or promise_text(interval)} ({when})")
    for name, usd in report["cost_by_type_usd"].items():
        util = report["utilization_by_type"].get(name)
        lines.append(f"  cost {name}: ${usd:.4f}" + (f", utilization {100 * util:.0f}%" if util is not None else ""))
    if report["private_cost_usd"] > 0 or "private" in report["utilization_by_type"]:
        util = report["utilization_by_type"].get("private")
        lines.append(f"  private nodes: ${report['private_cost_usd']:.4f}"
                     + (f", utilization {100 * util:.0f}%" if util is not None else ""))
    for f in report["failed_tasks"]:
        lines.append(f"  failed {f['task']} after {f['attempts']} attempt{'s' if f['attempts'] != 1 else ''}: "
                     f"{f['errors'][-1]}")
        if f.get("quarantined"):
            lines.append(f"    quarantined: {f['quarantined']}")
        stderr = [line for line in (f.get("stderr_tail") or "").splitlines() if line.strip()]
        if stderr:
            lines.append(f"    last stderr: {stderr[-1][-200:]}")
    spot = spot_line(report.get("spot"), format_duration)
    if spot:
        lines.append(f"  {spot}")
    lines += _nodes_lines(report)
    if report["time_scale"] != 1.0:
        scale = report["time_scale"]
        lines.append(f"  (run time at scale {scale:g}: tasks look {scale:g}x longer than they ran)")
    return "\n".join(lines)


def plot(report: dict[str, Any], run_dir: Path, path: str) -> None:
    """The front the first plan was chosen on, with the proposed point (the promise, its
    interval as error bars when it has one) and the delivered one, on the same axes; and the
    utilization per type."""
    from broker.cli.frontview import pyplot

    plt = pyplot()
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    draw_report(ax, bars, report, run_dir)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_report(ax, bars, report: dict[str, Any], run_dir: Path) -> None:
    """What :func:`plot` draws, on two matplotlib axes."""
    from broker.cli.frontview import draw_front, time_unit

    view, note = _first_front(report, run_dir)
    promise, delivered = report.get("promise") or report["planned"], report["delivered"]
    spans = [r.makespan_s for r in view.rows()] if view is not None else []
    spans += [v for v in (promise.get("makespan_s"), delivered["makespan_s"]) if v is not None]
    unit, per = time_unit(max(spans, default=0.0))
    if view is not None:
        draw_front(ax, view, per=per, mark_chosen=False, label="front of the first plan (steps: least cost by then)")
    if promise.get("makespan_s") is not None and promise.get("cost_usd") is not None:
        _draw_proposed(ax, promise, report.get("first_promise"), per)
    if delivered["makespan_s"] is not None and delivered["cost_usd"] is not None:
        left = report["tasks"]["left"]
        ax.plot([delivered["makespan_s"] / per], [delivered["cost_usd"]], "D", color="tab:green", markersize=9,
                label="delivered" + (f" ({left} tasks left)" if left else ""))
    ax.set_xlabel(f"makespan from the run's start ({unit}, run time)")
    ax.set_ylabel("cost (USD)")
    ax.set_title(f"run {report['run_id']}" + (f"\n{note}" if note else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    util = report["utilization_by_type"]
    names = list(util)
    bars.bar(range(len(names)), [100 * util[n] for n in names], color="tab:orange")
    bars.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    bars.set_ylim(0, 100)
    bars.set_ylabel("utilization (% of slot-time up)")
    bars.set_title("per type", fontsize=9)


def _draw_proposed(ax, promise: dict[str, Any], interval: dict[str, Any] | None, per: float) -> None:
    """The proposed point with the promise's interval as error bars: the plan's own interval
    when it has one, else the first forecast's (its median drawn too, as a bar, when the
    plan's point lies outside that interval: the bars then stand around the median)."""
    x, y = promise["makespan_s"] / per, promise["cost_usd"]
    xrange, yrange = promise.get("makespan_s_range"), promise.get("cost_usd_range")
    label = "proposed (the first plan)"
    if not (xrange or yrange) and interval:
        xrange, yrange = interval["makespan_s_range"], interval["cost_usd_range"]
        level = f"{interval['confidence']:.0%} " if interval.get("confidence") else ""
        label = (f"proposed, with the promise's {level}interval"
                 + ("" if interval["of_first_plan"] else f" (first made {format_duration(interval['made_at_s'])} in)"))
        inside = xrange[0] <= promise["makespan_s"] <= xrange[1] and yrange[0] <= promise["cost_usd"] <= yrange[1]
        if not inside:
            ax.errorbar([interval["makespan_s"] / per], [interval["cost_usd"]],
                        xerr=_error_bar(xrange, interval["makespan_s"], per),
                        yerr=_error_bar(yrange, interval["cost_usd"], 1.0), fmt="o", color="tab:red",
                        markersize=5, capsize=4, label=f"the promise: its median and {level}interval")
            xrange = yrange = None
    elif xrange or yrange:
        label = "proposed (the promise, its interval)"
    ax.errorbar([x], [y], xerr=_error_bar(xrange, promise["makespan_s"], per),
                yerr=_error_bar(yrange, promise["cost_usd"], 1.0), fmt="*", color="tab:red", markersize=15,
                capsize=5, zorder=5, label=label)  # above the delivered point: its caps stay visible


def _error_bar(interval, point: float, per: float):
    if not interval:
        return None
    low, high = interval
    return [[max(0.0, (point - low) / per)], [max(0.0, (high - point) / per)]]


def _first_front(report: dict[str, Any], run_dir: Path):
    """The front the first plan was chosen on, its figures from the run's start; (None, why)
    when it cannot be re-solved. A point, theta or no goal chose a point of the front on the
    work's point value; a deadline or budget was solved on its upper value."""
    first = report["first_plan"]
    if "work_upper_ref_s" not in first or "work_tasks" not in first:
        return None, "front not drawn: the run's plan events lack its work"
    inventory_path = report["inventory_path"]
    if not inventory_path or not Path(inventory_path).is_file():
        return None, f"front not drawn: inventory {inventory_path} not found"
    from broker.cli.frontview import FrontView
    from broker.config.inventory import load_inventory
    from broker.core.goal import Goal
    from broker.core.plan import NoFeasiblePlan, Work, pareto_front

    inventory = load_inventory(inventory_path)
    goal = report.get("goal") or {}
    promise_goal = goal.get("kind") in ("point", "theta", "none", None)
    total = first["work_ref_s"] if promise_goal and "work_ref_s" in first else first["work_upper_ref_s"]
    work = Work(total_ref_s=max(total, 1e-6), tasks=max(first["work_tasks"], 1),
                mean_ref_s=first["mean_ref_s"], sd_ref_s=first.get("sd_ref_s") or 0.0)
    try:
        front = pareto_front(inventory.types, inventory.private, work)
    except NoFeasiblePlan:
        return None, "front not drawn: no feasible plan when re-solved"
    line = Goal(goal["kind"], float(goal["value"])) if goal.get("kind") in ("deadline", "budget") else None
    offset = report.get("first_plan_at_s") or 0.0
    promise = report.get("promise") or {}
    chosen = None
    if promise.get("makespan_s") is not None and promise.get("cost_usd") is not None:
        # The first plan, as a plan of this front (its figures are from the run's start).
        from broker.core.plan import Plan

        chosen = Plan(makespan_s=max(0.0, promise["makespan_s"] - offset), cost_usd=promise["cost_usd"],
                      fleet=dict(first.get("fleet") or {}))
    return FrontView(work, inventory.types, front, chosen, offset_s=offset, goal=line), None


def print_report(run_dir: Path) -> None:
    """Print a run directory's report (what ``broker run`` shows when it ends)."""
    with Journal.open(run_dir, readonly=True) as journal:
        report = build(journal, run_dir)
    if report is not None:
        print(render(report), flush=True)
