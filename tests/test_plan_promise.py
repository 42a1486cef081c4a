"""The promise's forecast (broker/core/plan/promise.py), checked the way its claim is stated:
the (1 - delta) interval holds what is delivered in about 1 - delta of seeded repetitions.

The "truth" here is an independent list scheduler (a heap of slot free times) run on fresh
runtimes from the true distribution, with instances billed from launch until the bag's end
or, idle at the end, until the controller's surplus delay has passed.
"""

import heapq
import math

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.plan import promise as P
from broker.core.plan.promise import Machine, Pending, Promise, RuntimeLaw, forecast, hold_deadline

MEAN_S = 600.0


def fleet():
    """A private node (4 slots, $0.10/h) and three 2-slot instances twice as fast, booting 2 min."""
    return [Machine(4, 1.0, 0.0, price_per_hour=0.1)] + [
        Machine(2, 2.0, 120.0, release_at_s=1e9, price_per_hour=0.5, launched_at_s=0.0, billing=Billing.hourly())
        for _ in range(3)
    ]


def truth(machines, runtimes):
    heap = [(mc.ready_at_s, i, k) for i, mc in enumerate(machines) for k in range(mc.slots)]
    heapq.heapify(heap)
    ends: dict[int, float] = {}
    for x in runtimes:
        t, i, k = heapq.heappop(heap)
        end = t + x / machines[i].speed
        ends[i] = max(ends.get(i, 0.0), end)
        heapq.heappush(heap, (end, i, k))
    makespan = max(ends.values())
    cost = 0.0
    for i, mc in enumerate(machines):
        if mc.billing is None:
            cost += mc.price_per_hour * makespan / 3600
        else:
            # released at its planned time, at the bag's end, or once idle at the end for
            # the controller's surplus delay (fleet.py), whichever comes first
            last = ends.get(i, 0.0)
            until = max(last, min(mc.release_at_s, makespan, last + P.IDLE_RELEASE_S))
            cost += mc.billing.cost_usd(until - mc.launched_at_s, mc.price_per_hour)
    return makespan, cost


def lognormal(rng, sigma, n):
    return rng.lognormal(math.log(MEAN_S) - sigma**2 / 2, sigma, n)


def coverage(n_tasks, sigma, n_obs, reps, confidence=0.9, law_from=None):
    inside_m = inside_c = 0
    widths = []
    for seed in range(reps):
        rng = np.random.default_rng(seed)
        if law_from is None:
            law = RuntimeLaw.observed(lognormal(rng, sigma, n_obs), [], cap_ref_s=1e9)
        else:
            law = law_from
        f = forecast(fleet(), law, Pending(n_tasks), now_s=0.0, rng=np.random.default_rng(10_000 + seed))
        p = f.promise(confidence)
        m, c = truth(fleet(), lognormal(rng, sigma, n_tasks))
        a, b = p.holds(m, c)
        inside_m += a
        inside_c += b
        widths.append((p.makespan_s_range[1] - p.makespan_s_range[0]) / p.makespan_s)
    return inside_m / reps, inside_c / reps, float(np.median(widths))


def test_interval_covers_the_delivered_makespan_and_cost_with_an_estimated_law():
    # 2,000 tasks predicted from 2,000 runtimes seen (sigma 0.5): nominal 90%. Over 100
    # seeded repetitions the binomial noise of the rate is 3 points: 0.85 is the floor.
    cm, cc, width = coverage(2000, 0.5, 2000, reps=100)
    assert cm >= 0.85 and cc >= 0.85, (cm, cc)
    assert width < 0.25  # and it is not covering by being useless


@pytest.mark.slow
def test_interval_covers_heavier_tails_from_fewer_runtimes():
    cm, cc, _ = coverage(2000, 1.0, 2000, reps=100)
    assert cm >= 0.85 and cc >= 0.85, (cm, cc)


def test_interval_with_the_true_law_is_calibrated_on_both_sides():
    """With the true law only the runtimes themselves are uncertain; the interval must then
    be neither too narrow (misses) nor much too wide (it would cover nearly always)."""
    sd = MEAN_S * math.sqrt(math.exp(1.0) - 1)
    law = RuntimeLaw.parametric(MEAN_S, sd)
    cm, cc, _ = coverage(500, 1.0, 0, reps=120, law_from=law)
    assert 0.84 <= cm <= 0.97, cm
    assert 0.84 <= cc <= 0.97, cc


def test_fast_path_agrees_with_scheduling_every_task(monkeypatch):
    """The bulk (fluid capacity, equilibrium residuals) against list scheduling every task."""
    sd = MEAN_S * math.sqrt(math.exp(0.25) - 1)
    law = RuntimeLaw.parametric(MEAN_S, sd)

    def run():
        f = forecast(fleet(), law, Pending(3000), now_s=0.0, rng=np.random.default_rng(5), replicates=300)
        return np.quantile(f.makespans_s, [0.05, 0.5, 0.95]), np.quantile(f.costs_usd, [0.05, 0.5, 0.95])

    fast_m, fast_c = run()
    monkeypatch.setattr(P, "TAIL_SLOTS_FACTOR", 10_000)  # every task scheduled one by one
    exact_m, exact_c = run()
    assert np.allclose(fast_m, exact_m, rtol=0.02), (fast_m, exact_m)
    assert np.allclose(fast_c, exact_c, rtol=0.03), (fast_c, exact_c)


def test_constant_runtimes_give_a_point_promise_with_billing_rounding(monkeypatch):
    # 40 tasks of 1,000 ref-s on one 4-slot instance of speed 1 booting 100 s: 10 rounds,
    # done at 10,100 s, billed 3 hours at $1 (every task scheduled one by one: the bulk's
    # fluid phase is a large-bag approximation, which constant runtimes are not).
    monkeypatch.setattr(P, "TAIL_SLOTS_FACTOR", 10_000)
    m = [Machine(4, 1.0, 100.0, release_at_s=1e9, price_per_hour=1.0, launched_at_s=0.0, billing=Billing.hourly())]
    law = RuntimeLaw.parametric(1000.0, 0.0)
    p = forecast(m, law, Pending(40), now_s=0.0, rng=np.random.default_rng(1)).promise(0.9)
    assert p.makespan_s == pytest.approx(10_100.0)
    assert p.makespan_s_range == pytest.approx((10_100.0, 10_100.0))
    assert p.cost_usd == pytest.approx(3.0)


def test_work_past_every_release_overruns_the_plan():
    # The plan's instance goes at 2 h, but the work needs 3: the forecast must say later.
    m = [Machine(1, 1.0, 0.0, release_at_s=7200.0, price_per_hour=1.0, launched_at_s=0.0, billing=Billing.hourly())]
    law = RuntimeLaw.parametric(600.0, 0.0)
    f = forecast(m, law, Pending(18), now_s=0.0, rng=np.random.default_rng(1))
    assert f.makespan_quantile(0.5) == pytest.approx(10_800.0)
    assert f.cost_quantile(0.5) == pytest.approx(3.0)


def test_running_task_older_than_every_runtime_seen_is_flagged_and_bounded_by_the_cap():
    # Seen: 100-150 s. A task running for 1,000 s is beyond the data: it is taken to need an
    # exponential remainder of mean half its age (500 s), never past the cap (3,600 s).
    law = RuntimeLaw.observed([100.0, 120.0, 150.0], [], cap_ref_s=3600.0)
    m = [Machine(1, 1.0, 0.0, running=((1000.0, None),))]
    f = forecast(m, law, Pending(0), now_s=5000.0, started_at_s=0.0, rng=np.random.default_rng(0), replicates=2000)
    assert f.fallbacks == 1
    assert f.makespan_quantile(0.5) == pytest.approx(5000.0 + 500.0 * math.log(2), rel=0.1)
    assert f.makespan_quantile(1.0) <= 5000.0 + 2600.0 + 1e-6


def test_running_tasks_are_censored_not_short():
    """A task running for 500 s is one of the long ones (2,000 s), not a 100 s one."""
    finished = [100.0] * 20 + [2000.0] * 4
    law = RuntimeLaw.observed(finished, [500.0] * 4, cap_ref_s=10_000.0)
    m = [Machine(4, 1.0, 0.0, running=((500.0, None),) * 4)]
    f = forecast(m, law, Pending(0), now_s=500.0, rng=np.random.default_rng(0))
    # unconditional draws would mostly be 100 s (done at 600 s); the spread is the error of
    # a mean known from 24 runtimes
    assert f.makespan_quantile(0.5) >= 1800.0 and f.makespan_quantile(0.05) >= 1000.0
    # the promise's law weighs each atom by the runtimes behind it: the long part (29% of
    # the mass) is known from the 4 runtimes of 2,000 s, so its spread is wider
    law = RuntimeLaw.observed(finished, [500.0] * 4, cap_ref_s=10_000.0, fit_tail=True)
    f = forecast(m, law, Pending(0), now_s=500.0, rng=np.random.default_rng(0))
    assert f.makespan_quantile(0.5) >= 1800.0 and f.makespan_quantile(0.05) >= 900.0


def test_estimates_first_and_their_error_spreads_the_promise():
    law = RuntimeLaw.parametric(600.0, 0.0, estimate_rel_sd=0.0)
    m = [Machine(2, 1.0, 0.0)]
    exact = forecast(m, law, Pending(0, np.array([100.0, 100.0, 1000.0])), now_s=0.0, rng=np.random.default_rng(0))
    # largest first: 1000 on one slot, 100 + 100 on the other: done at 1,000 s
    assert exact.makespan_quantile(0.5) == pytest.approx(1000.0)
    noisy_law = RuntimeLaw.parametric(600.0, 0.0, estimate_rel_sd=0.2)
    noisy = forecast(m, noisy_law, Pending(0, np.array([100.0, 100.0, 1000.0])), now_s=0.0,
                     rng=np.random.default_rng(0))
    assert noisy.makespan_quantile(0.95) > 1100.0 and noisy.makespan_quantile(0.05) < 900.0


def test_hold_deadline_buys_capacity_only_as_far_as_the_risk_asks():
    """A fake planner whose makespan quantile overshoots the horizon by a fixed tail of
    1,000 s: the horizon is pulled in until the quantile fits, and no further."""
    asked = []

    def solve(h):
        asked.append(h)
        return h

    def predict(h):
        return P.Forecast(np.array([h + 1000.0] * 10), np.array([100_000.0 / h] * 10))

    held = hold_deadline(solve, predict, 20_000.0, 0.9)
    assert held.held and held.forecast.makespan_quantile(0.9) <= 20_000.0
    assert asked[0] == 20_000.0 and held.horizon_s >= 20_000.0 - 1000.0 - 0.05 * 20_000.0


def test_hold_deadline_reports_when_no_plan_holds_it():
    def predict(h):
        return P.Forecast(np.array([30_000.0] * 10), np.array([1.0] * 10))

    held = hold_deadline(lambda h: h, predict, 20_000.0, 0.9)
    assert held is not None and not held.held
    assert held.forecast.makespan_quantile(0.9) == 30_000.0


def test_promise_text_and_json():
    p = Promise(0.9, 19.6 * 3600, 231.0, (18.9 * 3600, 20.0 * 3600), (219.0, 246.0))
    assert p.text() == "done in 19.6 h (90%: 18.9-20.0 h), $231.00 (90%: $219.00-$246.00)"
    j = p.to_json()
    assert j["confidence"] == 0.9 and j["makespan_s_range"] == [68040.0, 72000.0] and j["cost_usd"] == 231.0
    assert p.holds(19.0 * 3600, 240.0) == (True, True)
    assert p.holds(21.0 * 3600, 250.0) == (False, False)


def test_an_instance_idle_at_the_bags_end_is_not_charged_to_the_end(monkeypatch):
    # One instance runs a 5-hour task (an estimate, no error); another runs the bag's two
    # 10-minute tasks and is idle after 20 minutes. The controller sheds an idle instance at
    # its billing boundary once its surplus has lasted IDLE_RELEASE_S: it costs one hour, not
    # five (charged to the bag's end, the promise's cost came out above every delivered one).
    monkeypatch.setattr(P, "TAIL_SLOTS_FACTOR", 10_000)
    hourly = dict(price_per_hour=1.0, launched_at_s=0.0, billing=Billing.hourly())
    m = [Machine(1, 1.0, 0.0, release_at_s=1e9, running=((0.0, 18_000.0),), **hourly),
         Machine(1, 1.0, 0.0, release_at_s=1e9, **hourly)]
    law = RuntimeLaw.parametric(600.0, 0.0, estimate_rel_sd=0.0, ratio_rel_se=0.0)
    p = forecast(m, law, Pending(2), now_s=0.0, rng=np.random.default_rng(1)).promise(0.9)
    assert p.makespan_s == pytest.approx(18_000.0)
    assert p.cost_usd == pytest.approx(5.0 + 1.0)


def test_the_idle_release_is_the_controllers_own(monkeypatch):
    # The same fleet, forecast for a controller that sheds a surplus only after 3 hours
    # (scale_down_after_s): the idle instance is charged 4 hours (its last end at 20 minutes
    # plus 3 hours, billed by the hour), not the 1 hour of the default 10 minutes.
    monkeypatch.setattr(P, "TAIL_SLOTS_FACTOR", 10_000)
    hourly = dict(price_per_hour=1.0, launched_at_s=0.0, billing=Billing.hourly())
    m = [Machine(1, 1.0, 0.0, release_at_s=1e9, running=((0.0, 18_000.0),), **hourly),
         Machine(1, 1.0, 0.0, release_at_s=1e9, **hourly)]
    law = RuntimeLaw.parametric(600.0, 0.0, estimate_rel_sd=0.0, ratio_rel_se=0.0)
    p = forecast(m, law, Pending(2), now_s=0.0, rng=np.random.default_rng(1), idle_release_s=3 * 3600.0).promise(0.9)
    assert p.cost_usd == pytest.approx(5.0 + 4.0)


def test_an_instance_that_works_to_its_release_is_charged_to_it():
    # A per-second instance released at 3,000 s next to a free one kept all day, and a bag
    # far larger than the first one's window: it works until its release (its slot has no
    # last end of its own in the forecast's fluid phase) and costs 3,000 s, not the billing
    # minimum (the idle-release rule once charged it 60 s).
    per_s = dict(launched_at_s=0.0, billing=Billing.per_second())
    m = [Machine(1, 1.0, 0.0, release_at_s=86_400.0, price_per_hour=0.0, **per_s),
         Machine(1, 1.0, 0.0, release_at_s=3000.0, price_per_hour=3.6, **per_s)]
    law = RuntimeLaw.parametric(10.0, 0.0, estimate_rel_sd=0.0, ratio_rel_se=0.0)
    p = forecast(m, law, Pending(2000), now_s=0.0, rng=np.random.default_rng(1)).promise(0.9)
    assert p.cost_usd == pytest.approx(3.0, rel=0.01)
    assert p.makespan_s == pytest.approx(2000 * 10.0 - 3000.0, rel=0.01)


@pytest.mark.parametrize("straggler_rule", [False, True])
def test_work_the_instances_leave_does_not_queue_on_a_private_node_past_the_planning_deadline(straggler_rule):
    """The controller holds its planning deadline H: what the instances leave goes to a private
    node only as far as it ends by H; past H a re-plan keeps instances on. Queued on the slow
    private node up to the user's deadline, a forecast promised bimodal runs that ended at
    12 h a makespan of 33 h (the deadline), and the first plan, held on that forecast, pulled
    its planning deadline in by 22 h."""
    # an instance 4x faster than the private node, released at 2 h; 100 tasks of 600 s: the
    # instance does at most 48 by then, the private node 12; 40 are left over
    m = [Machine(1, 1.0, 0.0, price_per_hour=0.0),
         Machine(1, 4.0, 0.0, release_at_s=7200.0, price_per_hour=1.0, launched_at_s=0.0, billing=Billing.hourly())]
    law = RuntimeLaw.parametric(600.0, 0.0)
    h, deadline = 2.5 * 3600.0, 20 * 3600.0
    kw = dict(deadline_at_s=deadline, tail_ref_s=600.0) if straggler_rule else {}
    f = forecast(m, law, Pending(100), now_s=0.0, rng=np.random.default_rng(1), horizon_at_s=h, **kw)
    # 24,000 ref-s left at 2 h on 5 ref-s/s: 1.3 h more with the instance kept on (the
    # private node alone: 6.7 h more)
    assert f.makespan_quantile(0.9) < 4 * 3600.0
    assert f.cost_quantile(0.5) >= 4.0  # the instance's third and fourth hours are paid for
