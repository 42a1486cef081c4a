"""What one ``broker status`` view costs on a large journal (what ``--watch`` pays per refresh).

    python3 bench/bench_status.py [--tasks 100000] [--done 50000] [--repeat 5]

Builds a journal of ``--tasks`` tasks of which ``--done`` finished over the last 40 minutes
(each with its attempt and its ``task.done`` event, as a run writes them), a few plans with
their ``plan.solved`` events and a running instance, then times ``snapshot`` + ``render``
from a second, read-only connection. Median over ``--repeat`` views. No asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.cli import status as status_cli  # noqa: E402
from broker.core.billing import Billing  # noqa: E402
from broker.core.model import Task  # noqa: E402
from broker.shells.journal import AttemptResult, Journal  # noqa: E402


def build(run_dir: Path, tasks: int, done: int, now: float) -> None:
    journal = Journal.open(run_dir)
    journal.create_run("bench", goal_kind="budget", goal_value=50.0, budget_usd=50.0, at_s=now - 7200)
    journal.add_tasks(Task(f"t{i}", "true") for i in range(tasks))
    step = 2400.0 / max(done, 1)
    with journal.batch():
        for i in range(done):
            at = now - 2400 + i * step
            journal.task_started(f"t{i}", 1, "i-1", at_s=at - 1)
            journal.task_finished(f"t{i}", 1, AttemptResult(0, 1.0), at_s=at)
            journal.record_event("task.done", {"task": f"t{i}", "attempt": 1, "node": "i-1"}, at_s=at)
        for k in range(5):
            journal.record_plan(makespan_s=9000.0 + k, cost_usd=3.0, fleet={"c5.xlarge": 4}, chosen={},
                                reason="replan", at_s=now - 3600 + k * 600)
            journal.record_event("plan.solved", {"makespan_s": 9000.0 + k, "work_ref_s": 8e5,
                                                 "work_upper_ref_s": 1e6}, at_s=now - 3600 + k * 600)
    journal.record_launch("i-1", "c5.xlarge", launched_at_s=now - 7100, price_per_hour=0.17,
                          billing=Billing.hourly(), state="running")
    journal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--done", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"$ python3 bench/bench_status.py --tasks {args.tasks} --done {args.done} --repeat {args.repeat}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        now = time.time()
        t0 = time.perf_counter()
        build(run_dir, args.tasks, args.done, now)
        print(f"journal built in {time.perf_counter() - t0:.1f} s")
        times = []
        with Journal.open(run_dir, readonly=True) as journal:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                text = status_cli.render(status_cli.snapshot(journal, time.time()), run_dir)
                times.append(time.perf_counter() - t0)
        print(text)
        print(f"one status view: median {1000 * statistics.median(times):.0f} ms "
              f"(min {1000 * min(times):.0f}, max {1000 * max(times):.0f}) over {args.repeat}")


if __name__ == "__main__":
    main()
