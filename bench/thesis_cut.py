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
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios as sc  # noqa: E402
from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.plan import Work, pareto_front  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402
from reproduce import cost_floor_usd  # noqa: E402

CUTS = (8, 9, 10, 11, 12, 13)
SIMULATED_CUTS = (8, 11)


def front(name: str, machines: int, hi: float, seed: int, tasks: int = sc.THESIS_TASKS):
    workload = sc.thesis_workload(name, seed, tasks=tasks, x_cut_hi=hi)
    est = workload.estimates_ref_s
    points = pareto_front(sc.thesis_inventory(machines).types, sc.thesis_inventory(machines).private,
                          Work(float(est.sum()), len(est), float(est.mean()), float(est.std())))
    return workload, points


def hd(hours: float, usd: float) -> str:
    return f"{hours:.1f}/{usd:.1f}"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", action="store_true", help="also run broker and List at point 2 (cuts 8, 11)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"seed {args.seed}; n = {sc.THESIS_TASKS:,}; hours/USD; x cut to [-2, hi]")
    header = ("scen.", "hi", "longest task", "work (m1.small h)", "best makespan", "point 2",
              "thesis best makespan", "thesis best cost")
    table = []
    for r in cut_rows(args.seed):
        paper_fast, paper_cheap = sc.THESIS_BEST_MAKESPAN[r.scenario][0], sc.THESIS_BEST_COST[r.scenario][0]
        table.append((r.scenario, f"{r.hi:g}", f"{r.longest_h:.1f} h", f"{r.work_h:,.0f}", hd(*r.best_makespan),
                      hd(*r.point2), hd(paper_fast.hours, paper_fast.usd), hd(paper_cheap.hours, paper_cheap.usd)))
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    if args.simulate:
        simulate(args.seed)
    return 0


def simulate(seed: int) -> None:
    print("\nPoint 2 in the simulator: ours vs List_eta on the same machines (Diff% = (List - ours) / ours)")
    print("scen.  hi   fleet                 ours          List          Diff%       cost floor")
    for name in ("LM", "LL"):
        inventory = sc.thesis_inventory(20)
        for hi in SIMULATED_CUTS:
            workload, points = front(name, 20, hi, seed)
            fleet = tuple(sorted((t, c) for t, c in points[1].fleet.items() if c > 0))
            used = sum(c for _, c in fleet) + len(inventory.private)
            runs = {}
            for policy, goal, config in (
                    ("broker", Goal("point", 2), ControllerConfig(policy="broker", tick_s=sc.THESIS_TICK_S)),
                    ("list", Goal("none", None), ControllerConfig(policy="list", eta=used, list_fleet=fleet,
                                                                  tick_s=sc.THESIS_TICK_S))):
                started = time.perf_counter()
                runs[policy] = Simulation(inventory, workload, goal, config, SimOptions(seed=seed)).run()
                print(f"  {name}20 hi={hi} {policy}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
            ours, lst = runs["broker"], runs["list"]
            diff_t = 100 * (lst.makespan_s - ours.makespan_s) / ours.makespan_s
            diff_c = 100 * (lst.cost_usd - ours.cost_usd) / ours.cost_usd
            fleet_s = "+".join(f"{c}{t.split('.')[1][:2]}" for t, c in fleet)
            print(f"{name}20   {hi:<4g} {fleet_s:<21} {hd(ours.makespan_s / 3600, ours.cost_usd):<13} "
                  f"{hd(lst.makespan_s / 3600, lst.cost_usd):<13} {diff_t:+.1f}/{diff_c:+.1f}   "
                  f"${cost_floor_usd(inventory, workload):,.1f}")


if __name__ == "__main__":
    sys.exit(main())
