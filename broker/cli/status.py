"""``broker status [RUN_DIR] [--json] [--watch [--interval S]]``: a run's progress from its journal.

RUN_DIR defaults to the most recently written run directory under ``./runs/`` (the one whose
``journal.sqlite``, or its write-ahead log, changed last). The journal is opened read-only,
so this is safe while the daemon writes.

- the human view: tasks done out of the total with a bar, spend against the budget, the last
  plan's predicted makespan and ETA, and the fleet with each instance's type, state, paid-until
  and scheduled release time;
- ``--json``: exactly one JSON object, ``Journal.status()``:
  ``{"tasks": {"total", "done", "running", "failed", "left"}, "instances": {"running",
  "terminated"}, "committed_usd", "budget_usd"}``;
- ``--watch``: redraw every ``--interval`` (default 5s) until the run is no longer running,
  or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from broker.cli import UsageError
from broker.config.durations import format_duration, parse_duration
from broker.shells.journal import JOURNAL_FILE, Journal, JournalError, Overview

RUNS_DIR = Path("runs")
DEFAULT_INTERVAL_S = 5.0
_BAR_WIDTH = 30


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
    try:
        journal = Journal.open(run_dir, readonly=True)
    except JournalError as exc:
        raise UsageError(str(exc)) from exc
    with journal:
        if args.json:
            print(json.dumps(journal.status(time.time())))
            return 0
        if not args.watch:
            print(render(journal.overview(time.time()), run_dir))
            return 0
        return _watch(journal, run_dir, interval_s)


def _watch(journal: Journal, run_dir: Path, interval_s: float) -> int:
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            overview = journal.overview(time.time())
            print(clear + render(overview, run_dir), flush=True)
            if overview.run is None or overview.run.state != "running":
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


def render(overview: Overview, run_dir: Path) -> str:
    """The human view of one snapshot."""
    now = overview.now_s
    run, status = overview.run, overview.status
    tasks = status["tasks"]
    lines = []
    if run is None:
        lines.append(f"run in {run_dir}: no run recorded yet")
    else:
        goal = run.goal_kind if run.goal_value is None else f"{run.goal_kind} {run.goal_value:g}"
        lines.append(
            f"run {run.id} ({run_dir}): {run.state}, goal {goal}, "
            f"started {format_duration(now - run.created_at_s)} ago"
        )
    lines.append(
        f"tasks  {_bar(tasks['done'], tasks['total'])} {tasks['done']}/{tasks['total']} done"
        f"  running {tasks['running']}  failed {tasks['failed']}  left {tasks['left']}"
    )
    states = overview.task_states
    extra = [f"{name} {states[name]}" for name in ("sampling", "quarantined", "cancelled") if states[name]]
    if extra:
        lines.append("       (" + ", ".join(extra) + ")")
    spend = f"spend  ${status['committed_usd']:.2f} committed"
    if status["budget_usd"] is not None:
        budget = status["budget_usd"]
        share = f" ({100 * status['committed_usd'] / budget:.0f}%)" if budget > 0 else ""
        spend += f" of ${budget:.2f} budget{share}"
    lines.append(spend)
    lines.append(_plan_line(overview))
    lines.extend(_fleet_lines(overview))
    return "\n".join(lines)


def progress_text(phase: str, done: int, failed: int, total: int, committed_usd: float,
                  budget_usd: float | None = None) -> str:
    """One progress line with a bar (``broker run`` on a terminal)."""
    spend = f"${committed_usd:.2f}" + (f" of ${budget_usd:.2f}" if budget_usd is not None else "")
    return (f"{phase:<8} {_bar(done, total)} {done}/{total} done"
            + (f", {failed} failed" if failed else "") + f", {spend} committed")


def _bar(done: int, total: int) -> str:
    filled = _BAR_WIDTH * done // total if total else 0
    return "[" + "#" * filled + "." * (_BAR_WIDTH - filled) + "]"


def _plan_line(overview: Overview) -> str:
    plan = overview.last_plan
    if plan is None:
        return "plan   none yet"
    parts = [f"plan   #{plan.seq} ({format_duration(overview.now_s - plan.created_at_s)} ago, {plan.reason})"]
    if plan.makespan_s is not None:
        parts.append(f"makespan {format_duration(plan.makespan_s)}")
    if plan.cost_usd is not None:
        parts.append(f"cost ${plan.cost_usd:.2f}")
    if plan.confidence is not None:
        parts.append(f"confidence {100 * plan.confidence:.0f}%")
    eta = overview.eta_at_s
    if eta is not None and overview.run is not None and overview.run.state == "running":
        left_s = eta - overview.now_s
        parts.append(f"ETA in {format_duration(left_s)}" if left_s >= 0 else "ETA passed")
    return ", ".join(parts)


def _fleet_lines(overview: Overview) -> list[str]:
    alive = [i for i in overview.fleet if i.state != "terminated"]
    gone = len(overview.fleet) - len(alive)
    lines = [f"fleet  {len(alive)} alive, {gone} terminated"]
    if not alive:
        return lines
    rows = [("INSTANCE", "TYPE", "STATE", "BILLING", "PAID UNTIL", "RELEASE")]
    for inst in alive:
        rows.append(
            (
                inst.id,
                inst.type_name,
                inst.state,
                inst.billing.describe(),
                _relative(inst.paid_until_s, overview.now_s),
                "-" if inst.release_at_s is None else _relative(inst.release_at_s, overview.now_s),
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return lines


def _relative(at_s: float, now_s: float) -> str:
    if at_s >= now_s:
        return f"in {format_duration(at_s - now_s)}"
    return f"{format_duration(now_s - at_s)} ago"
