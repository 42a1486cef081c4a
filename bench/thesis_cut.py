"""Where the thesis's bag sits: our front for LM and LL as the tail cut moves.

    python3 bench/thesis_cut.py [--simulate] [--seed 1]

The thesis draws task lengths of 2^x minutes with x ~ N(m, 3) (Table 6.3) and does not say
where it cut the normal's tail; ``bench/reproduce.py`` cuts x to [-2, 8] (15 s to 256 min).
For each upper cut this prints the longest task, the bag's work and our front's best-makespan
point and point 2 (the report's best-cost point), next to the thesis's Tables 6.4 and 6.5, so
that one can see which tail the thesis's dollars imply. With ``--simulate`` it also runs our
broker and List_eta on the same machines at point 2 (n = 100,000, estimates within 10%) for
cuts 8 and 11, with the cost floor, to show whether a longer tail opens the gap the thesis
reports between List and us.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reproduce as rp  # noqa: E402
import scenarios as sc  # noqa: E402
from broker.core.plan import Work, pareto_front  # noqa: E402

CUTS = (8, 9, 10, 11, 12, 13)
SIMULATED_CUTS = (8, 11)


def front(name: str, machines: int, hi: float, seed: int, tasks: int = sc.THESIS_TASKS):
    workload = sc.thesis_workload(name, seed, tasks=tasks, x_cut_hi=hi)
    est = workload.estimates_ref_s
    inventory = sc.thesis_inventory(machines)
    points = pareto_front(inventory.types, inventory.private,
                          Work(float(est.sum()), len(est), float(est.mean()), float(est.std())))
    return workload, points


@dataclass(frozen=True, slots=True)
class CutRow:
    scenario: str
    hi: float
    longest_h: float
    work_h: float  # the bag's true work in m1.small hours
    best_makespan: tuple[float, float]  # hours, USD
    point2: tuple[float, float]


def cut_rows(seed: int, tasks: int = sc.THESIS_TASKS, cuts=CUTS) -> list[CutRow]:
    rows = []
    for name in ("LM", "LL"):
        for machines in (20, 60):
            for hi in cuts:
                workload, points = front(name, machines, hi, seed, tasks)
                fast, second = points[0], points[min(1, len(points) - 1)]
                rows.append(CutRow(f"{name}{machines}", hi, workload.runtimes_ref_s.max() / 3600,
                                   workload.runtimes_ref_s.sum() / 3600,
                                   (fast.makespan_s / 3600, fast.cost_usd), (second.makespan_s / 3600, second.cost_usd)))
    return rows


def hours_usd(point: tuple[float, float]) -> str:
    return rp.hd(point[0] * 3600, point[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", action="store_true", help="also run broker and List at point 2 (cuts 8, 11)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = [[r.scenario, f"{r.hi:g}", f"{r.longest_h:.1f} h", f"{r.work_h:,.0f}", hours_usd(r.best_makespan),
             hours_usd(r.point2), rp.paper_hd(sc.THESIS_BEST_MAKESPAN[r.scenario][0]),
             rp.paper_hd(sc.THESIS_BEST_COST[r.scenario][0])] for r in cut_rows(args.seed)]
    rp.table(f"Our front as the tail cut moves (seed {args.seed}; n = {sc.THESIS_TASKS:,}; hours/USD; x cut to "
             "[-2, hi])", ["scen.", "hi", "longest task", "work (m1.small h)", "best makespan", "point 2",
                           "thesis best makespan", "thesis best cost"], rows)
    if args.simulate:
        simulate(args.seed)
    return 0


def simulate(seed: int) -> None:
    rows = []
    for name in ("LM", "LL"):
        inventory = sc.thesis_inventory(20)
        for hi in SIMULATED_CUTS:
            workload, points = front(name, 20, hi, seed)
            fleet = tuple(sorted((t, c) for t, c in points[1].fleet.items() if c > 0))
            base = rp.RunSpec("thesis", f"{name}20", "broker", "point 2", "point", 2, x_cut_hi=hi, machines=20,
                              seed=seed)
            ours = rp.simulate(base)
            lst = rp.simulate(replace(base, policy="list", goal_kind="none", goal_value=None,
                                      eta=sum(c for _, c in fleet) + len(inventory.private), list_fleet=fleet))
            print(f"  {name}20 hi={hi}: ours {ours.sim_wall_s:.1f} s, List {lst.sim_wall_s:.1f} s",
                  file=sys.stderr, flush=True)
            rows.append([f"{name}20", f"{hi:g}", rp.fleet_label(dict(fleet)), rp.cell(ours), rp.cell(lst),
                         f"{rp.pct(lst.makespan_s, ours.makespan_s):+.1f}/{rp.pct(lst.cost_usd, ours.cost_usd):+.1f}",
                         f"${rp.cost_floor_usd(inventory, workload):,.1f}"])
    rp.table("Point 2 in the simulator: ours vs List_eta on the same machines (Diff% = (List - ours) / ours)",
             ["scen.", "hi", "fleet", "ours", "List", "Diff%", "cost floor"], rows)


if __name__ == "__main__":
    sys.exit(main())
