"""The promise made once 10% of the bag is done holds the makespan (bench/promises.py's "at 10%"
table; issue 16).

On main before this change it held in 80% of 40 runs of LM-est10-low and 75% of logn-1.5,
every miss below the interval: the run ended earlier than the promise's lower bound.

- LM-est10-low: the promise's view of lengthening (``plan/shed.py``, ``bare_need``) counted
  the private xeon up to the planning deadline, so the work past the instances' releases was
  left to it and the forecast ran the xeon for hours; the controller keeps an instance on
  instead (seed 21: promised 18.0 h (90%: 17.6-18.3 h), delivered 16.6 h).
- logn-1.5: the replicates with more work than the fleet covers by the deadline ran late in
  the forecast; the controller pulls its planning deadline in and buys
  (``control/reaction_work.py``; seed 15: promised 15.8 h (90%: 12.9-20.3 h), delivered 12.4 h).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.plan.promise import Machine, Pending, RuntimeLaw, forecast
from broker.sim.engine import SimOptions, Simulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import promises as bench  # noqa: E402  (the scenarios of bench/promises.py)

TASKS = 10_000


def run(scenario: str, seed: int):
    inv, wl = bench.build(scenario, TASKS, seed)
    deadline = bench.deadline_for(inv, bench.expected_work(scenario, TASKS))
    cfg = ControllerConfig(confidence=0.9, estimate_bias=bench.DECLARED_BIAS.get(scenario))
    r = Simulation(inv, wl, Goal("deadline", deadline), cfg, SimOptions(seed=seed)).run()
    tenth = next(p for _, done, _, p in r.promise_log if done >= 0.1 * TASKS)
    return r, tenth


def test_lengthening_counts_a_private_node_only_to_the_fleets_scheduled_end():
    """Four instances leaving at their first hour and a slow private node; the work is more
    than they do by then. When the private node is paid by the hour, the promise's forecast
    keeps an instance on (the controller's re-plan does), not the private node alone up to
    the planning deadline five hours out; a free one takes that work."""
    hourly = Billing.hourly()
    law = RuntimeLaw.parametric(1000.0, 100.0, 0.0, 6 * 3600.0, estimate_rel_sd=0.05)
    pending = Pending(0, np.full(400, 1000.0))  # 400,000 ref-s: 313,200 by the releases

    def makespan_h(private_per_hour: float) -> float:
        machines = [Machine(1, 10.0, 0.0, math.inf, private_per_hour)] + [
            Machine(1, 20.0, 0.0, 3480.0, 0.68, 0.0, hourly, (), "c1.xlarge") for _ in range(4)]
        f = forecast(machines, law, pending, now_s=0.0, rng=np.random.default_rng(3), replicates=50,
                     horizon_at_s=5 * 3600.0, keep_margin=0.01, bare_lengthen=True)
        return float(np.median(f.makespans_s)) / 3600

    # paid for every hour the run lasts: an instance kept on two more hours, 1.8 h (the
    # private node alone after the first hour would run to 1 h + 86,800 / 10 s = 3.4 h)
    assert makespan_h(0.32) < 2.5, makespan_h(0.32)
    # free: the cheapest plan leaves the work to it, up to the planning deadline
    assert makespan_h(0.0) > 3.0, makespan_h(0.0)


def test_the_work_reaction_changes_the_promise_not_what_the_broker_does(monkeypatch):
    """The reaction to a larger work is forecast, never carried out: with it switched off the
    run is the same and only the promise moves; the delivered makespan (the controller bought
    and ended early) is inside the promise at 10% done only with it."""
    with_it, p_with = run("logn-1.5", 15)
    import broker.core.control.promises as promises

    monkeypatch.setattr(promises, "with_work_reaction", lambda *a: a[7])
    without, p_without = run("logn-1.5", 15)
    assert (with_it.makespan_s, with_it.cost_usd, with_it.tasks_done) == (
        without.makespan_s, without.cost_usd, without.tasks_done)
    assert p_with.makespan_s_range != p_without.makespan_s_range
    assert p_with.holds(with_it.makespan_s, with_it.cost_usd)[0]
    assert not p_without.holds(without.makespan_s, without.cost_usd)[0]


@pytest.mark.slow
def test_promise_at_tenth_holds_the_makespan_when_every_estimate_is_10pct_low():
    """Coverage of the promise at 10% done over seeded LM-est10-low bags (estimates all 10%
    low, nothing declared): at least 90% for makespan and cost (on main: 19 of 24 for the
    makespan, every miss below the interval), the interval still narrow (median width <= 5%)."""
    runs = [run("LM-est10-low", seed) for seed in range(1, 25)]
    holds = np.array([p.holds(r.makespan_s, r.cost_usd) for r, p in runs])
    texts = [(p.text(), round(r.makespan_s / 3600, 2)) for r, p in runs]
    assert holds[:, 0].mean() >= 0.9, texts
    assert holds[:, 1].mean() >= 0.9, texts
    widths = [np.diff(p.makespan_s_range)[0] / p.makespan_s for _, p in runs]
    assert math.isfinite(np.median(widths)) and np.median(widths) <= 0.05, widths
