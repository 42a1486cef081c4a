"""Planning on spot (issue 21, part 2): what a mixed plan is expected to save against the
on-demand-only plan for the same goal, and what holding the deadline and the fallback cost.

The thesis catalogue (examples/thesis-catalogue.yaml, hourly on-demand, the private Xeon left
out so that the cloud decides) with each type also offered on spot at ``--spot-share`` of its
price (per-second, capped at the on-demand price), at 5% and 20% interruptions an hour; LM-like
work (17 min mean, sd 8.5 min). The deadline is the knee of the on-demand-only front (its theta
0.5 point); the budget is what the on-demand-only plan costs at that deadline.

    python3 bench/bench_spotplan.py [--tasks 20000] [--spot-share 0.3]

Prints per rate: the on-demand-only cost at the deadline, the mixed plan's expected cost and
saving, its makespan's 90% quantile under interruptions against the deadline, the fallback's
worst extra cost and whether every whole-type loss is recoverable, and the planning time; then
the budget: makespans of both plans within the same budget, and the mixed plan's worst case,
with spot counted at its cap (the on-demand price: no faster than on-demand) and without one
(counted at its price).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from broker.core.billing import Billing  # noqa: E402
from broker.core.model import SPOT, spot_key  # noqa: E402
from broker.core.plan import Goal, Work, choose_theta, min_cost, plan_front, plan_for_goal  # noqa: E402
from broker.core.plan.spotplan import on_demand_only  # noqa: E402
from broker.core.plan.spotsummary import spot_summary  # noqa: E402
from broker.core.units import format_duration  # noqa: E402


def catalogue(spot_share: float, rate: float):
    from broker.config.inventory import load_inventory

    inv = load_inventory(os.path.join(os.path.dirname(__file__), "..", "examples", "thesis-catalogue.yaml"))
    types = list(inv.types)
    types += [dataclasses.replace(t, name=spot_key(t.name), ec2_type=t.name, market=SPOT,
                                  price_per_hour=t.price_per_hour * spot_share, max_price_per_hour=t.price_per_hour,
                                  billing=Billing.per_second(), interruptions_per_hour=rate, boot_s=90.0)
              for t in inv.types]
    return types


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--spot-share", type=float, default=0.3)
    args = ap.parse_args()
    mean, sd = 17 * 60.0, 8.5 * 60.0
    work = Work(args.tasks * mean + 1.645 * sd * args.tasks ** 0.5, args.tasks, mean, sd)
    print(f"{args.tasks} tasks x 17m (sd 8.5m); spot at {args.spot_share:.0%} of the on-demand price")
    for rate in (0.05, 0.2):
        types = catalogue(args.spot_share, rate)
        od_types = on_demand_only(types)
        knee = choose_theta(plan_front(od_types, (), work).with_cheapest(), 0.5)
        deadline = knee.makespan_s
        od = min_cost(od_types, (), work, deadline)
        started = time.perf_counter()
        plan = plan_for_goal(types, (), work, Goal("deadline", deadline))
        solve_s = time.perf_counter() - started
        s = spot_summary(plan, types, (), work, Goal("deadline", deadline))
        print(f"\ninterruptions {rate:.0%}/h, deadline {format_duration(deadline)} (knee of the on-demand front)")
        print(f"  on-demand only: ${od.cost_usd:,.2f} ({format_duration(od.makespan_s)})")
        if s is None:
            print(f"  mixed plan rents no spot: ${plan.cost_usd:,.2f}  [{solve_s:.2f} s]")
            continue
        fleet = ", ".join(f"{n} {k}" for k, n in plan.fleet.items() if n)
        print(f"  mixed: {fleet}")
        print(f"  expected ${s.expected_cost_usd:,.2f}: {100 * s.savings_share:.1f}% below on-demand only; "
              f"makespan 90% quantile {format_duration(s.risk.makespan_hold_s)} "
              f"({'within' if s.risk.makespan_hold_s <= deadline else 'PAST'} the deadline)")
        print(f"  fallback: worst extra ${s.fallback_usd:,.2f}, every whole-type loss recoverable: "
              f"{all(t.feasible for t in s.triggers)}; worst case ${s.worst_case_usd:,.2f}  [plan {solve_s:.2f} s]")
        budget = od.cost_usd
        od_b = plan_for_goal(od_types, (), work, Goal("budget", budget))
        for capped in (True, False):
            offered = types if capped else [dataclasses.replace(t, max_price_per_hour=None) for t in types]
            started = time.perf_counter()
            b = plan_for_goal(offered, (), work, Goal("budget", budget))
            solve_s = time.perf_counter() - started
            sb = spot_summary(b, offered, (), work, Goal("budget", budget))
            worst = b.cost_usd if sb is None else sb.worst_case_usd
            print(f"  budget ${budget:,.2f}, spot {'capped at the on-demand price' if capped else 'without a cap'}: "
                  f"on-demand only {format_duration(od_b.makespan_s)}, mixed {format_duration(b.makespan_s)} "
                  f"({sum(n for k, n in b.fleet.items() if k.endswith('@spot'))} spot; worst case ${worst:,.2f})"
                  f"  [plan {solve_s:.2f} s]")


if __name__ == "__main__":
    main()
