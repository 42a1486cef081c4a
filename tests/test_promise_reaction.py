"""The first promise foresees the controller's reaction to estimates biased as a whole
(broker/core/control/reaction.py).

A bag whose estimates are all 10% low, nothing declared: the first promise draws the
estimates' correction ratio around 1 with the assumed 15% bias. Before reaction.py, a
replicate with more work than the first fleet covers ran that fleet longer (17.4-20.2 h on
thesis LM, 10,000 tasks); the controller instead sees the ratio in the first hour, pulls its
planning deadline in and buys, and ends early (15.8 h): the first promise's makespan interval
held in 30% of runs (bench/promises.py LM-est10-low, 20 seeds).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.sim.engine import SimOptions, Simulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import promises as bench  # noqa: E402  (the scenarios of bench/promises.py)

TASKS = 8000  # a smaller LM bag than the bench's (on main: 3 of 10 held, as at 10,000)
SEEDS = range(1, 11)


def run(seed: int, estimate_bias=None):
    inv, wl = bench.build("LM-est10-low", TASKS, seed)
    deadline = bench.deadline_for(inv, bench.expected_work("LM-est10-low", TASKS))
    cfg = ControllerConfig(confidence=0.9, estimate_bias=estimate_bias)
    return Simulation(inv, wl, Goal("deadline", deadline), cfg, SimOptions(seed=seed)).run(), deadline


@pytest.mark.slow
def test_first_promise_makespan_holds_when_every_estimate_is_10pct_low():
    """Coverage of the first promise's makespan interval over seeded all-10%-low bags, nothing
    declared: at least 90% (on main, before reaction.py: 30%, the delivered makespan below the
    interval: the controller bought and ended early). Its cost interval still holds, every
    deadline is met, and the interval does not reach to the deadline: it is the reaction
    forecast, not a band widened to the goal."""
    runs = [run(seed) for seed in SEEDS]
    holds = np.array([r.promise.holds(r.makespan_s, r.cost_usd) for r, _ in runs])
    texts = [(r.promise.text(), round(r.makespan_s / 3600, 2)) for r, _ in runs]
    assert holds[:, 0].mean() >= 0.9, texts
    assert holds[:, 1].mean() >= 0.9, texts
    assert all(r.makespan_s <= d for r, d in runs)
    widths = [np.diff(r.promise.makespan_s_range)[0] / r.promise.makespan_s for r, _ in runs]
    assert np.median(widths) <= 0.25, widths


def test_the_reaction_changes_the_promise_not_what_the_broker_does(monkeypatch):
    """The reaction is forecast, never carried out: with it switched off the run is the same
    (its solves and forecasts draw from their own generators) and only the promise moves."""
    with_it, _ = run(2)
    import broker.core.control.promises as promises

    monkeypatch.setattr(promises, "with_reaction", lambda *a: a[7])
    without, _ = run(2)
    assert (with_it.makespan_s, with_it.cost_usd, with_it.tasks_done) == (
        without.makespan_s, without.cost_usd, without.tasks_done)
    assert with_it.promise.makespan_s_range != without.promise.makespan_s_range
    # the delivered makespan (the controller bought and ended early) is inside only with it
    assert with_it.promise.holds(with_it.makespan_s, with_it.cost_usd)[0]
    assert not without.promise.holds(without.makespan_s, without.cost_usd)[0]
