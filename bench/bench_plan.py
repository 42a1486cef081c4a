"""Planner timings: one min-cost solve and a whole front, per solver.

    python3 bench/bench_plan.py [--repeat 5]

Catalogues: the thesis (ALGORITHMS.md 7: m1.small 1/$0.080, c1.medium 5/$0.165, m1.large
4/$0.320, c1.xlarge 20/$0.660, private speed 10 at $0.320; 20 and 60 of each, hourly) with
n = 100,000 LM-like tasks, and a 20-type per-second catalogue. Goals: one solve <= 20 ms,
a 24-point front <= 0.5 s. Prints medians; no asserts.

Re-plans with running instances (BaTS-like: two clusters of 32 one-slot machines at $3 an
hour, all 64 running, 500 tasks of 15 min left): one solve at a deadline and a budget search,
with the 64 launched in two batches (the model sums each batch's variables) against the same
64 launched a second apart (one set of variables each, as every instance had before).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pulp  # noqa: E402

from broker.core.billing import Billing  # noqa: E402
from broker.core.model import ExistingInstance, MachineType, PrivateNode  # noqa: E402
from broker.core.plan import PlanOptions, Work, min_cost, min_makespan, pareto_front  # noqa: E402

# LM workload (thesis Tables 5.6, 6.3): 2^x minutes, x ~ N(1.8, 3), cut at x <= 6 (64 min).
def lm_work(n: int, seed: int = 1) -> Work:
    rng = random.Random(seed)
    runtimes = [60.0 * 2 ** min(6.0, rng.gauss(1.8, 3.0)) for _ in range(n)]
    return Work(sum(runtimes), n, statistics.fmean(runtimes), statistics.stdev(runtimes))


def thesis(count: int):
    types = [
        MachineType("m1.small", 1, 1.0, 0.080, count),
        MachineType("c1.medium", 1, 5.0, 0.165, count),
        MachineType("m1.large", 1, 4.0, 0.320, count),
        MachineType("c1.xlarge", 1, 20.0, 0.660, count),
    ]
    private = [PrivateNode(f"xeon{k}", 1, 10.0, 0.320) for k in range(count)]
    return types, private


def per_second_20():
    rng = random.Random(20)
    types = [MachineType(f"t{i:02d}", rng.choice([2, 4, 8, 16]), rng.uniform(1, 4), 0.0, 20, 60.0,
                         Billing.per_second()) for i in range(20)]
    types = [MachineType(t.name, t.slots, t.speed, round(0.02 * t.slots * t.speed * rng.uniform(0.8, 1.25), 4),
                         t.limit, t.boot_s, t.billing) for t in types]
    return types, []


def running_fleet(staggered: bool):
    """BaTS-like clusters, all 64 machines running for 30 minutes of their first hour."""
    types = [MachineType("cluster0", 1, 1.0, 3.0, 32), MachineType("cluster1", 1, 1.0, 3.0, 32)]
    existing = [ExistingInstance(f"{t.name}-{k}", t.name, launched_at_s=(k + 32 * j if staggered else 0.0),
                                 paid_until_s=3600.0 + (k + 32 * j if staggered else 0.0))
                for j, t in enumerate(types) for k in range(32)]
    return types, existing


def replan_rows(repeat: int) -> None:
    work = Work(500 * 900.0, 500, 900.0, 134.0)
    now = 1800.0
    print(f"\n{'re-plan, 64 running':24} {'solve at 4h ms':>14} {'budget search ms':>17}")
    results = {}
    for staggered in (False, True):
        types, existing = running_fleet(staggered)
        one = median_ms(lambda: min_cost(types, [], work, 4 * 3600.0, existing=existing, now_s=now), repeat)
        search = median_ms(lambda: min_makespan(types, [], work, 340.0, existing=existing, now_s=now), repeat)
        label = "launched 1 s apart" if staggered else "two batches of 32"
        results[staggered] = (one, search)
        print(f"{label:24} {one:14.1f} {search:17.1f}")
    (b1, b2), (s1, s2) = results[False], results[True]
    print(f"{'ratio apart / batches':24} {s1 / b1:13.1f}x {s2 / b2:16.1f}x")


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    solvers = ["cbc"] + (["highs"] if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else [])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, pulp {pulp.__version__}, solvers {solvers}")
    print(f"command: python3 bench/bench_plan.py --repeat {args.repeat}")
    lm = lm_work(100_000)
    cases = [
        ("thesis x20, LM n=100k", *thesis(20), lm),
        ("thesis x60, LM n=100k", *thesis(60), lm),
        ("20 types per-second", *per_second_20(), Work(2_000_000.0, 20_000, 100.0)),
    ]
    print(f"{'catalogue':24} {'solver':6} {'deadline':>9} {'1 solve ms':>11} {'points':>7} {'front ms':>9}"
          f" {'vs 20ms':>8} {'vs 0.5s':>8}")
    for name, types, private, work in cases:
        for solver in solvers:
            options = PlanOptions(solver=solver)
            t_fast = min_makespan(types, private, work, float("inf"), options=options).makespan_s
            deadline = 1.5 * t_fast
            one = median_ms(lambda: min_cost(types, private, work, deadline, options=options), args.repeat)
            front = pareto_front(types, private, work, options=options)
            whole = median_ms(lambda: pareto_front(types, private, work, options=options), max(1, args.repeat // 2))
            print(f"{name:24} {solver:6} {deadline / 3600:8.1f}h {one:11.1f} {len(front):7d} {whole:9.0f}"
                  f" {one / 20:7.1f}x {whole / 500:7.1f}x")
    replan_rows(args.repeat)


if __name__ == "__main__":
    main()
