"""Packing speed: FFD with targets on 100,000 tasks, the subset-sum FPTAS on a few thousand.

    python3 bench/bench_pack.py                         # the README figures
    python3 bench/bench_pack.py --tasks 100000 --fptas-tasks 3000 --eps 0.1 --repeat 3

Workload: thesis Table 6.3's LM bag, task length 2^x minutes on the reference machine with
x ~ N(1.8, 3) truncated to [-3, 8] (values outside are redrawn: 7.5 s to 4 h 16 min).
Machines: the thesis catalogue (Tables 5.1, 6.2: m1.small 1/$0.080, c1.medium 5/$0.165,
m1.large 4/$0.320, c1.xlarge 20/$0.660 per hour, private Xeon 10/$0.320 amortized), 20 or
60 of each. Horizons: ``T_lower`` (all machines, load balanced, rounded up to the hour) and
twice that; targets from ``workload_targets``.

Figures per row: the packing time (best of ``--repeat``), its ratio to the 1 s goal for FFD,
tasks left unassigned, fluid makespan and hourly-billed cost of the packing. The FPTAS row
packs the first ``--fptas-tasks`` tasks at ``--eps`` on 20 machines per type, at T_lower and
4 x T_lower, with FFD on the same tasks and targets beside it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.core.billing import Billing  # noqa: E402
from broker.core.pack import (Bin, cost_usd, ffd_with_targets, fptas_assign,  # noqa: E402
                              list_schedule, makespan_s, workload_targets)

CATALOGUE = [  # name, speed, USD per hour, private
    ("m1.small", 1.0, 0.080, False),
    ("c1.medium", 5.0, 0.165, False),
    ("m1.large", 4.0, 0.320, False),
    ("c1.xlarge", 20.0, 0.660, False),
    ("private", 10.0, 0.320, True),
]
GOAL_FFD_S = 1.0


def lm_task_sizes_ref_s(n: int, rng: np.random.Generator) -> np.ndarray:
    """2^x minutes, x ~ N(1.8, 3) truncated to [-3, 8] by redrawing."""
    x = rng.normal(1.8, 3.0, n)
    while (outside := (x < -3) | (x > 8)).any():
        x[outside] = rng.normal(1.8, 3.0, int(outside.sum()))
    return 60.0 * 2.0 ** x


def catalogue_bins(per_type: int) -> list[Bin]:
    return [Bin(f"{name}-{k}", name, 1, speed, price, private=private)
            for name, speed, price, private in CATALOGUE for k in range(per_type)]


def best_time_s(run, repeat: int):
    best_s, result = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run()
        best_s = min(best_s, time.perf_counter() - t0)
    return best_s, result


def row(label: str, seconds: float, assignment, billing: Billing, ratio: str = "") -> None:
    print(f"{label:<34} {seconds * 1000:>9.1f} ms {ratio:>8} {assignment.unassigned.size:>10d} "
          f"{makespan_s(assignment) / 3600:>10.2f} {cost_usd(assignment, billing):>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--fptas-tasks", type=int, default=3_000)
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    sizes = lm_task_sizes_ref_s(args.tasks, rng)
    hourly = Billing.hourly()
    print(f"# python3 bench/bench_pack.py --tasks {args.tasks} --fptas-tasks {args.fptas_tasks} "
          f"--eps {args.eps} --repeat {args.repeat} --seed {args.seed}")
    print(f"# {platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpu, {platform.machine()}; LM bag: {sizes.size} tasks, "
          f"{sizes.sum() / 3600:.0f} reference hours")
    print(f"{'case':<34} {'time':>12} {'x goal':>8} {'unassigned':>10} {'makespan h':>10} {'cost USD':>10}")
    for per_type in (20, 60):
        bins = catalogue_bins(per_type)
        t_lower_s = sizes.sum() / sum(b.capacity_per_s for b in bins)
        for factor in (1, 2):
            horizon_s = factor * 3600.0 * math.ceil(t_lower_s / 3600.0)
            targets = workload_targets(bins, float(sizes.sum()), horizon_s)
            seconds, a = best_time_s(lambda: ffd_with_targets(sizes, bins, targets), args.repeat)
            row(f"FFD {per_type}/type, T={horizon_s / 3600:.0f} h", seconds, a, hourly,
                f"{seconds / GOAL_FFD_S:.2f}")
        seconds, schedule = best_time_s(lambda: list_schedule(sizes, bins), 1)
        print(f"{f'list_schedule {per_type}/type (all)':<34} {seconds * 1000:>9.1f} ms {'':>8} {0:>10d} "
              f"{schedule.makespan_s / 3600:>10.2f} "
              f"{cost_usd(schedule.assignment, hourly, schedule.finish_s):>10.2f}")

    few = sizes[:args.fptas_tasks]
    bins = catalogue_bins(20)
    t_lower_s = few.sum() / sum(b.capacity_per_s for b in bins)
    for factor in (1, 4):
        horizon_s = factor * 3600.0 * math.ceil(t_lower_s / 3600.0)
        targets = workload_targets(bins, float(few.sum()), horizon_s)
        seconds, a = best_time_s(lambda: fptas_assign(few, bins, targets, args.eps, billing=hourly),
                                 args.repeat)
        row(f"FPTAS eps={args.eps} {few.size} tasks, T={horizon_s / 3600:.0f} h", seconds, a, hourly)
        seconds, a = best_time_s(lambda: ffd_with_targets(few, bins, targets), args.repeat)
        row("  FFD, same tasks and targets", seconds, a, hourly)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
