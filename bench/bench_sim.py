"""Simulator speed: 100,000 tasks on 200 machines over days of virtual time.

    python3 bench/bench_sim.py [--tasks 100000] [--per-type 50] [--policies rr,broker]
    python3 bench/bench_sim.py --scale     # issue 20: 100k tasks and 1M tasks on 1,000 machines

Thesis catalogue (m1.small, c1.medium, m1.large, c1.xlarge; 50 of each = 200 machines,
hourly billing) plus the private Xeon, the thesis LM workload (2^x minutes, x ~ N(1.8, 3)
cut to [-2, 8]). Prints virtual makespan, wall and CPU time, the ratio of virtual to wall
time and the process's peak RSS. Goals: issue 4, 100k tasks on 200 machines in <= 30 s;
issue 20, 100k tasks on 1,000 machines in <= 10 s, 1M tasks on 1,000 machines in <= 120 s
and <= 1 GB. ``--scale`` runs each of issue 20's cases (broker policy) in a process of its
own, so each peak RSS is that case's alone. CPU time is the figure to compare on a loaded
machine (wall time counts the other processes' turns too).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from broker.core.billing import Billing  # noqa: E402
from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.model import Inventory, MachineType, PrivateNode  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402
from broker.sim.workloads import BUILTIN, build_workload  # noqa: E402

CATALOGUE = [("m1.small", 1, 0.080), ("c1.medium", 5, 0.165), ("m1.large", 4, 0.320), ("c1.xlarge", 20, 0.660)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--per-type", type=int, default=50)
    ap.add_argument("--policies", default="rr,broker")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", action="store_true", help="issue 20's cases, each in its own process")
    ap.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale:
        sys.exit(1 if scale(args.seed) else 0)
    if not args.no_header:
        print(f"$ python3 bench/bench_sim.py --tasks {args.tasks} --per-type {args.per_type} --policies {args.policies}")
        header()
    types = tuple(MachineType(n, 1, s, p, args.per_type, 60.0, Billing.hourly()) for n, s, p in CATALOGUE)
    inv = Inventory(private=(PrivateNode("xeon", 1, 10.0, 0.32, local=True),), types=types)
    t0 = time.perf_counter()
    wl = build_workload(BUILTIN["LM"], args.seed, tasks=args.tasks)
    if not args.no_header:
        print(f"workload LM: {args.tasks} tasks, built in {time.perf_counter() - t0:.2f}s; "
              f"{len(types) * args.per_type} EC2 machines + 1 private")
    if not args.no_header:
        print(COLUMNS)
    for policy in args.policies.split(","):
        goal = Goal("point", 1) if policy == "broker" else Goal()
        cpu0 = time.process_time()
        r = Simulation(inv, wl, goal, ControllerConfig(policy=policy), SimOptions(seed=args.seed)).run()
        cpu = time.process_time() - cpu0
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        print(f"{policy:<8} {goal.kind:<6} {args.tasks:>8} {len(types) * args.per_type:>6} {r.makespan_s / 3600:>8.1f} h "
              f"{r.cost_usd:>9.2f}$ {r.instances_launched:>6} {r.sim_wall_s:>8.2f} {cpu:>7.2f} "
              f"{r.makespan_s / r.sim_wall_s:>8.0f}x {rss_mb:>7.0f}  ({r.tasks_done}/{r.tasks_total} done)", flush=True)


COLUMNS = (f"{'policy':<8} {'goal':<6} {'tasks':>8} {'EC2':>6} {'virtual':>10} {'cost':>10} {'launch':>6} "
           f"{'wall s':>8} {'cpu s':>7} {'virt/wall':>9} {'RSS MB':>7}")


def header() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


SCALE_GOALS = ((100_000, 10.0, None), (1_000_000, 120.0, 1024.0))  # tasks, wall s, peak RSS MB (issue 20)


def scale(seed: int) -> int:
    """Issue 20's simulator cases, each in a process of its own (peak RSS per case); prints a
    PASS/MISS line per goal and returns the number of misses (the exit status: 1 if any)."""
    print("$ python3 bench/bench_sim.py --scale")
    header()
    print("goals: 100,000 tasks on 1,000 machines <= 10 s; 1,000,000 tasks on 1,000 machines <= 120 s, <= 1,024 MB")
    print(COLUMNS, flush=True)
    verdicts = []
    for tasks, wall_goal, rss_goal in SCALE_GOALS:
        out = subprocess.run([sys.executable, __file__, "--tasks", str(tasks), "--per-type", "250", "--policies",
                              "broker", "--seed", str(seed), "--no-header"], check=True, capture_output=True, text=True)
        print(out.stdout, end="", flush=True)
        wall, rss, done = _scale_figures(out.stdout)
        verdicts.append((f"{tasks:,} tasks on 1,000 machines in {wall_goal:.0f} s or less", done and wall <= wall_goal,
                         f"{wall:.2f} s wall" + ("" if done else ", not every task done")))
        if rss_goal is not None:
            verdicts.append((f"{tasks:,} tasks in {rss_goal:,.0f} MB or less", rss <= rss_goal, f"{rss:.0f} MB peak RSS"))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for text, ok, figure in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  simulator: {text}: {figure}")
    return sum(not ok for _, ok, _ in verdicts)


def _scale_figures(row: str) -> tuple[float, float, bool]:
    """(wall s, peak RSS MB, every task done) from a row that ``main`` printed."""
    head, _, tail = row.strip().rpartition("(")
    cols = head.split()
    done, total = tail.rstrip(" done)").split("/")
    return float(cols[-4]), float(cols[-1]), done == total


if __name__ == "__main__":
    main()
