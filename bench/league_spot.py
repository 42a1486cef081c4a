"""The league's spot scenario (issue 21, Must show): thesis LM work on the thesis catalogue,
each type also offered on spot at 30% of its on-demand price.

    python3 bench/league_spot.py [--seeds 50] [--tasks 2000] [--jobs 2] [--quick]

Inventory: the thesis catalogue's EC2 types (``bench/scenarios.py``: m1.small, c1.medium,
m1.large, c1.xlarge, 20 of each, hourly) plus a spot offer of each type at 30% of its price,
billed per second as EC2 bills spot, 20 of each. Without the thesis's private xeon: it is the
most cost-efficient machine there, so the on-demand front's knee is a day-long run on it alone
(26 h for $8.40 with 1,000 tasks, nothing rented), and there is no cloud spend to save. Work: thesis LM (2^x minutes,
x ~ N(1.8, 3) cut to [-2, 8]) with per-task estimates within 10%. The deadline is the knee
of the *on-demand* front (its last printed point, planned on the estimates), the same for
both runs of a seed.

For each seed, two runs of the same bag through the same controller and simulator:

- ``on-demand``: the broker on the catalogue without spot offers (its on-demand-only plan,
  delivered);
- ``spot``: the broker on the catalogue with them, spot interruptions on.

Case A: 5% interruptions an hour per spot instance (Poisson, two-minute notice).
Case B: 20% an hour, and a correlated loss: the spot type with the most instances is lost at
once (every instance of it, notice then termination, and no capacity for it for an hour) at a
moment drawn uniformly in the first 60% of the deadline (spot runs end at 70-95% of it:
a loss drawn later may come after the run is over, and test nothing).

Goal lines (PASS/MISS with figures): A: the spot run's mean cost at least 40% below the
on-demand run's; A and B: the deadline met in at least 1 - delta (delta = 0.1: the
controller's confidence 0.9) of the seeds. B also reports the fallback's cost: what the spot
run spent on on-demand instances. Every interruption counted is checked to have fired (a
case with none would test nothing). Nothing is asserted: it prints.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import scenarios as sc  # noqa: E402
from broker.core.billing import Billing  # noqa: E402
from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.model import Inventory, spot_key  # noqa: E402
from broker.core.plan import Work, plan_front  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402
from broker.sim.spot import SpotFaults  # noqa: E402

SPOT_SHARE = 0.30  # spot price / on-demand price
CONFIDENCE = 0.9
MAX_VIRTUAL_S = 60 * 86400.0
LOSS_WITHIN = 0.6  # the correlated loss comes uniformly in this share of the deadline
CASES = {"A": 0.05, "B": 0.20}  # interruptions an hour


def inventories(machines: int = 20) -> tuple[Inventory, Inventory]:
    """(on-demand only, with spot offers); EC2 only (see the module docstring)."""
    od = Inventory(types=sc.thesis_inventory(machines).types)
    spot = tuple(replace(t, name=spot_key(t.name), price_per_hour=t.price_per_hour * SPOT_SHARE,
                         billing=Billing.per_second(), market="spot", ec2_type=t.name, interruptions_per_hour=0.0)
                 for t in od.types)
    return od, Inventory(private=od.private, types=od.types + spot)


def with_rate(inv: Inventory, rate: float) -> Inventory:
    return Inventory(private=inv.private, types=tuple(replace(t, interruptions_per_hour=rate) if t.is_spot else t
                                                      for t in inv.types))


def workload(seed: int, tasks: int):
    return sc.thesis_workload("LM", seed, tasks=tasks, estimate_error=0.1)


def knee_deadline_s(seed: int, tasks: int) -> float:
    od, _ = inventories()
    e = workload(seed, tasks).estimates_ref_s
    front = plan_front(od.types, od.private, Work(float(e.sum()), len(e), float(e.mean()), float(e.std())))
    return float(front.points[-1].makespan_s)


@dataclass(frozen=True)
class Spec:
    case: str
    market: str  # on-demand | spot
    seed: int
    tasks: int
    deadline_s: float


@dataclass
class Row:
    spec: Spec
    makespan_s: float = math.nan
    cost_usd: float = math.nan
    planned_cost_usd: float | None = None
    done: int = 0
    total: int = 0
    spot: dict | None = None
    faults: dict | None = None
    loss_at_s: float | None = None
    wall_s: float = 0.0
    error: str | None = None

    @property
    def met(self) -> bool:
        return self.error is None and self.done == self.total and self.makespan_s <= self.spec.deadline_s + 1e-6


def run(spec: Spec) -> Row:
    od, spot = inventories()
    inv = od if spec.market == "on-demand" else with_rate(spot, CASES[spec.case])

    faults = SpotFaults()
    loss_at = None
    if spec.case == "B" and spec.market == "spot":
        loss_at = float(np.random.default_rng(spec.seed + 77).uniform(0.0, LOSS_WITHIN * spec.deadline_s))
        faults = SpotFaults(loss_at_s=loss_at)
    t0 = time.perf_counter()
    try:
        sim = Simulation(inv, workload(spec.seed, spec.tasks), Goal("deadline", spec.deadline_s),
                         ControllerConfig(tick_s=sc.THESIS_TICK_S, confidence=CONFIDENCE),
                         SimOptions(seed=spec.seed, max_virtual_s=MAX_VIRTUAL_S, spot=faults))
        r = sim.run()
    except Exception as exc:  # a failing run is a row, not the end of the report
        return Row(spec, error=f"{type(exc).__name__}: {exc}")
    return Row(spec, r.makespan_s, r.cost_usd, r.planned_cost_usd, r.tasks_done, r.tasks_total, r.spot,
               {k: v for k, v in r.faults.items() if k.startswith("spot")}, loss_at, time.perf_counter() - t0)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(case: str, rows: list[Row], seeds: list[int]) -> list[str]:
    by = {(r.spec.market, r.spec.seed): r for r in rows if r.spec.case in (case, "OD")}
    od = [by[("on-demand", s)] for s in seeds]
    sp = [by[("spot", s)] for s in seeds]
    errors = [r for r in od + sp if r.error]
    rate = CASES[case]
    print(f"\n== case {case}: spot at {SPOT_SHARE:.0%} of on-demand, {rate:.0%} interruptions an hour"
          + (", a whole spot type lost at a random moment" if case == "B" else "") + f"; {len(seeds)} seeds")
    for r in errors:
        print(f"  ERROR {r.spec.market} seed {r.spec.seed}: {r.error}")
    ok_pairs = [(a, b) for a, b in zip(od, sp) if not a.error and not b.error]
    c_od = np.array([a.cost_usd for a, _ in ok_pairs])
    c_sp = np.array([b.cost_usd for _, b in ok_pairs])
    ratio = c_sp / c_od
    met_od = sum(a.met for a in od) / len(od)
    met_sp = sum(b.met for b in sp) / len(sp)
    ints = [b.spot["interruptions"] for b in sp if b.spot]
    lost = [b.spot["lost_work_ref_s"] / 3600 for b in sp if b.spot]
    fb = [b.spot["cost_usd_by_market"]["on-demand"] for b in sp if b.spot]
    fb_tasks = [b.spot["fallback_tasks"] for b in sp if b.spot]
    over = [b.makespan_s / b.spec.deadline_s - 1 for b in sp if not b.met and not b.error]
    print(f"  deadline (knee of the on-demand front): median {np.median([s.spec.deadline_s for s in sp]) / 3600:.2f} h")
    planned = [a.planned_cost_usd for a, _ in ok_pairs if a.planned_cost_usd is not None]
    print(f"  on-demand only: cost mean ${c_od.mean():.2f} (median ${np.median(c_od):.2f}; its first plan "
          f"${np.mean(planned):.2f}), deadline met {met_od:.0%}")
    print(f"  with spot:      cost mean ${c_sp.mean():.2f} (median ${np.median(c_sp):.2f}), deadline met "
          f"{met_sp:.0%}" + (f" (missed by {100 * max(over):.1f}% at most)" if over else ""))
    print(f"  cost spot / on-demand: mean of costs {c_sp.mean() / c_od.mean():.3f}, per seed median "
          f"{np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f})")
    print(f"  interruptions per run: mean {np.mean(ints):.1f} (min {min(ints)}, max {max(ints)}); work lost "
          f"{np.mean(lost):.2f} ref-h a run; tasks moved to on-demand {np.mean(fb_tasks):.1f} a run")
    print(f"  on-demand spend in the spot runs (the fallback, and what the plan puts there): mean "
          f"${np.mean(fb):.2f}, max ${max(fb):.2f}; spot spend mean "
          f"${np.mean([b.spot['cost_usd_by_market']['spot'] for b in sp if b.spot]):.2f}")
    print(f"  makespan with spot: median {np.median([b.makespan_s for b in sp]) / 3600:.2f} h, on-demand only "
          f"{np.median([a.makespan_s for a in od]) / 3600:.2f} h")
    lines = []
    # Interruptions are a Poisson process: a run with few spot instance-hours may see none.
    hit = sum(x > 0 for x in ints)
    lines.append(f"{verdict(hit > 0)} {case}: interruptions fired in {hit}/{len(ints)} spot runs, {sum(ints)} in all")
    if case == "B":
        unfired = [b for b in sp if b.faults and b.faults.get("spot_type_loss", 0) < 1]
        lines.append(f"{verdict(not unfired)} B: the correlated loss fired in {len(sp) - len(unfired)}/{len(sp)} "
                     f"spot runs" + "".join(f"; seed {b.spec.seed}: loss at {b.loss_at_s / 3600:.2f} h, run over "
                                            f"at {b.makespan_s / 3600:.2f} h" for b in unfired))
    if case == "A":
        saving = 1 - c_sp.mean() / c_od.mean()
        lines.append(f"{verdict(saving >= 0.40)} A: cost {saving:.1%} below the on-demand-only runs (goal >= 40%)")
    lines.append(f"{verdict(met_sp >= CONFIDENCE)} {case}: deadline met in {met_sp:.0%} of seeds with spot "
                 f"(goal >= {CONFIDENCE:.0%})")
    if case == "B":
        lines.append(f"INFO B: fallback (on-demand) cost mean ${np.mean(fb):.2f} a run; spot run costs "
                     f"{c_sp.mean() / c_od.mean():.3f} of on-demand only")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cases", default="AB")
    ap.add_argument("--quick", action="store_true", help="10 seeds of 1,000 tasks")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.tasks = 10, 1000
    seeds = list(range(1, args.seeds + 1))
    t0 = time.time()
    deadlines = {s: knee_deadline_s(s, args.tasks) for s in seeds}
    # one on-demand-only run a seed serves both cases (same bag, same deadline, no spot)
    specs = [Spec("OD", "on-demand", s, args.tasks, deadlines[s]) for s in seeds]
    specs += [Spec(case, "spot", s, args.tasks, deadlines[s]) for case in args.cases for s in seeds]
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(run, specs, chunksize=1))
    print(f"league_spot: {args.seeds} seeds of {args.tasks} LM tasks (10% estimate error), cases {args.cases}, "
          f"python {platform.python_version()}, load {os.getloadavg()[0]:.1f}, {time.time() - t0:.0f} s")
    lines = []
    for case in args.cases:
        lines += report(case, rows, seeds)
    print("\nGoal lines:")
    for line in lines:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
