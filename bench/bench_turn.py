"""The master's decision turn against the fleet's size (issue 20: 2 ms or less at 1,000 nodes).

    python3 bench/bench_turn.py [--nodes 16,128,1000,4000] [--tasks-per-slot 6] [--virtual-h 1.5]

A turn is what the daemon's loop does after events arrive (``RunLoop._decide``): the
ledger's snapshot and ``Controller.decide``; a dispatch turn (``tick=False``) follows every
batch of results, a tick turn (re-plan, fleet, releases) comes once a monitoring interval.
Both are measured inside the simulator, which drives the very same ledger and controller
with the events a fleet of that size produces: two types of 4 slots a machine (speed 1 and
2, the same price per speed), ``nodes / 2`` of each, hourly billing, the fastest plan (theta
0, so the whole fleet is launched), the LM workload with ``tasks-per-slot`` tasks a slot, the first ``virtual-h``
hours of the run. Turns are counted once at least 90% of the nodes are up. Prints the
median, mean and 99th percentile of each kind of turn in CPU time (``time.process_time``:
on a loaded machine wall time counts the other processes' turns too), and the share of a
CPU the process got.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from broker.core.billing import Billing  # noqa: E402
from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.model import Inventory, MachineType  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402
from broker.sim.workloads import BUILTIN, build_workload  # noqa: E402

CATALOGUE = [("slow", 1.0, 0.10), ("fast", 2.0, 0.20)]  # same price per speed: the fastest plan takes them all


def measure(nodes: int, tasks_per_slot: int, virtual_h: float, seed: int) -> dict:
    per_type = max(1, nodes // len(CATALOGUE))
    types = tuple(MachineType(n, 4, s, p, per_type, 60.0, Billing.hourly()) for n, s, p in CATALOGUE)
    fleet = per_type * len(CATALOGUE)
    wl = build_workload(BUILTIN["LM"], seed, tasks=tasks_per_slot * 4 * fleet)
    sim = Simulation(Inventory(types=types), wl, Goal("theta", 0.0), ControllerConfig(),
                     SimOptions(seed=seed, max_virtual_s=virtual_h * 3600.0))
    turns: dict[bool, list[float]] = {False: [], True: []}
    snapshot, decide = sim.snapshot, sim.controller.decide
    pending: list = []

    def timed_snapshot():
        t0 = time.process_time()
        snap = snapshot()
        pending.append((time.process_time() - t0, len(snap.nodes)))
        return snap

    def timed_decide(snap, memory, now=None, rng=None, tick=True):
        t0 = time.process_time()
        d = decide(snap, memory, now, rng, tick)
        took = time.process_time() - t0
        snap_s, live = pending.pop() if pending else (0.0, len(snap.nodes))
        if live >= 0.9 * fleet:
            turns[tick].append(snap_s + took)
        return d

    sim.snapshot, sim.controller.decide = timed_snapshot, timed_decide
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sim.run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0

    def q(xs, p):
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1e3 if xs else float("nan")

    return {"nodes": fleet, "dispatch": turns[False], "tick": turns[True], "share": cpu / wall if wall else 0.0,
            "d50": q(turns[False], 0.5), "d99": q(turns[False], 0.99), "t50": q(turns[True], 0.5),
            "mean": statistics.fmean(turns[False]) * 1e3 if turns[False] else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="16,128,1000,4000")
    ap.add_argument("--tasks-per-slot", type=int, default=6)
    ap.add_argument("--virtual-h", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"$ python3 bench/bench_turn.py --nodes {args.nodes} --tasks-per-slot {args.tasks_per_slot} "
          f"--virtual-h {args.virtual_h}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("goal (issue 20): a decision turn at 1,000 nodes <= 2 ms")
    print(f"{'nodes':>6} {'dispatch turns':>14} {'median ms':>10} {'mean ms':>8} {'p99 ms':>8} "
          f"{'tick turns':>10} {'tick median ms':>15} {'cpu/wall':>8}")
    for n in (int(x) for x in args.nodes.split(",")):
        r = measure(n, args.tasks_per_slot, args.virtual_h, args.seed)
        print(f"{r['nodes']:>6} {len(r['dispatch']):>14} {r['d50']:>10.3f} {r['mean']:>8.3f} {r['d99']:>8.3f} "
              f"{len(r['tick']):>10} {r['t50']:>15.1f} {r['share']:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
