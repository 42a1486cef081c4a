"""How often the makespan interval under interruptions (broker/core/plan/spotplan.plan_risk)
holds a task-level simulation of the plan (tests/test_plan_spot.py's ``simulate_run``: spot
instances interrupted at their rate, running tasks re-queued, a replacement after its boot).

    python3 bench/spot_coverage.py [--seeds 400]

Per interruption rate: the share of runs within the one-sided 90% quantile (the deadline
test) and within the two-sided 90% interval, the runs' median over the model's, and the
interval's width.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import numpy as np  # noqa: E402

from broker.core.plan import PlanOptions, Work  # noqa: E402
from broker.core.plan.capacity import Catalogue  # noqa: E402
from broker.core.plan.spotplan import plan_risk, spot_min_cost  # noqa: E402
from test_plan_spot import od, simulate_run, spot  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=400)
    args = ap.parse_args()
    n, task_s = 3000, 300.0
    work = Work(n * task_s, n, task_s, 0.0)
    print(f"{n} tasks of {task_s:.0f} s, deadline 8h, boot 120 s, {args.seeds} seeds")
    print(f"{'rate/h':>7} {'spot':>5} {'held 90% q':>11} {'in 90% int':>11} {'median sim/model':>17} {'width':>7}")
    for rate in (0.2, 1.0, 3.0):
        types = [od(limit=10, price=0.17), spot(limit=30, price=0.05, rate=rate, boot=120.0)]
        plan = spot_min_cost(types, [], work, 8 * 3600)
        catalogue = Catalogue.build(types, [], work, (), 0.0, PlanOptions())
        risk = plan_risk(plan, catalogue, work, confidence=0.9)
        runs = np.array([simulate_run(plan, catalogue, n, task_s, seed) for seed in range(args.seeds)])
        lo, hi = risk.makespan_s_range
        print(f"{rate:>7.1f} {plan.fleet.get('c5.xlarge@spot', 0):>5} {np.mean(runs <= risk.makespan_hold_s):>11.1%} "
              f"{np.mean((runs >= lo) & (runs <= hi)):>11.1%} {np.median(runs) / risk.makespan_s:>17.4f} "
              f"{(hi - lo) / risk.makespan_s:>7.1%}")


if __name__ == "__main__":
    main()
