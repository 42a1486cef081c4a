"""Invariants of the controller, checked over many generated scenarios in the simulator.

- cost never exceeds the budget under a budget goal;
- no instance is released before its paid-until minus the margin, except when the bag is
  done or the user stops (nothing is saved by waiting then); nor is a planned release on
  the billing boundary itself (it would race the next unit);
- every task is done exactly once;
- the same seed gives the same run.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.failures import FailurePolicy
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation

MARGIN_S = 120.0
# releases the controller plans (not a bag's end, a user's stop, a lost or bad node)
PLANNED = ("plan", "plan_needs_longer", "surplus_at_billing_boundary", "running_task_needs_longer",
           "sampling_in_progress", "bats_renew_atu", "planned_life")


@st.composite
def scenarios(draw):
    billing = draw(st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 600)]))
    n_types = draw(st.integers(1, 3))
    types = tuple(
        MachineType(
            name=f"type{i}",
            slots=draw(st.integers(1, 4)),
            speed=draw(st.sampled_from([1.0, 2.0, 4.0, 8.0])),
            price_per_hour=draw(st.sampled_from([0.05, 0.1, 0.2, 0.4, 0.8])),
            limit=draw(st.integers(1, 6)),
            boot_s=draw(st.sampled_from([0.0, 30.0, 90.0])),
            billing=billing,
        )
        for i in range(n_types)
    )
    private = ()
    if draw(st.booleans()):
        private = (PrivateNode("own", slots=draw(st.integers(1, 3)), speed=1.0, cost_per_hour=0.0, local=True),)
    n = draw(st.integers(5, 200))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    mean_s = draw(st.sampled_from([30.0, 300.0, 1200.0]))
    runtimes = rng.lognormal(math.log(mean_s) - 0.125, 0.5, n)
    clairvoyant = draw(st.booleans())
    estimates = runtimes * rng.uniform(0.7, 1.3, n) if clairvoyant else None
    prior = float(runtimes.mean()) if (not clairvoyant and draw(st.booleans())) else None
    if estimates is not None:
        prior = float(estimates.mean())
    total = float(runtimes.sum())
    kind = draw(st.sampled_from(["deadline", "budget", "none", "theta"]))
    if kind == "deadline":
        goal = Goal("deadline", total / draw(st.sampled_from([2.0, 8.0, 32.0])) + 600)
    elif kind == "budget":
        goal = Goal("budget", draw(st.sampled_from([0.05, 0.5, 2.0, 10.0])))
    elif kind == "theta":
        goal = Goal("theta", draw(st.sampled_from([0.0, 0.5, 1.0])))
    else:
        goal = Goal()
    inv = Inventory(private=private, types=types)
    wl = SimWorkload(runtimes, estimates, prior, name="generated")
    return inv, wl, goal, seed


def run(inv, wl, goal, seed, **opt):
    cfg = ControllerConfig(margin_s=MARGIN_S, tick_s=60.0, replan_every_s=600.0)
    return Simulation(inv, wl, goal, cfg, SimOptions(seed=seed, max_virtual_s=20 * 86400.0, **opt)).run()


@given(scenarios())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_invariants_hold_in_generated_scenarios(sc):
    inv, wl, goal, seed = sc
    r = run(inv, wl, goal, seed, speed_noise=0.2)
    # every task at most once; all of them unless a budget stopped the cloud part
    assert all(c == 1 for c in r.completions.values())
    assert r.tasks_done == len(r.completions)
    if goal.kind != "budget":
        assert r.tasks_done == r.tasks_total
    if goal.kind == "budget":
        assert r.max_committed_usd <= goal.value + 1e-9
        assert r.cloud_cost_usd <= goal.value + 1e-9
        if r.tasks_done < r.tasks_total:
            assert r.budget_stopped or not inv.private
    unit_s = inv.types[0].billing.unit_s
    for rel in r.releases:
        if rel["cause"] in ("bag_done", "user_stop"):
            continue
        assert rel["at_s"] >= rel["paid_until_s"] - MARGIN_S - 1e-6, rel
        if rel["cause"] in PLANNED and unit_s > MARGIN_S:
            # ... nor on the boundary itself: a planned release is a margin before it (or,
            # decided inside the margin, at once), never where the next unit starts
            assert rel["at_s"] < rel["paid_until_s"] - 1e-6, rel


@given(scenarios())
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_same_seed_same_run(sc):
    inv, wl, goal, seed = sc
    a = run(inv, wl, goal, seed, speed_noise=0.3, failure_rate=0.05)
    b = run(inv, wl, goal, seed, speed_noise=0.3, failure_rate=0.05)
    ja, jb = a.to_json(), b.to_json()
    ja.pop("sim_wall_s"), jb.pop("sim_wall_s")
    assert ja == jb
    assert a.releases == b.releases and a.fleet_changes == b.fleet_changes


def test_failures_are_retried_and_every_task_still_done_once():
    types = (MachineType("m", 2, 1.0, 0.1, 4, 30.0, Billing.hourly()),)
    inv = Inventory(private=(PrivateNode("own", 2, local=True),), types=types)
    rng = np.random.default_rng(3)
    wl = SimWorkload(rng.uniform(60, 600, 300), None, 330.0, name="u")
    # retries enough that no task runs out of them: this test is about re-queueing
    r = run(inv, wl, Goal("deadline", 4 * 3600), 3, failure_rate=0.2, failures=FailurePolicy(retries=50))
    assert r.tasks_done == 300
    assert sorted(r.completions.values()) == [1] * 300
    assert r.wasted_ref_s > 0  # failures did happen and their work was thrown away


def test_regression_a_surplus_seen_on_a_billing_boundary_is_not_released_there():
    """Hypothesis found it: 600 s units, a $0.50 budget, a re-plan on a tick that fell on an
    instance's billing boundary found it surplus and released it there (7,680 s = launch + 2
    units), where the next unit starts. The budget plan saw the instance as paid only to
    ``now``; an instance alive on its boundary has begun the next unit, and the planner and the
    budget now count it so (``budget.unit_started_usd``): kept to a margin before the next
    boundary, and that unit's cost taken from what the plan may spend (keeping it without
    counting it once left the league's LM20 without estimates at $18.84 with 154 tasks).

    $0.50 is a budget the bag's last task outruns by about a minute on main too (70 of 71,
    with the release on the boundary taken as free); at $0.52 (and above) the run finishes:
    the rule must not cost a bag the budget covers."""
    billing = Billing.custom(600, 600)
    types = (MachineType("type0", 1, 1.0, 0.05, 1, 0.0, billing),
             MachineType("type1", 3, 1.0, 0.05, 5, 0.0, billing))
    rng = np.random.default_rng(1)
    runtimes = rng.lognormal(math.log(1200.0) - 0.125, 0.5, 71)
    for budget in (0.5, 0.52):
        r = run(Inventory(private=(), types=types), SimWorkload(runtimes, None, None, name="generated"),
                Goal("budget", budget), 1, speed_noise=0.2)
        assert r.max_committed_usd <= budget + 1e-9
        assert r.tasks_done == 71 or (budget == 0.5 and r.budget_stopped)
        planned = [rel for rel in r.releases if rel["cause"] in PLANNED]
        assert planned
        for rel in planned:
            assert rel["paid_until_s"] - MARGIN_S - 1e-6 <= rel["at_s"] < rel["paid_until_s"] - 1e-6, rel
