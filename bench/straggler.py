"""Why a heavy-tailed bag misses its deadline, seed by seed (issues 15/16).

The bag of ``tests/test_control_deadline_tail.py``: 3,000 lognormal tasks (mean 980 s,
sigma 1.5, capped at a 6 h timeout), a free 8-slot private node, four hourly EC2 types
booting in 90-200 s, no estimates, no prior, a 9 h deadline. Per seed it prints: met or
missed, the makespan, the cost, the first promise (makespan point and 90% range), when the
pending queue emptied, when the first plan launched (``!``: it said the deadline was at risk
at the confidence), and the task that ended last: its start, its runtime, where it ran
(node type and speed), its attempt (>1: a relaunch or a replica), and its true size (in
reference seconds) and the bag's largest.

    python3 bench/straggler.py --seeds 30 [--tasks 3000] [--deadline 9h] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.sim.engine import END, SimOptions, Simulation  # noqa: E402
from tests.test_control_deadline_tail import heavy_tailed_bag, issue_fleet  # noqa: E402


class Traced(Simulation):
    """A simulation that remembers where and when each attempt started."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.starts: dict[tuple[str, int], tuple[float, str, bool]] = {}
        self.last = None
        self.queue_empty_s = None
        self.replicas = 0
        self.first_launch = None  # (virtual s, cause) of the first plan's launches

    def _launch(self, a) -> None:
        if self.first_launch is None:
            self.first_launch = (self.now, a.cause.value)
        super()._launch(a)

    def _start(self, a) -> None:
        super()._start(a)
        att = max(k[1] for k in self._exec if k[0] == a.task_id)
        self.starts[(a.task_id, att)] = (self.now, a.slot.node, type(a).__name__ == "Replicate")
        self.replicas += type(a).__name__ == "Replicate"
        if self.queue_empty_s is None and len(self.ledger.pool) == 0:
            self.queue_empty_s = self.now

    def _on_end(self, data) -> bool:
        changed = super()._on_end(data)
        node_id, _slot, task, attempt = data
        if changed and self.result.completions.get(task):
            self.last = (task, attempt, node_id)
        return changed

    _HANDLERS = {**Simulation._HANDLERS, END: _on_end}


def one(seed: int, tasks: int, deadline_s: float) -> dict:
    sim = Traced(issue_fleet(), heavy_tailed_bag(tasks, seed), Goal("deadline", deadline_s), ControllerConfig(),
                 SimOptions(seed=seed))
    t0 = time.process_time()
    r = sim.run()
    cpu = time.process_time() - t0
    task, attempt, node_id = sim.last
    start, _, replica = sim.starts[(task, attempt)]
    node = sim.ledger.nodes[node_id]
    p = r.promise
    return dict(seed=seed, met=r.makespan_s <= deadline_s and r.tasks_done == r.tasks_total, makespan_h=r.makespan_s / 3600,
                cost=r.cost_usd, p_h=None if p is None else p.makespan_s / 3600,
                p_range=None if p is None or p.makespan_s_range is None else tuple(x / 3600 for x in p.makespan_s_range),
                p_cost=None if p is None else p.cost_usd, queue_empty_h=(sim.queue_empty_s or 0) / 3600,
                last_start_h=start / 3600, last_run_h=(r.makespan_s - start) / 3600,
                last_node=(node.type.name if node.type is not None else node.id), last_speed=node.speed,
                last_attempt=attempt, last_replica=replica, last_size_h=sim.truth[sim.index[task]] / 3600,
                max_size_h=float(sim.truth.max()) / 3600, second_last_h=(r.second_last_end_s or 0) / 3600,
                replicas=sim.replicas, plan_h=(sim.first_launch or (0.0, ""))[0] / 3600,
                at_risk=(sim.first_launch or (0.0, ""))[1] == "deadline_at_risk", cpu_s=cpu, wasted_h=r.wasted_ref_s / 3600)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--deadline", type=float, default=9.0, help="hours")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    with ProcessPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, seeds, [a.tasks] * a.seeds, [a.deadline * 3600] * a.seeds))
    print(f"{a.tasks} tasks lognormal sigma 1.5 (6 h cap), deadline {a.deadline:g} h; hours unless marked")
    print("seed  met   span  cost$  plan  promise(90%)          p$    qEmpty  2ndLast | last: start  run  node     spd"
          "  att rep  size  | maxSize repl wasted cpu_s")
    for d in rows:
        pr = "-" if d["p_range"] is None else f"{d['p_h']:5.2f} ({d['p_range'][0]:5.2f}-{d['p_range'][1]:5.2f})"
        print(f"{d['seed']:4d}  {'met ' if d['met'] else 'MISS'} {d['makespan_h']:5.2f} {d['cost']:6.2f} {d['plan_h']:4.2f}{'!' if d['at_risk'] else ' '}{pr:21s} "
              f"{d['p_cost'] or 0:6.2f}  {d['queue_empty_h']:5.2f}  {d['second_last_h']:5.2f}  | "
              f"{d['last_start_h']:5.2f} {d['last_run_h']:5.2f} {d['last_node']:8s} {d['last_speed']:3.1f}"
              f"  {d['last_attempt']:2d}  {'R' if d['last_replica'] else '-'}  {d['last_size_h']:5.2f} | "
              f"{d['max_size_h']:5.2f} {d['replicas']:4d} {d['wasted_h']:6.1f} {d['cpu_s']:5.1f}")
    met = sum(d["met"] for d in rows)
    promised = [d for d in rows if d["p_range"] is not None and d["p_range"][1] <= a.deadline]
    risk = [d for d in rows if d["at_risk"]]
    print(f"first plan said 'deadline at risk' (!) in {len(risk)}, of which met {sum(d['met'] for d in risk)}")
    print(f"met {met}/{len(rows)}; promised (90% upper <= deadline) {len(promised)}, of which met "
          f"{sum(d['met'] for d in promised)}; mean cost ${sum(d['cost'] for d in rows) / len(rows):.2f}; "
          f"cpu {sum(d['cpu_s'] for d in rows):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
