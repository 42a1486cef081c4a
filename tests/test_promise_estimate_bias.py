"""The promise's prior on the estimates' overall bias (broker/core/control/estimate_bias.py).

Before any task with an estimate has run, nothing but the user's word says how far a bag's
estimates are off as a whole. The rule before this one assumed 2.7% (15% / sqrt(30)): a bag
whose estimates were all 10% low was promised a first cost interval that held the delivered
cost in 1 of 20 runs (bench/promises.py LM-est10-low). Undeclared, the promise now assumes
15%; a user who knows better declares it (``estimate_bias``, ``--estimate-bias``).
"""

from __future__ import annotations

import math
import os
import sys
from statistics import NormalDist

import numpy as np
import pytest

from broker.core.control.controller import ControllerConfig
from broker.core.control.estimate_bias import DEFAULT_ESTIMATE_BIAS, promise_ratio_se
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Observations, Snapshot
from broker.sim.engine import SimOptions, Simulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import promises as bench  # noqa: E402  (the scenarios of bench/promises.py)

Z90 = NormalDist().inv_cdf(0.95)


def snapshot(estimates, observations=Observations()):
    pool = TaskPool()
    for i, e in enumerate(estimates):
        pool.add(f"t{i}", e)
    return Snapshot(now_s=0.0, types={}, nodes=(), pending=pool, tasks_total=len(estimates), tasks_done=0,
                    observations=observations, committed_usd=0.0,
                    prior_mean_ref_s=float(np.mean(estimates)) if estimates else 100.0,
                    prior_sd_ref_s=float(np.std(estimates)) if estimates else 10.0)


def test_before_any_task_ran_the_ratio_error_is_the_declared_bias_or_15_percent():
    snap = snapshot([1000.0] * 100)
    assert promise_ratio_se(snap, None, 0.9) == pytest.approx(DEFAULT_ESTIMATE_BIAS / Z90)
    assert promise_ratio_se(snap, 0.02, 0.9) == pytest.approx(0.02 / Z90)
    assert promise_ratio_se(snap, 0.0, 0.9) == 0.0
    # at 95% the same declared bias is a narrower standard error
    assert promise_ratio_se(snap, 0.02, 0.95) < promise_ratio_se(snap, 0.02, 0.9)


def test_once_tasks_with_estimates_ran_the_ratio_error_is_theirs_whatever_was_declared():
    obs = Observations()
    rng = np.random.default_rng(3)
    for r in 1.1 * (1 + rng.uniform(-0.1, 0.1, 40)):
        obs = obs.add(1000.0 * r, 1000.0)
    snap = snapshot([1000.0] * 100, obs)
    expected = obs.ratio_sd() / math.sqrt(40)
    assert promise_ratio_se(snap, None, 0.9) == pytest.approx(expected)
    assert promise_ratio_se(snap, 0.0, 0.9) == pytest.approx(expected)


def test_a_bag_without_estimates_has_no_ratio_error():
    pool = TaskPool()
    for i in range(10):
        pool.add(f"t{i}", None)
    snap = Snapshot(now_s=0.0, types={}, nodes=(), pending=pool, tasks_total=10, tasks_done=0,
                    observations=Observations(), committed_usd=0.0)
    assert promise_ratio_se(snap, None, 0.9) is None


@pytest.mark.parametrize("bad", [-0.1, 1.0, math.inf, math.nan])
def test_a_declared_bias_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="estimate_bias"):
        ControllerConfig(estimate_bias=bad)


def run(scenario: str, seed: int, bias, tasks: int = 10_000):
    inv, wl = bench.build(scenario, tasks, seed)
    return Simulation(inv, wl, Goal("deadline", 66_600.0), ControllerConfig(confidence=0.9, estimate_bias=bias),
                      SimOptions(seed=seed)).run()


def test_the_declared_bias_changes_the_promise_not_what_the_broker_does():
    """Only the promise reads the declaration: the runs are the same, the interval is not."""
    a, b = run("LM-est10", 2, None, 3000), run("LM-est10", 2, 0.02, 3000)
    assert (a.makespan_s, a.cost_usd) == (b.makespan_s, b.cost_usd)
    wa = np.diff(a.promise.cost_usd_range)[0] / a.promise.cost_usd
    wb = np.diff(b.promise.cost_usd_range)[0] / b.promise.cost_usd
    assert wb < 0.5 * wa, (a.promise.text(), b.promise.text())


SEEDS = range(1, 11)


@pytest.mark.slow
def test_a_bag_whose_estimates_are_all_10pct_low_keeps_its_first_cost_promise():
    """LM, 10,000 tasks, every estimate 10% low on top of its own 10% error, nothing declared:
    the first promise (t = 0, nothing run) holds the delivered cost in at least 90% of seeded
    runs (before: 1 of 20, the ratio's error taken as 2.7%). Its makespan is asserted in
    tests/test_promise_reaction.py: the controller, once it sees the work is 11% longer, buys
    enough to end 2-3 h before the forecast's fleet would (15.5-15.8 h against 17.7 h), which
    the promise foresees since broker/core/control/reaction.py (bench/promises.py LM-est10-low)."""
    held = [run("LM-est10-low", seed, None) for seed in SEEDS]
    inside = [r.promise.holds(r.makespan_s, r.cost_usd)[1] for r in held]
    assert np.mean(inside) >= 0.9, [(r.promise.text(), r.cost_usd) for r in held]


@pytest.mark.slow
def test_a_declared_unbiased_tool_gets_a_first_promise_under_10pct_wide_that_holds():
    """Estimates within 10%, unbiased as a whole (true of the simulator's tool), the user
    declaring 2%: the first promise's cost interval is at most 10% wide (issue 16) in the
    median and holds cost and makespan in at least 90% of seeded runs (LM-est30 alike:
    bench/promises.py)."""
    runs = [run("LM-est10", seed, 0.02) for seed in SEEDS]
    widths = [np.diff(r.promise.cost_usd_range)[0] / r.promise.cost_usd for r in runs]
    holds = np.array([r.promise.holds(r.makespan_s, r.cost_usd) for r in runs])
    assert np.median(widths) <= 0.10, widths
    assert holds[:, 0].mean() >= 0.9 and holds[:, 1].mean() >= 0.9, [r.promise.text() for r in runs]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def broker(*args):
    import subprocess

    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def plan_promise(tmp_path, *flags):
    import json

    rows = ["id,command,estimate_tool"] + [f"t{i},true,{600 + 10 * (i % 300)}" for i in range(3000)]
    (tmp_path / "tasks.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "bag.yaml").write_text(f"name: big\ncsv: {tmp_path / 'tasks.csv'}\ntimeout: 2h\n")
    r = broker("plan", str(tmp_path / "bag.yaml"), "--inventory", "examples/thesis-catalogue.yaml",
               "--deadline", "10h", "--json", *flags)
    promises = [json.loads(line)["promise"] for line in r.stdout.splitlines() if '"promise"' in line]
    assert promises, (r.returncode, r.stdout, r.stderr)
    p = promises[-1]
    return (p["cost_usd_range"][1] - p["cost_usd_range"][0]) / p["cost_usd"]


def test_broker_plan_with_estimates_counts_their_overall_bias_in_its_promise(tmp_path):
    """``broker plan`` drew no ratio error at all for a bag with estimates: a 3,000-task bag's
    cost interval was 0.1% wide, as if its estimates' total were exact."""
    undeclared, declared, exact = (plan_promise(tmp_path), plan_promise(tmp_path, "--estimate-bias", "2%"),
                                   plan_promise(tmp_path, "--estimate-bias", "0"))
    assert exact < 0.01
    assert exact < declared < undeclared
    assert undeclared > 0.15  # 15% either way on the work, at 90%


@pytest.mark.parametrize("bad", ["150%", "-1%", "x", "1"])
def test_a_bad_estimate_bias_flag_exits_2(bad):
    r = broker("simulate", "--inventory", "examples/thesis-catalogue.yaml", "--workload", "LM", "--tasks", "50",
               "--deadline", "6h", "--estimate-bias", bad)
    assert r.returncode == 2 and "--estimate-bias" in r.stderr, r.stderr
