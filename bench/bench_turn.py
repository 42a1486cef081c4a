"""The master's decision turn against the fleet's size (issue 20: 2 ms or less at 1,000 nodes).

    python3 bench/bench_turn.py [--nodes 16,128,1000,4000] [--tasks-per-slot 6] [--virtual-h 1.5]
    python3 bench/bench_turn.py --batches 10,100,500 [--nodes 100,1000,4000]

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

With ``--batches``: the daemon's case, where one turn brings many results at once (``broker
run`` drains up to 1,000 inbox messages a turn: at 1,000 fast agents, 500 results and 500
starts) and its decision hands out as many tasks. The same ledger and controller, driven
directly: private nodes of 4 slots (speed 1), tasks without estimates, every turn the ``K``
oldest running attempts end and one decision (snapshot + decide, CPU) follows. Printed per
fleet size and ``K``: the median decision of busy turns (tasks pending) with the starts it
made, its 95th percentile, and the median decision of tail turns (nothing pending). A
decision that costs in proportion to what changed, not to the fleet, shows the same figure
down a column of ``K``.
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


def batched(nodes: int, per_turn: int, seed: int) -> dict:
    """The decisions of a run where ``per_turn`` results arrive every turn (see the docstring)."""
    import numpy as np

    from broker.core.control.actions import Assign, Replicate
    from broker.core.control.ledger import Ledger
    from broker.core.control.snapshot import Memory
    from broker.core.model import PrivateNode
    from broker.core.control.controller import Controller

    ledger = Ledger({}, tick_s=60.0)
    tasks = max(12000, 12 * nodes)
    ledger.add_tasks([(f"t{i:07d}", None) for i in range(tasks)], np.random.default_rng(seed).permutation(tasks))
    for i in range(nodes):
        ledger.add_private(PrivateNode(f"n{i:04d}", 4, local=False, host="fake"))
        ledger.on_node_ready(f"n{i:04d}", 0.0)
    ctl, memory, rng = Controller(Goal(), ControllerConfig(tick_s=60.0, margin_s=120.0)), Memory(), np.random.default_rng(seed)
    running, busy, tail, now = [], [], [], 0.0
    while not ledger.finished:
        now += 0.05
        t0 = time.process_time()
        snap = ledger.snapshot(now)
        d = ctl.decide(snap, memory, now, rng, tick=False)
        took = time.process_time() - t0
        memory = d.memory
        starts = [a for a in d.actions if isinstance(a, (Assign, Replicate))]
        for a in starts:
            attempt = ledger.start(a.task_id, a.slot.node, a.slot.index, now, replica=isinstance(a, Replicate))
            if attempt is not None:
                running.append(attempt)
        if len(snap.pending) and snap.count_running():  # not the first turn, which fills every slot
            busy.append((took, len(starts)))
        elif not len(snap.pending):
            tail.append(took)
        ended, running = running[:per_turn], running[per_turn:]
        now += 0.01
        for a in ended:
            ledger.on_result(a.node, a.task_id, a.attempt, now, runtime_s=0.01)

    def q(xs, p):
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1e3 if xs else float("nan")

    return {"busy": len(busy), "b50": q([t for t, _ in busy], 0.5), "b95": q([t for t, _ in busy], 0.95),
            "starts": statistics.median(k for _, k in busy) if busy else 0, "tail": len(tail), "t50": q(tail, 0.5)}


def main_batches(args) -> None:  # noqa: ANN001
    print(f"$ python3 bench/bench_turn.py --batches {args.batches} --nodes {args.nodes}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("one decision (ledger snapshot + controller decide) in CPU ms, K results a turn")
    print(f"{'nodes':>6} {'K':>5} {'busy turns':>10} {'starts':>7} {'median ms':>10} {'p95 ms':>8} "
          f"{'tail turns':>10} {'tail median ms':>14}")
    for n in (int(x) for x in args.nodes.split(",")):
        for k in (int(x) for x in args.batches.split(",")):
            r = batched(n, k, args.seed)
            print(f"{n:>6} {k:>5} {r['busy']:>10} {r['starts']:>7.0f} {r['b50']:>10.3f} {r['b95']:>8.3f} "
                  f"{r['tail']:>10} {r['t50']:>14.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="16,128,1000,4000")
    ap.add_argument("--tasks-per-slot", type=int, default=6)
    ap.add_argument("--virtual-h", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batches", default=None, help="K results a turn (comma list): the daemon's batched turns")
    args = ap.parse_args()
    if args.batches:
        main_batches(args)
        return
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
