"""Under a budget the promise never promises a cost above the budget (issue 16: the budget
is a hard cap). What the budget cannot pay for is said instead: the share of forecasts in
which the run stops with work left (``Promise.stop_share``; such a run exits 1).

The property test draws fleets (paid instances of any billing model with planned releases,
private nodes or none), runtime laws (stated or observed, light or heavy tails, a
timeout), bags and budgets from far below to far above what the bag needs, and checks the
promise's point and cost interval against the budget. The controller's promises are checked
in ``tests/test_budget_never_exceeded.py`` over generated simulated runs.
"""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.core.billing import Billing
from broker.core.plan.promise import Machine, Pending, RuntimeLaw, forecast


def paid(n, release_s, billing=Billing.hourly(), price=0.5, speed=2.0):
    return [Machine(2, speed, 120.0, release_s, price, 0.0, billing) for _ in range(n)]


def law(mean=600.0, sd=600.0):
    return RuntimeLaw.parametric(mean, sd, 0.05, 6 * 3600.0)


def test_a_budget_promise_never_promises_a_cost_above_the_budget():
    # 6 instances for 3 h: $9 of cloud; 200 tasks of 10 min need 5.6 instance-hours at speed 2
    machines = paid(6, 3 * 3600.0 - 120.0)
    free = forecast(machines, law(), Pending(200), now_s=0.0, rng=np.random.default_rng(1))
    assert free.promise(0.9).cost_usd_range[1] > 5.0  # without the cap: above the budget below
    f = forecast(machines, law(), Pending(200), now_s=0.0, rng=np.random.default_rng(1), budget_usd=5.0)
    p = f.promise(0.9, tolerance=0.2)
    assert p.cost_usd <= 5.0 and p.cost_usd_range[1] <= 5.0
    assert float(f.costs_usd.max()) <= 5.0


def test_a_budget_too_small_for_the_bag_says_the_run_stops_with_work_left():
    # two instances for one hour cannot run 200 tasks of 10 min (about 33 h of reference work)
    f = forecast(paid(2, 3600.0 - 120.0), law(), Pending(200), now_s=0.0, rng=np.random.default_rng(2),
                 budget_usd=1.0)
    p = f.promise(0.9)
    assert p.stop_share == 1.0
    assert p.cost_usd_range[1] <= 1.0
    assert p.makespan_s_range[1] <= 3600.0  # the run stops when the paid hour ends
    assert "may stop the run with work left (100% of forecasts; exit 1)" in p.text()
    assert p.to_json()["stop_share"] == 1.0 and p.to_json()["budget_usd"] == 1.0


def test_work_the_budget_cannot_buy_goes_to_a_free_private_node():
    machines = [Machine(4, 1.0, 0.0)] + paid(2, 3600.0 - 120.0)
    f = forecast(machines, law(), Pending(200), now_s=0.0, rng=np.random.default_rng(3), budget_usd=1.0)
    p = f.promise(0.9)
    assert p.stop_share == 0.0 and p.cost_usd_range[1] <= 1.0
    # the private node runs what is left: 200 x 600 s less the paid hour's work, on 4 slots
    assert p.makespan_s > (200 * 600.0 - 2 * 2 * 2.0 * 3600.0) / 4 * 0.8


def test_without_a_budget_the_promise_says_nothing_of_one():
    f = forecast(paid(2, 3600.0 - 120.0), law(), Pending(200), now_s=0.0, rng=np.random.default_rng(2))
    p = f.promise(0.9)
    assert p.stop_share == 0.0 and "budget_usd" not in p.to_json() and "budget" not in p.text()


@st.composite
def budget_forecasts(draw):
    billing = draw(st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 600)]))
    machines = [Machine(draw(st.integers(1, 4)), draw(st.sampled_from([1.0, 2.0, 5.0])),
                        draw(st.sampled_from([0.0, 90.0, 200.0])),
                        draw(st.sampled_from([600.0, 3600.0 - 120.0, 4 * 3600.0, 20 * 3600.0])),
                        draw(st.sampled_from([0.05, 0.2, 0.8])), 0.0, billing)
                for _ in range(draw(st.integers(0, 6)))]
    machines += [Machine(draw(st.integers(1, 3)), draw(st.sampled_from([1.0, 4.0])), 0.0, math.inf,
                         draw(st.sampled_from([0.0, 0.02, 0.3])))
                 for _ in range(draw(st.integers(0 if machines else 1, 2)))]
    seed = draw(st.integers(0, 100_000))
    mean = draw(st.sampled_from([30.0, 600.0, 3000.0]))
    sigma = draw(st.sampled_from([0.3, 1.0, 1.5]))
    if draw(st.booleans()):
        rt = np.random.default_rng(seed).lognormal(math.log(mean) - sigma * sigma / 2, sigma, 30)
        runtime_law = RuntimeLaw.observed(rt, [], cap_ref_s=6 * 3600.0)
    else:
        runtime_law = RuntimeLaw.parametric(mean, mean * math.sqrt(math.expm1(sigma * sigma)), 0.1, 6 * 3600.0)
    tasks = draw(st.integers(1, 3000))
    spent = draw(st.sampled_from([0.0, 0.3]))
    budget = spent + draw(st.sampled_from([0.01, 0.2, 1.0, 5.0, 50.0]))
    return machines, runtime_law, tasks, spent, budget, seed


@given(budget_forecasts(), st.sampled_from([0.5, 0.9, 0.99]), st.sampled_from([0.0, 0.05, 0.3]))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_generated_budget_promise_exceeds_the_budget(case, confidence, tolerance):
    machines, runtime_law, tasks, spent, budget, seed = case
    f = forecast(machines, runtime_law, Pending(tasks), now_s=0.0, spent_usd=spent,
                 rng=np.random.default_rng(seed), replicates=60, budget_usd=budget)
    p = f.promise(confidence, tolerance=tolerance)
    assert p.cost_usd <= budget + 1e-9 and p.cost_usd_range[1] <= budget + 1e-9, (p, budget)
    assert 0.0 <= p.stop_share <= 1.0
    assert np.isfinite(f.makespans_s).all()
