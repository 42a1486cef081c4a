"""Issue 16, must show: "the interval is useful: its median width is at most 10% of the point on
bags of 10,000 tasks or more" (bags with estimates). The promise's interval is the forecast's
central quantiles moved out by a band of what is left (``Forecast.promise``'s tolerance, the
work's relative band ``promises.promise_band``). The work's band counted the error of the
estimates' correction ratio (s_r / sqrt(k + 30), s_r assumed 15% before 10 tasks ended),
which the forecast's replicates draw too (``RuntimeLaw.ratio_rel_se``): counted twice, the
first promise of LM with estimates within 10% (10,000 tasks, nothing run) was 18.7% wide in
cost and 12.4% in time, while its cost was a median 0.8% from what was delivered."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from broker.core.control.controller import ControllerConfig
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Observations, Snapshot
from broker.core.control.estimates import RemainingWork, remaining_work
from broker.core.control.promises import promise_band
from broker.sim.engine import SimOptions, Simulation
from broker.sim.workloads import BUILTIN, build_workload

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from scenarios import thesis_inventory  # noqa: E402  (the thesis catalogue, n machines a type, the xeon)


def width(rng, point):
    return (rng[1] - rng[0]) / point


def test_the_promise_band_leaves_out_the_ratio_error_the_forecast_draws():
    # 10,000 tasks with estimates, nothing run: upper - point is z x (the correction ratio's
    # error, shared: known x 0.15 / sqrt(30), plus the tasks' own: known x 0.15 / sqrt(n))
    known, z = 1e7, 1.645
    shared, own = z * known * 0.15 / math.sqrt(30), z * known * 0.15 / math.sqrt(10_000)
    rem = RemainingWork(known, known + shared + own, 1000.0, 300.0, 10_000, 0, 1.0, shared)
    assert promise_band(rem) == pytest.approx(own / known)
    # without estimates nothing is drawn twice: the band is (upper - point) / point
    assert promise_band(RemainingWork(known, 1.2 * known, 1000.0, 300.0, 10_000, 0, 1.0)) == pytest.approx(0.2)


def test_remaining_work_says_which_part_of_its_band_is_the_ratio_error():
    snap = snapshot_with_estimates([1000.0] * 10_000)
    rem = remaining_work(snap)
    # s_r assumed 15% until 10 ended, over k + PRIOR_WEIGHT = max(0, 1) + 30 ratios
    assert rem.ratio_upper_ref_s == pytest.approx(1.645 * 1e7 * 0.15 / math.sqrt(31))
    assert promise_band(rem) == pytest.approx(1.645 * 0.15 / math.sqrt(10_000))


@pytest.mark.slow
def test_the_first_promise_of_a_bag_with_estimates_counts_the_ratio_error_once_and_holds():
    """LM (thesis catalogue, 20 machines a type), 10,000 tasks with estimates within 10%, no
    prior, bench/promises.py's deadline (18.5 h): the first promise (t = 0, nothing run yet)
    was 18.9% wide in cost and 11.9% in time on these seeds (11.3% and 4.8% with the ratio's
    error counted once); it still holds what is delivered. Its user declares the estimates
    unbiased to within 2% (``estimate_bias``, the prior on the ratio before any task ran:
    without it the promise assumes 15%, test_promise_estimate_bias.py): 6.5% and 4.4%."""
    spec = dict(BUILTIN["LM"], prior="none", estimates={"error": 0.1})
    for seed in (0, 1):
        wl = build_workload(spec, seed, tasks=10_000, name="LM")
        r = Simulation(thesis_inventory(20), wl, Goal("deadline", 66_600.0),
                       ControllerConfig(confidence=0.9, estimate_bias=0.02), SimOptions(seed=seed)).run()
        p = r.promise
        assert width(p.cost_usd_range, p.cost_usd) <= 0.10, p.text()
        assert width(p.makespan_s_range, p.makespan_s) <= 0.07, p.text()
        assert p.holds(r.makespan_s, r.cost_usd) == (True, True), (p.text(), r.makespan_s, r.cost_usd)


def snapshot_with_estimates(estimates):
    pool = TaskPool()
    for i, e in enumerate(estimates):
        pool.add(f"t{i}", e)
    return Snapshot(now_s=0.0, types={}, nodes=(), pending=pool, tasks_total=len(estimates), tasks_done=0,
                    observations=Observations(), committed_usd=0.0,
                    prior_mean_ref_s=float(np.mean(estimates)), prior_sd_ref_s=float(np.std(estimates)))
