"""``broker status [RUN_DIR] [--json] [--watch [--interval S]]``: a run's progress from its journal.

RUN_DIR defaults to the most recently written run directory under ``./runs/`` (the one whose
``journal.sqlite``, or its write-ahead log, changed last). The journal is opened read-only,
so this is safe while the daemon writes.

- the human view: tasks done out of the total with a bar; spend against the budget and what
  is left of it; the last plan (makespan, cost); while the run runs, the ETA by that plan
  with its interval (``metrics.figures``: the plan is made on the remaining work at its upper
  confidence value, and the point value recorded in ``plan.solved`` gives the low and
  expected ends) and the ETA by the pace of the last 15 minutes of run time (the tasks left
  divided by the completions counted, with their Poisson counting noise); and the fleet with
  each instance's type, state, running tasks, paid-until and scheduled release time, the
  next release first. Times are run time (a dry run's clock runs ``--time-scale`` times
  faster than the wall; the ETA then also says how much wall time that is);
- whether a daemon is attached (``RUN_DIR/daemon.lock``, :mod:`broker.shells.runlock`): a
  ``running`` run with none (left with ``--on-stop leave``, or killed) says so, with the command
  that resumes it and the one that releases it;
- ``--json``: exactly one JSON object (:func:`status_document`): ``Journal.status()``'s
  ``{"tasks": {"total", "done", "running", "failed", "left", "dropped"}, "instances": {"running",
  "terminated"}, "committed_usd", "budget_usd"}`` plus ``run`` (id, dir, state, phase, goal,
  time scale, elapsed_s), ``daemon`` (attached, pid), ``plan`` (the last: seq, made_at_s,
  makespan_s, cost_usd, fleet, reason), ``promise`` (the first plan, the one confirmed:
  makespan_s and cost_usd, and their ranges and confidence when the promise has them), ``eta``
  (low_s, expected_s, high_s left, confidence), ``promise_now`` (the promise standing now, the
  last plan's: ``{"confidence", "makespan_s", "makespan_s_range", "cost_usd",
  "cost_usd_range"}``, or null), ``instance_list`` (each instance's id, type,
  state, tasks, billing, launched_at_s, paid_until_s, release_at_s) and ``node_list`` (each
  private node's node, slots, running, done, state, since_s, last_heard_s, last_heard_ago_s,
  reason: :mod:`broker.shells.node_view`; the human view shows the same table) and ``spot``
  (notices, interruptions, attempts_interrupted, requeued_at_notice, lost_work_s,
  fallback_tasks, spot_instances, spot_cost_usd, on_demand_cost_usd:
  :mod:`broker.shells.spot_figures`; null for a run without spot). Times in JSON are run
  seconds (from the run's start, or left for the ETA); everywhere else they are human;
- ``--watch``: redraw every ``--interval`` (default 5s) until the run is no longer running,
  or Ctrl-C; it waits for a journal that does not exist yet (a run about to start).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from broker.cli import UsageError
from broker.core.units import format_duration, parse_duration
from broker.cli.terminal import goal_text, promise_text
from broker.shells.journal import JOURNAL_FILE, Journal, JournalError, Overview, RunRecord
from broker.shells.metrics import CONFIDENCE_Z, Figures, anchor_s, figures, interval_level, run_now_s
from broker.shells.logging import json_safe
from broker.shells.node_view import summary as node_summary
from broker.shells.runlock import holder
from broker.shells.spot_figures import spot_figures, spot_line

RUNS_DIR = Path("runs")
DEFAULT_INTERVAL_S = 5.0
_BAR_WIDTH = 30
# The pace ETA counts the tasks finished over the last this much run time.
PACE_WINDOW_S = 15 * 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="progress, spend vs budget, fleet and release times, ETA",
        description="Show a run's progress from its journal (read-only, safe while it runs).",
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help=f"run directory (default: the most recently written one under ./{RUNS_DIR}/)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    parser.add_argument("--watch", action="store_true", help="refresh until the run ends or Ctrl-C")
    parser.add_argument(
        "--interval",
        metavar="S",
        help=f"refresh period for --watch, e.g. 2s or 1m (default {DEFAULT_INTERVAL_S:g}s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json and args.watch:
        raise UsageError("--json prints one snapshot; use it without --watch")
    if args.interval is not None and not args.watch:
        raise UsageError("--interval only applies with --watch")
    interval_s = DEFAULT_INTERVAL_S
    if args.interval is not None:
        try:
            interval_s = parse_duration(args.interval)
        except ValueError as exc:
            raise UsageError(f"--interval: {exc}") from exc
        if interval_s <= 0:
            raise UsageError("--interval must be more than 0 seconds")
    run_dir = Path(args.run_dir) if args.run_dir is not None else latest_run_dir(RUNS_DIR)
    if args.watch and not (run_dir / JOURNAL_FILE).exists():
        if not _wait_for_journal(run_dir, interval_s):
            return 0
    try:
        journal = Journal.open(run_dir, readonly=True)
    except JournalError as exc:
        raise UsageError(str(exc)) from exc
    with journal:
        if args.json:
            print(json.dumps(json_safe(status_document(journal, run_dir, time.time())), allow_nan=False))
            return 0
        if not args.watch:
            print(render(snapshot(journal, time.time()), run_dir))
            return 0
        return _watch(journal, run_dir, interval_s)


def _wait_for_journal(run_dir: Path, interval_s: float) -> bool:
    """``--watch`` started before the run: wait for its journal (False on Ctrl-C)."""
    print(f"waiting for a run to write {run_dir / JOURNAL_FILE} (Ctrl-C to stop) ...", flush=True)
    try:
        while not (run_dir / JOURNAL_FILE).exists():
            time.sleep(min(interval_s, 1.0))
    except KeyboardInterrupt:
        return False
    time.sleep(0.2)  # let the run create its tables
    return True


def _watch(journal: Journal, run_dir: Path, interval_s: float) -> int:
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            try:
                view = snapshot(journal, time.time())
            except JournalError:  # the run is still creating its journal
                time.sleep(min(interval_s, 1.0))
                continue
            print(clear + render(view, run_dir), flush=True)
            run = view.overview.run
            if run is not None and run.state != "running":
                return 0
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0


def latest_run_dir(runs_dir: Path) -> Path:
    """The run directory under ``runs_dir`` whose journal was written last."""
    candidates = []
    if runs_dir.is_dir():
        for child in runs_dir.iterdir():
            journal = child / JOURNAL_FILE
            if journal.is_file():
                wal = journal.with_name(JOURNAL_FILE + "-wal")
                written = max(p.stat().st_mtime for p in (journal, wal) if p.exists())
                candidates.append((written, child.name, child))
    if not candidates:
        raise UsageError(f"no run directory with a {JOURNAL_FILE} under ./{runs_dir}/: pass RUN_DIR")
    return max(candidates)[2]


@dataclass(frozen=True)
class View:
    """One snapshot of a run for the human view: its figures (metrics.py), the recent pace,
    what each node runs, and the clocks (journal times are run time: ``time_scale`` times
    faster than the wall in a dry run)."""

    figures: Figures
    wall_now_s: float
    time_scale: float
    window_s: float  # run time over which done_in_window is counted
    done_in_window: int
    running_by_node: Mapping[str, int]
    daemon: Mapping[str, object] | None = None  # who runs it (runlock.holder), None: no daemon
    nodes: tuple = ()  # the private nodes (broker.shells.node_view.node_rows)
    spot: Mapping[str, object] | None = None  # spot interruptions so far (broker.shells.spot_figures)

    @property
    def overview(self) -> Overview:
        return self.figures.overview


def snapshot(journal: Journal, wall_now_s: float) -> View:
    """Read what the human view shows, at wall time ``wall_now_s``."""
    run = journal.run()
    now = run_now_s(run, wall_now_s)
    fig = figures(journal, now)
    window = min(PACE_WINDOW_S, fig.elapsed_s)
    done = journal.done_since(now - window) if window > 0 else 0
    running = Counter(a.node for a in journal.running_attempts())
    scale = float(run.options.get("time_scale", 1.0) or 1.0) if run is not None else 1.0
    by_type: Counter = Counter()
    for inst in fig.overview.fleet:
        by_type[inst.type_name] += inst.committed_usd(now)
    run_dir = Path(journal.path).parent
    spot = spot_figures(journal, run_dir, dict(by_type)) if run is not None else None
    return View(fig, wall_now_s, scale, window, done, dict(running), holder(run_dir), fig.nodes, spot)


def render(view: View, run_dir: Path) -> str:
    """The human view of one snapshot."""
    overview = view.overview
    now = overview.now_s
    run, status = overview.run, overview.status
    tasks = status["tasks"]
    lines = []
    if run is None:
        lines.append(f"run in {run_dir}: no run recorded yet")
    else:
        age = (f"started {format_duration(now - run.created_at_s)} ago" if run.ended_at_s is None
               else f"ran {format_duration(max(0.0, run.ended_at_s - run.created_at_s))}")
        lines.append(
            f"run {run.id} ({run_dir}): {state_text(run, overview)}, goal {goal_text(run.goal_kind, run.goal_value)}, "
            f"{age}" + (f" (run time: {view.time_scale:g}x the wall clock)" if view.time_scale != 1 else "")
        )
        if run.state == "running":
            lines.append(_daemon_line(run, run_dir, view.daemon))
    lines.append(
        f"tasks  {_bar(tasks['done'], tasks['total'])} {tasks['done']}/{tasks['total']} done"
        f"  running {tasks['running']}  failed {tasks['failed']}  left {tasks['left']}"
    )
    states = overview.task_states
    extra = [f"{name} {states[name]}" for name in ("sampling", "quarantined", "cancelled", "dropped") if states[name]]
    if extra:
        lines.append("       (" + ", ".join(extra) + ")")
    spend = f"spend  ${status['committed_usd']:.2f} committed"
    if status["budget_usd"] is not None:
        budget = status["budget_usd"]
        share = f" ({100 * status['committed_usd'] / budget:.0f}%)" if budget > 0 else ""
        spend += f" of ${budget:.2f} budget{share}, ${max(0.0, budget - status['committed_usd']):.2f} left"
    lines.append(spend)
    spot = spot_line(view.spot, format_duration)
    if spot:
        lines.append(spot)
    lines.append(_plan_line(overview))
    lines.extend(_promise_lines(view))
    if run is not None and run.state == "running":
        lines.extend(_eta_lines(view))
    lines.extend(_fleet_lines(view))
    lines.extend(_node_lines(view.nodes))
    return "\n".join(lines)


def phase_of(run: RunRecord | None, overview: Overview) -> str:
    """``sampling`` before the first plan, ``executing`` after it, ``ended`` once it ended."""
    if run is None or run.state != "running":
        return "ended"
    return "executing" if overview.last_plan is not None else "sampling"


def state_text(run: RunRecord, overview: Overview) -> str:
    phase = phase_of(run, overview)
    return f"{run.state} ({phase})" if run.state == "running" else run.state


def resume_command(run: RunRecord, run_dir: Path) -> str:
    """The ``broker run`` that resumes ``run`` (its inputs, goal and directory)."""
    parts = ["broker run"] + (["--dry-run"] if run.options.get("dry_run") else [])
    parts += ["--inventory", shlex.quote(run.inventory_path or "INVENTORY"), shlex.quote(run.bag_path or "BAG")]
    if run.goal_kind == "deadline" and run.goal_value is not None:
        parts += ["--deadline", f"{run.goal_value:g}s"]
    elif run.goal_kind == "budget" and run.goal_value is not None:
        parts += ["--budget", f"{run.goal_value:g}"]
    elif run.goal_kind in ("point", "theta") and run.goal_value is not None:
        parts += [f"--{run.goal_kind}", f"{run.goal_value:g}"]
    return " ".join(parts + ["--run-dir", shlex.quote(str(run_dir))])


def _daemon_line(run: RunRecord, run_dir: Path, daemon: Mapping[str, object] | None) -> str:
    if daemon is not None:
        pid = daemon.get("pid")
        return f"daemon attached (pid {pid})" if pid else "daemon attached"
    return (f"daemon NONE attached: nothing dispatches or releases (left with --on-stop leave, or killed); "
            f"its instances keep billing. Resume: `{resume_command(run, run_dir)}`; release them: "
            f"`broker down {shlex.quote(str(run_dir))}`")


def _bar(done: int, total: int) -> str:
    filled = _BAR_WIDTH * done // total if total else 0
    return "[" + "#" * filled + "." * (_BAR_WIDTH - filled) + "]"


def _plan_line(overview: Overview) -> str:
    plan = overview.last_plan
    if plan is None:
        return "plan   none yet"
    run = overview.run
    if run is not None and run.state == "running":
        when = _relative(plan.created_at_s, overview.now_s)
    else:  # an ended run's "now" is its end: say when in the run the plan was made
        when = f"made {format_duration(max(0.0, plan.created_at_s - anchor_s(run)))} into the run"
    parts = [f"plan   #{plan.seq} ({when}, {plan.reason})"]
    if plan.makespan_s is not None:
        parts.append(f"makespan {format_duration(plan.makespan_s)}")
    if plan.cost_usd is not None:
        parts.append(f"cost ${plan.cost_usd:.2f}")
    if plan.confidence is not None:
        parts.append(f"confidence {100 * plan.confidence:.0f}%")
    return ", ".join(parts)


def _promise_lines(view: View) -> list[str]:
    """The promise standing now (the last plan's forecast: the point and the interval of the
    makespan from the run's start and of the cost, as ``status --json``'s ``promise_now``),
    then the first one (the plan confirmed: the figures of the plan table, the launch
    question, the report's "proposed" column and the metrics; ``promise`` in ``--json``)."""
    fig = view.figures
    plan = fig.overview.last_plan
    if plan is None:
        return []
    chosen = plan.chosen if isinstance(plan.chosen, dict) else {}
    text = chosen.get("promise_text")
    lines = [f"promise {text}, by plan #{plan.seq} (from the run's start)" if text else
             "promise no interval yet: a bag without estimates gets its first promise after 30 runtimes"]
    if fig.promise:
        lines.append(f"        first: {promise_text(fig.promise)} (the plan confirmed; the report's proposed)")
    return lines


def _eta_lines(view: View) -> list[str]:
    """The ETA by the last plan (with its interval) and by the recent pace of completions."""
    fig, lines = view.figures, []
    level = f"{interval_level():.0%}"
    interval = fig.eta_interval_s()
    if interval is not None:
        low, mid, high = (max(0.0, x) for x in interval)
        if interval[2] < 0:
            lines.append(f"eta    the plan's end passed {format_duration(-interval[2])} ago; waiting for the last tasks")
        else:
            text = f"eta    in {format_duration(mid)} ({level} interval {format_duration(low)}-{format_duration(high)})"
            text += f", around {_clock(view.wall_now_s + mid / view.time_scale)} by the last plan"
            if view.time_scale != 1:
                text += f" (run time; {format_duration(mid / view.time_scale)} of wall time)"
            lines.append(text)
    left = fig.overview.status["tasks"]["left"]
    if left <= 0 or view.window_s <= 0:
        return lines
    n, window = view.done_in_window, view.window_s
    head = "pace   " if lines else "eta    "
    if n == 0:
        lines.append(f"{head}no task finished in the last {format_duration(window)}: no ETA from the pace")
        return lines
    # Completions counted over the window, with a normal approximation of their Poisson noise
    # (it ignores fleet changes to come: the plan's ETA above accounts for those).
    spread = CONFIDENCE_Z * math.sqrt(n)
    fastest = left * window / (n + spread)
    slowest = left * window / (n - spread) if n > spread else math.inf
    lines.append(f"{head}{n} done in the last {format_duration(window)}: {left} left take "
                 f"{format_duration(left * window / n)} at that pace ({level} interval "
                 f"{format_duration(fastest)}-{format_duration(slowest)})")
    return lines


def _clock(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%H:%M UTC")


def _fleet_lines(view: View) -> list[str]:
    overview = view.overview
    alive = [i for i in overview.fleet if i.state != "terminated"]
    gone = len(overview.fleet) - len(alive)
    lines = [f"fleet  {len(alive)} alive, {gone} terminated"]
    if not alive:
        return lines
    alive.sort(key=lambda i: (i.release_at_s is None, i.release_at_s or 0.0, i.id))
    rows = [("INSTANCE", "TYPE", "STATE", "TASKS", "BILLING", "PAID UNTIL", "RELEASE")]
    for inst in alive:
        rows.append(
            (
                inst.id,
                inst.type_name,
                inst.state,
                str(view.running_by_node.get(inst.id, 0)),
                inst.billing.describe(),
                _relative(inst.paid_until_s, overview.now_s),
                "-" if inst.release_at_s is None else _relative(inst.release_at_s, overview.now_s),
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return lines


def _node_lines(nodes: tuple) -> list[str]:
    """The private nodes: state, slots, what each runs, when it was last heard from, and why
    one that is not up is not."""
    if not nodes:
        return []
    rows = [("NODE", "STATE", "SLOTS", "RUNNING", "LAST HEARD")]
    for n in nodes:
        heard = "never" if n["last_heard_ago_s"] is None else f"{format_duration(n['last_heard_ago_s'])} ago"
        rows.append((n["node"], n["state"], str(n["slots"]), str(n["running"]), heard))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [f"nodes  {node_summary(list(nodes))}"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"  {n['node']} {n['state']}: {n['reason']}" for n in nodes if n["reason"] and n["state"] != "up"]
    return lines


def _relative(at_s: float, now_s: float) -> str:
    if at_s >= now_s:
        return f"in {format_duration(at_s - now_s)}"
    return f"{format_duration(now_s - at_s)} ago"


def status_document(journal: Journal, run_dir: Path, wall_now_s: float) -> dict:
    """``status --json``: one object for scripts (see the module docstring); times in run seconds."""
    view = snapshot(journal, wall_now_s)
    fig, overview = view.figures, view.overview
    run, start = overview.run, anchor_s(overview.run)
    document = dict(overview.status)
    # tasks a resume dropped from an edited bag (kept in the journal, counted in no total)
    document["tasks"] = {**document["tasks"], "dropped": overview.task_states.get("dropped", 0)}
    document["run"] = None if run is None else {
        "id": run.id, "dir": str(run_dir), "state": run.state, "phase": phase_of(run, overview),
        "goal": {"kind": run.goal_kind, "value": run.goal_value}, "time_scale": view.time_scale,
        "elapsed_s": round(fig.elapsed_s, 3), "dry_run": bool(run.options.get("dry_run")),
    }
    document["daemon"] = {"attached": view.daemon is not None, "pid": (view.daemon or {}).get("pid")}
    plan = overview.last_plan
    document["plan"] = None if plan is None else {
        "seq": plan.seq, "made_at_s": round(plan.created_at_s - start, 3), "makespan_s": plan.makespan_s,
        "cost_usd": fig.planned_cost_usd if fig.planned_cost_usd is not None else plan.cost_usd,
        "fleet": plan.fleet, "reason": plan.reason,
    }
    document["promise"] = fig.promise
    # the promise standing now (the last plan's): point and interval of makespan and cost
    document["promise_now"] = None if plan is None else (plan.chosen or {}).get("promise") \
        if isinstance(plan.chosen, dict) else None
    interval = fig.eta_interval_s() if run is not None and run.state == "running" else None
    document["eta"] = None if interval is None else {
        "low_s": round(max(0.0, interval[0]), 3), "expected_s": round(max(0.0, interval[1]), 3),
        "high_s": round(max(0.0, interval[2]), 3), "confidence": round(interval_level(), 4), "by": "last plan",
    }
    document["spot"] = view.spot  # interruptions, lost work, the on-demand fallback (None: no spot)
    document["node_list"] = list(view.nodes)  # the private nodes (broker.shells.node_view.node_rows)
    document["instance_list"] = [
        {"id": i.id, "type": i.type_name, "state": i.state, "tasks": view.running_by_node.get(i.id, 0),
         "billing": i.billing.describe(), "launched_at_s": round(i.launched_at_s - start, 3),
         "paid_until_s": round(i.paid_until_s - start, 3),
         "release_at_s": None if i.release_at_s is None else round(i.release_at_s - start, 3),
         "terminated_at_s": None if i.terminated_at_s is None else round(i.terminated_at_s - start, 3)}
        for i in overview.fleet
    ]
    return document

