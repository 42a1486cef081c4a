"""What the run journal costs: bulk task insert, per-result commits, the status query.

    python3 bench/bench_journal.py [--tasks 100000] [--results 5000] [--repeat 3]

On a fresh journal in a temporary directory on the same file system as the run directory
would be (``--dir``, default the system temp dir):

- ``add_tasks`` of ``--tasks`` tasks (one transaction, executemany): seconds;
- ``task_started`` + ``task_finished`` pairs, each its own fsynced transaction: results/s;
  the same grouped 100 to a transaction with ``journal.batch()``; and the cost of one ``intend`` + ``complete`` pair (the write-ahead log of one action);
- ``status()`` and ``overview()`` on the full journal, from a second read-only connection
  (what ``broker status`` does): milliseconds;
- a daemon turn: ``TURN`` results with their ``task.done`` events and as many starts, as
  the daemon writes them (one group commit; on a journal without groups, two batches):
  milliseconds per turn and commits per turn;
- the price of ``synchronous=FULL`` over ``NORMAL`` per commit, as a ratio (the journal
  commits intents with FULL, the rest with NORMAL: see broker/shells/journal/base.py).

Medians over ``--repeat`` fresh journals. No asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from broker.core.billing import Billing  # noqa: E402
from broker.core.model import Task  # noqa: E402
from broker.shells.journal import AttemptResult, Journal  # noqa: E402

BATCH = 100  # results grouped per transaction with journal.batch()
TURN = 20  # tasks per daemon turn (16 agents x 4 slots of no-op tasks: ~20 results a turn)


def one_round(base: Path, n_tasks: int, n_results: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        journal = Journal.open(tmp)
        journal.create_run("bench", goal_kind="deadline", deadline_s=86400.0, budget_usd=100.0)
        tasks = [Task(f"task-{i:06d}", f"./simulate --seed {i}", {"seed": i}) for i in range(n_tasks)]
        t0 = time.perf_counter()
        journal.add_tasks(tasks)
        insert_s = time.perf_counter() - t0

        for k in range(20):
            journal.record_launch(f"i-{k:04d}", "c5.xlarge", launched_at_s=time.time() - 600, price_per_hour=0.17,
                                  billing=Billing.hourly(), client_token=f"tok-{k}")
        journal.intend("warm-up", {}, "bench")  # the first commit after the bulk insert checkpoints
        ok = AttemptResult(exit_code=0, runtime_s=42.0, stdout_tail="done\n")
        t0 = time.perf_counter()
        for i in range(n_results):
            journal.task_started(f"task-{i:06d}", 1, f"i-{i % 20:04d}")
            journal.task_finished(f"task-{i:06d}", 1, ok)
        pairs_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        for first in range(n_results, 2 * n_results, BATCH):
            with journal.batch():
                for i in range(first, min(first + BATCH, 2 * n_results)):
                    journal.task_started(f"task-{i:06d}", 1, f"i-{i % 20:04d}")
                    journal.task_finished(f"task-{i:06d}", 1, ok)
        batched_s = time.perf_counter() - t0

        turns_s, commits = daemon_turns(journal, 2 * n_results, n_results, TURN)

        t0 = time.perf_counter()
        for i in range(n_results // 5):
            journal.complete(journal.intend("launch", {"type": "c5.xlarge", "token": f"t{i}"}, "bench"), {"ok": 1})
        action_s = (time.perf_counter() - t0) / (n_results // 5)

        reader = Journal.open(tmp, readonly=True)
        reader.status()  # open the snapshot machinery once
        status_ms = median_ms(lambda: reader.status(), 20)
        overview_ms = median_ms(lambda: reader.overview(), 20)
        reader.close()
        journal.close()
        return {
            "insert_s": insert_s,
            "finished_per_s": n_results / pairs_s,
            "pair_ms": 1e3 * pairs_s / n_results,
            "batched_per_s": n_results / batched_s,
            "turn_ms": 1e3 * turns_s / (n_results // TURN),
            "turn_commits": commits / (n_results // TURN),
            "action_ms": 1e3 * action_s,
            "status_ms": status_ms,
            "overview_ms": overview_ms,
        }


def daemon_turns(journal: Journal, first: int, n_results: int, per_turn: int) -> tuple[float, int]:
    """What the daemon's turns write, ``per_turn`` tasks a turn: each task's result and its
    ``task.done`` event (a batch), then as many new starts (a batch), all inside the turn's
    group where the journal has one (``Journal.group``; before it, two committed batches).
    Returns (seconds, commits)."""
    group = getattr(journal, "group", None) or contextlib.nullcontext
    ok = AttemptResult(exit_code=0, runtime_s=0.01, stdout_tail="")
    commits = [0]
    journal._db.set_trace_callback(lambda sql: sql == "COMMIT" and commits.__setitem__(0, commits[0] + 1))
    for i in range(first, first + per_turn):  # the first turn's starts
        journal.task_started(f"task-{i:06d}", 1, "n0")
    t0 = time.perf_counter()
    for turn in range(n_results // per_turn):
        base = first + turn * per_turn
        with group():
            with journal.batch():
                for i in range(base, base + per_turn):
                    journal.task_finished(f"task-{i:06d}", 1, ok, node="n0")
                    journal.record_event("task.done", {"task": f"task-{i:06d}", "attempt": 1, "node": "n0",
                                                       "runtime_s": 0.01, "exit_code": 0, "runtime_ref_s": 0.01})
            with journal.batch():
                for i in range(base + per_turn, base + 2 * per_turn):
                    journal.task_started(f"task-{i:06d}", 1, "n0")
    elapsed = time.perf_counter() - t0
    journal._db.set_trace_callback(None)
    return elapsed, commits[0]


def median_ms(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def commit_us(base: Path, synchronous: str, n: int = 500) -> float:
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        db = sqlite3.connect(Path(tmp) / "c.sqlite", isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("CREATE TABLE t (x)")
        t0 = time.perf_counter()
        for i in range(n):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?)", (i,))
            db.execute("COMMIT")
        db.close()
        return 1e6 * (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--results", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if args.tasks < 3 * args.results + TURN:
        parser.error("--tasks must be at least three times --results (each result needs a fresh task)")

    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}; journal files under {args.dir}")
    print(f"command: python3 bench/bench_journal.py --tasks {args.tasks} --results {args.results} "
          f"--repeat {args.repeat}")
    rounds = [one_round(args.dir, args.tasks, args.results) for _ in range(args.repeat)]
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    full_us = statistics.median(commit_us(args.dir, "FULL") for _ in range(args.repeat))
    normal_us = statistics.median(commit_us(args.dir, "NORMAL") for _ in range(args.repeat))
    print(f"add_tasks, {args.tasks:,} tasks in one transaction:  {med['insert_s']:.2f} s "
          f"({args.tasks / med['insert_s']:,.0f} tasks/s)")
    print(f"task_started + task_finished, one commit each:  {med['finished_per_s']:,.0f} results/s "
          f"({med['pair_ms']:.2f} ms per result)")
    print(f"the same in journal.batch() of {BATCH}:            {med['batched_per_s']:,.0f} results/s "
          f"({med['batched_per_s'] / med['finished_per_s']:.0f}x)")
    print(f"a daemon turn of {TURN} results + events + starts: {med['turn_ms']:.2f} ms, "
          f"{med['turn_commits']:.0f} commit(s) ({1e3 / med['turn_ms'] * TURN:,.0f} tasks/s of journal)")
    print(f"intend + complete (one external action logged): {med['action_ms']:.2f} ms")
    print(f"status() on {args.tasks:,} tasks, read-only reader:  {med['status_ms']:.1f} ms")
    print(f"overview() (broker status human view):        {med['overview_ms']:.1f} ms")
    print(f"commit latency: synchronous=FULL {full_us:.0f} us, NORMAL {normal_us:.0f} us "
          f"(FULL/NORMAL = {full_us / normal_us:.1f}x)")


if __name__ == "__main__":
    main()
