"""``broker runs [DIR] [--json]``: the runs under a directory, newest first (``sky status``,
``nextflow log``).

One row per run directory under DIR (default ``./runs/``) that holds a journal: its id, state
(``running`` says whether a daemon is attached: ``running`` or ``running, no daemon``, a run left
with ``--on-stop leave`` or killed), goal, progress (tasks done of the total, failed), spend
(committed dollars; against the budget when there is one), age (since it started) and its
directory. Journals are opened read-only; a directory whose journal cannot be read is listed
with the reason. ``--json`` prints one JSON array of the same fields (times in seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from broker.cli import UsageError
from broker.cli.terminal import goal_text, money
from broker.core.units import format_duration

RUNS_DIR = Path("runs")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "runs",
        help="list the runs under a directory: state, goal, progress, spend, age",
        description="List the run directories under DIR (default ./runs/), newest first, read-only.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR", help=f"where the run directories are (default ./{RUNS_DIR}/)")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else RUNS_DIR
    if not base.is_dir():
        raise UsageError(f"{base} is not a directory" + ("" if args.dir else ": run from where ./runs/ is, or give DIR"))
    rows = collect(base, time.time())
    if args.json:
        print(json.dumps(rows))
    else:
        print(render(rows, base))
    return 0


def collect(base: Path, wall_now_s: float) -> list[dict[str, Any]]:
    """One row per run directory under ``base`` with a journal, newest first."""
    from broker.shells.journal import JOURNAL_FILE, Journal, JournalError
    from broker.shells.metrics import anchor_s, run_now_s
    from broker.shells.runlock import holder

    rows = []
    for child in sorted(base.iterdir()):
        if not (child / JOURNAL_FILE).is_file():
            continue
        try:
            with Journal.open(child, readonly=True) as journal:
                record = journal.run()
                if record is None:
                    rows.append({"dir": str(child), "error": "no run recorded yet", "started_at": None})
                    continue
                now = run_now_s(record, wall_now_s)
                status = journal.status(now)
        except JournalError as exc:
            rows.append({"dir": str(child), "error": str(exc), "started_at": None})
            continue
        start = anchor_s(record)
        scale = float(record.options.get("time_scale", 1.0) or 1.0)
        tasks = status["tasks"]
        rows.append({
            "id": record.id, "dir": str(child), "state": record.state,
            "daemon": holder(child) is not None if record.state == "running" else None,
            "goal": {"kind": record.goal_kind, "value": record.goal_value},
            "tasks": tasks, "committed_usd": status["committed_usd"], "budget_usd": status["budget_usd"],
            "started_at": start, "age_s": round(max(0.0, wall_now_s - start), 3),
            "run_time_s": round(max(0.0, now - start), 3), "time_scale": scale,
            "dry_run": bool(record.options.get("dry_run")),
        })
    rows.sort(key=lambda r: r["started_at"] or 0.0, reverse=True)
    return rows


def render(rows: list[dict[str, Any]], base: Path) -> str:
    if not rows:
        return f"no runs under {base}/"
    table = [("RUN", "STATE", "GOAL", "PROGRESS", "SPEND", "AGE", "DIR")]
    for r in rows:
        if "error" in r:
            table.append(("?", "unreadable", "-", "-", "-", "-", f"{r['dir']} ({r['error']})"))
            continue
        state = r["state"]
        if state == "running":
            state = "running" if r["daemon"] else "running, no daemon"
        t = r["tasks"]
        progress = f"{t['done']}/{t['total']}" + (f", {t['failed']} failed" if t["failed"] else "")
        spend = money(r["committed_usd"]) + (f" of {money(r['budget_usd'])}" if r["budget_usd"] is not None else "")
        table.append((r["id"], state + (" (dry run)" if r["dry_run"] else ""),
                      goal_text(r["goal"]["kind"], r["goal"]["value"]), progress, spend,
                      format_duration(r["age_s"]), r["dir"]))
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    if any(r.get("daemon") is False for r in rows):
        lines.append("(running, no daemon: left with --on-stop leave or killed; `broker status DIR` says how to "
                     "resume or release it)")
    return "\n".join(lines)
