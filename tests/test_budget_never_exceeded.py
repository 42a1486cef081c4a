"""Under a budget the run never spends more than the budget: cloud spend plus the private
nodes' cost, at every moment and in the end (issue 16's Must-show: >= 10,000 generated
scenarios, private nodes included).

The suite draws ``BUDGET_EXAMPLES`` scenarios (default 100, about 0.2 s each); the
claim's 10,000 are drawn by

    BUDGET_EXAMPLES=10000 python3 -m pytest -q tests/test_budget_never_exceeded.py

(``bench/results/budget-property.txt`` keeps that run's output). Scenarios are small bags
(5-40 tasks of 30 s to 10 min) so that thousands run in well under an hour: one to three EC2 types of any billing model,
private nodes free or paid, runtimes lognormal with or without estimates, budgets from a
few cents to more than the bag needs.
"""

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation

EXAMPLES = int(os.environ.get("BUDGET_EXAMPLES", "100"))


@st.composite
def budget_scenarios(draw):
    billing = draw(st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 600)]))
    types = tuple(
        MachineType(f"type{i}", slots=draw(st.integers(1, 4)), speed=draw(st.sampled_from([1.0, 2.0, 5.0])),
                    price_per_hour=draw(st.sampled_from([0.05, 0.2, 0.8])), limit=draw(st.integers(1, 5)),
                    boot_s=draw(st.sampled_from([0.0, 90.0, 200.0])), billing=billing)
        for i in range(draw(st.integers(1, 3)))
    )
    private = tuple(
        PrivateNode(f"own{k}", slots=draw(st.integers(1, 3)), speed=draw(st.sampled_from([1.0, 4.0])),
                    cost_per_hour=draw(st.sampled_from([0.0, 0.02, 0.3])), local=True)
        for k in range(draw(st.integers(0, 2)))
    )
    n = draw(st.integers(5, 40))
    seed = draw(st.integers(0, 100_000))
    rng = np.random.default_rng(seed)
    mean_s = draw(st.sampled_from([30.0, 120.0, 600.0]))
    sigma = draw(st.sampled_from([0.3, 1.0, 1.5]))
    runtimes = rng.lognormal(math.log(mean_s) - sigma * sigma / 2, sigma, n)
    estimates = runtimes * rng.uniform(0.7, 1.3, n) if draw(st.booleans()) else None
    prior = None if estimates is None else float(estimates.mean())
    budget = draw(st.sampled_from([0.005, 0.02, 0.1, 0.5, 2.0]))
    return Inventory(private=private, types=types), SimWorkload(runtimes, estimates, prior, name="generated"), \
        budget, seed


@given(budget_scenarios())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_total_spend_never_exceeds_the_budget(sc):
    inv, wl, budget, seed = sc
    cfg = ControllerConfig(tick_s=60.0, replan_every_s=600.0)
    r = Simulation(inv, wl, Goal("budget", budget), cfg, SimOptions(seed=seed, max_virtual_s=2 * 86400.0)).run()
    assert r.max_committed_usd <= budget + 1e-9, (r.max_committed_usd, budget)
    assert r.cost_usd <= budget + 1e-6, (r.cost_usd, r.cloud_cost_usd, r.private_cost_usd, budget)
    # and no promise made on the way promised more than the budget (the cap is said instead)
    for _, _, _, p in r.promise_log:
        assert p.cost_usd <= budget + 1e-9 and (p.cost_usd_range is None or p.cost_usd_range[1] <= budget + 1e-9), \
            (p.text(), budget)
