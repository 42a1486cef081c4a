"""The controller's money rules, each decided on a snapshot built at its edge (no simulator).

Each rule is small and each of these bugs once passed the whole controller, simulator and
dry-run suite:

- the budget check lets a launch or a lengthening overshoot the budget by a billing unit;
- a planned release lands on paid-until instead of a margin before it (the terminate call
  then races the next unit, and an instance that goes late pays a unit more);
- dispatch starts a task that cannot end before its slot's release (it is killed there and
  its work paid for twice), or buys an unplanned unit to finish it;
- the relative (eps, delta) stop of the sampling rules stops before its bounds are eps-tight;
- the simulator's cost leaves the private nodes out.
"""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.control.actions import Launch
from broker.core.control.snapshot import Goal, Memory, Observations
from broker.core.estimate import make_rule
from broker.core.estimate.ebstop import relative_point, relative_stop
from broker.core.model import Inventory, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation
from tests.builders import (
    M, MARGIN_S, assigned, decide, launches, machine, node, planned_memory, releases, running, snapshot,
)

UNIT_USD = 0.10  # one hour of the default machine type ``m``


# -- the budget check ---------------------------------------------------------------------
def _sampling_launch(budget_usd: float):
    """No private node and no instance: sampling needs one, for one paid hour of ``m``."""
    snap = snapshot(pending=20, observations=Observations(), tasks_done=0)
    return decide(snap, goal=Goal("budget", budget_usd), memory=Memory())


def test_a_launch_that_exactly_spends_the_budget_is_bought():
    assert launches(_sampling_launch(UNIT_USD)) == {"m": 1}


def test_a_launch_a_cent_short_of_the_budget_is_refused():
    # the check that allowed one billing unit more bought this one too
    assert launches(_sampling_launch(UNIT_USD - 0.01)) == {}


def _firstfit_at_budget(budget_usd: float):
    """One busy FirstFit instance, its first hour charged; a task fits nowhere: one more?"""
    busy = node("i-1", running=[running("t1", 50.0)])
    snap = snapshot(now_s=100.0, nodes=[busy], pending=5, committed_usd=UNIT_USD)
    return decide(snap, goal=Goal("budget", budget_usd), memory=Memory(), policy="firstfit")


def test_firstfit_buys_the_unit_that_exactly_fills_the_budget():
    assert launches(_firstfit_at_budget(2 * UNIT_USD)) == {"m": 1}


def test_firstfit_refuses_a_unit_that_would_overshoot_the_budget():
    assert launches(_firstfit_at_budget(2 * UNIT_USD - 0.01)) == {}


def _overdue_task_at_budget(budget_usd: float):
    # The task started at 0 is long overdue at 3,400 s: keeping its instance another hour
    # costs a unit; the first is charged.
    slow = node("i-1", running=[running("t1", 0.0)])
    snap = snapshot(now_s=3400.0, nodes=[slow], committed_usd=UNIT_USD)
    return decide(snap, goal=Goal("budget", budget_usd), memory=planned_memory(3400.0, deadline_s=None))


def test_a_running_task_keeps_its_instance_when_the_budget_holds_the_next_unit():
    assert releases(_overdue_task_at_budget(2 * UNIT_USD)) == {
        "i-1": (7200.0 - MARGIN_S, "running_task_needs_longer")}


def test_a_running_task_does_not_keep_its_instance_past_the_budget():
    assert releases(_overdue_task_at_budget(2 * UNIT_USD - 0.01)) == {}


# -- planned releases: a margin before paid-until -----------------------------------------
def _plan_with_one_unscheduled_instance(margin_s: float):
    # 40 tasks of 800 ref-s on a 4-hour deadline: the plan keeps the instance and buys more.
    inst = node("i-1", launched_at_s=0.0, release_at_s=None)
    snap = snapshot(now_s=60.0, nodes=[inst], pending=40)
    return decide(snap, memory=Memory(), margin_s=margin_s)


@pytest.mark.parametrize("margin_s", [MARGIN_S, 300.0])
def test_a_planned_release_is_a_margin_before_paid_until(margin_s):
    d = _plan_with_one_unscheduled_instance(margin_s)
    at, cause = releases(d)["i-1"]
    assert cause == "plan"
    # the instance was launched at 0 and is billed by the hour
    assert at > 60.0 and (at + margin_s) % 3600.0 == 0.0, (at, d.actions)


def test_every_planned_launch_leaves_a_margin_before_its_paid_until():
    d = _plan_with_one_unscheduled_instance(MARGIN_S)
    new = [a for a in d.actions if isinstance(a, Launch)]
    assert new, d.actions
    for a in new:
        assert (a.release_after_s + MARGIN_S) % 3600.0 == 0.0, a


def test_a_shed_release_is_a_margin_before_paid_until():
    # Four instances paid to 3,600 s and scheduled to stay to 14,280 s (4 h less the
    # margin); 2 tasks left: the fleet still meets the deadline, so the plan sheds (the
    # surplus was first proposed long enough ago to act on).
    fleet = [node(f"i-{k}", paid_until_s=3600.0, release_at_s=4 * 3600.0 - MARGIN_S) for k in range(4)]
    snap = snapshot(now_s=1000.0, nodes=fleet, pending=2)
    memory = planned_memory(1000.0, last_plan_at_s=None, shorten_streak={n.id: 0.0 for n in fleet})
    d = decide(snap, memory=memory)
    rel = releases(d)
    assert rel, d.actions
    for at, cause in rel.values():
        assert cause in ("surplus_at_billing_boundary", "plan"), d.actions
        assert (at + MARGIN_S) % 3600.0 == 0.0, d.actions


# -- dispatch: only what ends before the release ------------------------------------------
def _free_slot_with_480_s_left(pending):
    """i-1 is released at 3,480 s and free at 3,000 s: 480 ref-s of paid time left; i-2 is busy."""
    free = node("i-1")
    busy = node("i-2", running=[running("t-busy", 2900.0)])
    snap = snapshot(now_s=3000.0, nodes=[free, busy], pending=pending)
    return decide(snap, replicate=False)


def test_dispatch_takes_the_largest_task_that_ends_before_the_release():
    d = _free_slot_with_480_s_left([("t-1000", 1000.0), ("t-470", 470.0), ("t-300", 300.0)])
    assert assigned(d) == {"t-470": "i-1"}, d.actions


def test_dispatch_leaves_a_slot_idle_when_no_task_ends_before_its_release():
    d = _free_slot_with_480_s_left([("t-1000", 1000.0), ("t-500", 500.0)])
    assert assigned(d) == {}, d.actions


def test_a_task_without_an_estimate_fits_at_its_upper_quantile():
    # mean 800 ref-s, sd ~330: mean + 1.28 sd ~ 1,220 ref-s. A speed-2 slot with 480 s left
    # holds 960 ref-s, less than that; a speed-3 one (1,440) holds it.
    for speed, expected in ((2.0, {}), (3.0, {"p0": "i-1"})):
        t = machine("m", speed=speed)
        free = node("i-1", type=t)
        busy = node("i-2", type=t, running=[running("t-busy", 2900.0)])
        snap = snapshot(now_s=3000.0, nodes=[free, busy], pending=1, types={"m": t})
        assert assigned(decide(snap, replicate=False)) == expected, speed


# -- the relative (eps, delta) stop ---------------------------------------------------------
@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3])
def test_the_relative_stop_holds_exactly_at_its_edge(eps):
    lower = np.array([1.0, 1.0])
    edge = (1.0 + eps) / (1.0 - eps)  # (1 - eps) U = (1 + eps) L
    assert relative_stop(lower, np.array([edge, edge * (1 + 1e-9)]), eps).tolist() == [True, False]
    mu_hat = relative_point(1.0, edge)
    assert mu_hat == pytest.approx(1.0 + eps) and mu_hat == pytest.approx((1.0 - eps) * edge)


@pytest.mark.parametrize("name", ["ebstop", "ebstop-msa", "ebstop-geo"])
@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_a_relative_rule_stops_only_once_its_bounds_are_eps_tight(name, eps):
    z = np.random.default_rng(7).uniform(0.2, 0.6, 200_000)
    rule = make_rule(name, eps, 0.1, 100.0)
    used = rule.feed_many(z)
    assert not rule.wants_more() and used < z.size
    lo, hi = rule.lower, rule.upper
    assert (1 - eps) * hi <= (1 + eps) * lo + 1e-12, (lo, hi)
    mu_hat = rule.estimate().mean_ref_s / 100.0
    # within (1 +/- eps) of every mean the bounds still allow
    assert mu_hat <= (1 + eps) * lo + 1e-12 and mu_hat >= (1 - eps) * hi - 1e-12


# -- private nodes are paid for ---------------------------------------------------------------
def test_the_simulated_cost_includes_the_private_nodes_by_the_hour():
    lab = PrivateNode("lab", slots=2, speed=1.0, cost_per_hour=0.36, local=True)
    runtimes = np.array([600.0, 900.0, 1200.0, 300.0, 450.0, 750.0] * 4)
    wl = SimWorkload(runtimes, None, 700.0, name="fixed")
    r = Simulation(Inventory(private=(lab,), types=()), wl, Goal(), options=SimOptions(seed=1)).run()
    assert r.tasks_done == 24 and r.makespan_s >= runtimes.sum() / 2
    assert r.cost_usd == pytest.approx(0.36 * r.makespan_s / 3600.0, rel=1e-12)


def test_the_simulated_cost_is_cloud_plus_private():
    lab = PrivateNode("lab", slots=1, speed=1.0, cost_per_hour=0.36, local=True)
    wl = SimWorkload(np.full(200, 900.0), None, 900.0, name="fixed")
    inv = Inventory(private=(lab,), types=(M,))
    r = Simulation(inv, wl, Goal("deadline", 2 * 3600.0), options=SimOptions(seed=1)).run()
    assert r.tasks_done == 200 and r.instances_launched > 0 and r.cloud_cost_usd > 0
    private_usd = 0.36 * r.makespan_s / 3600.0
    assert r.private_cost_usd == pytest.approx(private_usd, rel=1e-12)
    assert r.cost_usd == pytest.approx(r.cloud_cost_usd + private_usd, rel=1e-12)
