"""Simulator speed: 100,000 tasks on 200 machines over days of virtual time.

    python3 bench/bench_sim.py [--tasks 100000] [--per-type 50] [--policies rr,broker]

Thesis catalogue (m1.small, c1.medium, m1.large, c1.xlarge; 50 of each = 200 machines,
hourly billing) plus the private Xeon, the thesis LM workload (2^x minutes, x ~ N(1.8, 3)
cut to [-2, 8]). Prints virtual makespan, wall time and the ratio of virtual to wall time.
Goal (issue 4): <= 30 s of wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    args = ap.parse_args()
    print(f"$ python3 bench/bench_sim.py --tasks {args.tasks} --per-type {args.per_type} --policies {args.policies}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    types = tuple(MachineType(n, 1, s, p, args.per_type, 60.0, Billing.hourly()) for n, s, p in CATALOGUE)
    inv = Inventory(private=(PrivateNode("xeon", 1, 10.0, 0.32, local=True),), types=types)
    t0 = time.perf_counter()
    wl = build_workload(BUILTIN["LM"], args.seed, tasks=args.tasks)
    print(f"workload LM: {args.tasks} tasks, built in {time.perf_counter() - t0:.2f}s; "
          f"{len(types) * args.per_type} EC2 machines + 1 private")
    print(f"{'policy':<8} {'goal':<10} {'virtual makespan':>17} {'cost':>9} {'launched':>9} {'wall s':>8} {'virtual/wall':>13}")
    for policy in args.policies.split(","):
        goal = Goal("point", 1) if policy == "broker" else Goal()
        r = Simulation(inv, wl, goal, ControllerConfig(policy=policy), SimOptions(seed=args.seed)).run()
        print(f"{policy:<8} {goal.kind:<10} {r.makespan_s / 3600:>15.1f} h {r.cost_usd:>8.2f}$ {r.instances_launched:>9} "
              f"{r.sim_wall_s:>8.2f} {r.makespan_s / r.sim_wall_s:>12.0f}x  "
              f"({r.tasks_done}/{r.tasks_total} done)")


if __name__ == "__main__":
    main()
