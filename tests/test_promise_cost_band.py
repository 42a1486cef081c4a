"""The promise's cost interval counts the work's uncertainty once (issue 16: "the interval is
useful: its median width is at most 10% of the point on bags of 10,000 tasks or more").

Each bound of a promise is moved out by the controller's hysteresis band times what is left
(``Forecast.promise``'s tolerance). For the makespan that is real (the fleet is not changed
for a change of the work inside the band). The forecast's cost already carries the work's
mean error and spread, so after the first promise the cost's own tolerance is
``hysteresis_min`` (``promises.cost_tolerance``), unless the forecast's cost interval spans
fewer than two of the priciest instance-hours (a settled fleet). Before, the cost interval at 10% done was
2.3x the floor 2 z cv / sqrt(n) and held the delivered cost in 100% of runs
(bench/results/promises.txt)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.promises import cost_tolerance
from broker.core.control.snapshot import Goal
from broker.core.model import MachineType
from broker.core.plan.promise import Forecast
from broker.sim.engine import SimOptions, Simulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import promises as bench  # noqa: E402  (the scenarios of bench/promises.py)


def test_the_cost_tolerance_is_the_band_at_the_first_promise_or_on_a_settled_fleet_else_the_floor():
    ctl = SimpleNamespace(config=ControllerConfig())
    snap = SimpleNamespace(types={"c1.xlarge": MachineType("c1.xlarge", 1, 20.0, 0.66, 20, 0.0, Billing.hourly()),
                                  "m1.small": MachineType("m1.small", 1, 1.0, 0.08, 20, 0.0, Billing.hourly())})
    spread = Forecast(np.zeros(101), np.linspace(100.0, 120.0, 101))  # 90%: $101-$119, 27 c1.xlarge hours
    settled = Forecast(np.zeros(101), np.linspace(18.0, 19.0, 101))  # 90%: $18.05-$18.95, under 2 of them
    first, later = SimpleNamespace(first_promise=None), SimpleNamespace(first_promise=object())
    assert cost_tolerance(ctl, snap, first, spread, 0.15) == 0.15
    assert cost_tolerance(ctl, snap, later, spread, 0.15) == ctl.config.hysteresis_min
    assert cost_tolerance(ctl, snap, later, spread, 0.005) == 0.005
    assert cost_tolerance(ctl, snap, later, settled, 0.03) == 0.03


def test_a_cost_tolerance_moves_only_the_cost_bounds():
    f = Forecast(np.linspace(10_000.0, 12_000.0, 101), np.linspace(100.0, 120.0, 101), elapsed_s=2_000.0,
                 spent_usd=10.0)
    both = f.promise(0.9, tolerance=0.1)
    own = f.promise(0.9, tolerance=0.1, cost_tolerance=0.0)
    assert own.makespan_s_range == both.makespan_s_range
    assert own.cost_usd_range == pytest.approx((101.0, 119.0))
    assert both.cost_usd_range == pytest.approx((101.0 - 0.1 * 91.0, 119.0 + 0.1 * 109.0))


@pytest.mark.slow
def test_the_cost_interval_at_a_tenth_done_is_narrower_and_still_holds():
    """bench/promises.py's bimodal bag (half 5 min, half 60 min; a free 8-slot node and four
    hourly types booting in 90-200 s), 3,000 tasks, 10 h deadline, seeds 1-8: the promise made
    once 10% is done was a median 26.3% wide in cost (hysteresis band counted on top of the
    forecast's own spread), 12.2% now; the delivered cost and makespan lie inside it in all
    8 runs either way."""
    tasks, seeds = 3_000, range(1, 9)
    inv, _ = bench.build("bimodal", 10, 0)
    deadline = bench.deadline_for(inv, bench.expected_work("bimodal", tasks))
    widths, cost_in, time_in = [], [], []
    for seed in seeds:
        inv, wl = bench.build("bimodal", tasks, seed)
        r = Simulation(inv, wl, Goal("deadline", deadline), ControllerConfig(confidence=0.9),
                       SimOptions(seed=seed)).run()
        p = next(p for _, done, _, p in r.promise_log if done >= 0.1 * tasks)
        widths.append((p.cost_usd_range[1] - p.cost_usd_range[0]) / p.cost_usd)
        t_ok, c_ok = p.holds(r.makespan_s, r.cost_usd)
        cost_in.append(c_ok)
        time_in.append(t_ok)
    assert float(np.median(widths)) <= 0.16, widths
    assert sum(cost_in) >= 7 and sum(time_in) >= 7, (cost_in, time_in)
