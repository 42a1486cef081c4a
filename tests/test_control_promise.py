"""The promise pass's rules, each decided on a small hand-made state (broker/core/control/
promises.py, dispatch.tail_limit_ref), and a simulated run's promise across the surfaces."""

import math

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.dispatch import tail_limit_ref
from broker.core.control.pool import TaskPool
from broker.core.control.promises import _adjust_allowance
from broker.core.control.scratch import Scratch
from broker.core.control.snapshot import Goal, Memory, NodeView, Observations, Snapshot
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.core.plan.promise import Forecast
from broker.sim.engine import SimOptions, SimWorkload, Simulation

DEADLINE_S = 10 * 3600.0


def snap(now: float) -> Snapshot:
    return Snapshot(now_s=now, types={}, nodes=(), pending=TaskPool(), tasks_total=10, tasks_done=0,
                    observations=Observations(), committed_usd=0.0)


def test_near_the_deadline_a_slow_slot_leaves_a_long_tailed_task_to_a_fast_one():
    ctl = Controller(Goal("deadline", DEADLINE_S))
    memory = Memory(tail_size_ref_s=6000.0)
    slow, fast = NodeView("slow", 1, 1.0), NodeView("fast", 1, 4.0)
    now = DEADLINE_S - 3600.0  # an hour left: 3,600 ref-s on the slow slot, 14,400 on the fast one
    assert tail_limit_ref(ctl, snap(now), memory, slow, now, 1000.0, fastest=4.0) == pytest.approx(3600 - 5000)
    assert tail_limit_ref(ctl, snap(now), memory, fast, now, 1000.0, fastest=4.0) == math.inf
    early = DEADLINE_S - 5 * 3600.0  # five hours left: the slow slot may still start it
    assert tail_limit_ref(ctl, snap(early), memory, slow, early, 1000.0, fastest=4.0) >= 1000.0
    # other goals, or no tail known (every task has an estimate): no limit
    assert tail_limit_ref(Controller(Goal("budget", 5.0)), snap(now), memory, slow, now, 1000.0, 4.0) == math.inf
    assert tail_limit_ref(ctl, snap(now), Memory(), slow, now, 1000.0, fastest=4.0) == math.inf


def forecast_at(makespan_s: float, running_end_s: float | None = None) -> Forecast:
    running = None if running_end_s is None else np.full(10, running_end_s)
    return Forecast(np.full(10, makespan_s), np.full(10, 1.0), 0, running)


def test_an_overshoot_pulls_the_planning_deadline_in_but_never_past_half_the_time_left():
    ctl = Controller(Goal("deadline", DEADLINE_S))
    now = 3600.0
    memory = Memory(deadline_at_s=DEADLINE_S)
    s = Scratch()
    pulled = _adjust_allowance(ctl, snap(now), memory, now, forecast_at(DEADLINE_S + 1800.0), s)
    assert pulled.deadline_at_s < DEADLINE_S - 1800.0 and pulled.tail_allowance_s > 1800.0
    assert "planning" in s.notes[0]
    huge = _adjust_allowance(ctl, snap(now), memory, now, forecast_at(DEADLINE_S + 50 * 3600.0), Scratch())
    assert huge.deadline_at_s == pytest.approx(now + 0.5 * (DEADLINE_S - now))


def test_no_pull_when_only_the_running_tasks_would_miss():
    """A task running now that may end past the deadline is not shortened by buying machines."""
    ctl = Controller(Goal("deadline", DEADLINE_S))
    now = 8 * 3600.0
    memory = Memory(deadline_at_s=DEADLINE_S)
    s = Scratch()
    kept = _adjust_allowance(ctl, snap(now), memory, now, forecast_at(DEADLINE_S + 3600, DEADLINE_S + 3000), s)
    assert kept == memory
    assert "more machines would not help" in s.notes[0]


def test_slack_gives_back_half_of_an_allowance():
    ctl = Controller(Goal("deadline", DEADLINE_S))
    now = 3600.0
    memory = Memory(deadline_at_s=DEADLINE_S - 7200.0, tail_allowance_s=7200.0)
    back = _adjust_allowance(ctl, snap(now), memory, now, forecast_at(DEADLINE_S - 3 * 3600.0), Scratch())
    assert back.tail_allowance_s == pytest.approx(7200.0 - 0.5 * 3 * 3600.0)
    assert back.deadline_at_s == pytest.approx(DEADLINE_S - back.tail_allowance_s)


def test_a_simulated_run_promises_at_its_first_plan_and_keeps_refreshing():
    types = (MachineType("m", 2, 2.0, 0.3, 6, 120.0, Billing.hourly()),)
    inv = Inventory(private=(PrivateNode("own", 2, 1.0, 0.0, local=True),), types=types)
    rng = np.random.default_rng(5)
    wl = SimWorkload(rng.lognormal(math.log(600) - 0.5, 1.0, 600), None, None, name="logn")
    r = Simulation(inv, wl, Goal("deadline", 12 * 3600.0), ControllerConfig(confidence=0.8), SimOptions(seed=5)).run()
    assert r.promise is not None and r.promise.confidence == 0.8
    assert r.promise_samples == 30  # made at the first plan, once the sampling phase saw its 30 runtimes
    assert r.promise.why.startswith("first plan")
    assert len(r.promise_log) >= 2 and r.promise_log[-1][3].why.startswith("re-plan")
    lo, hi = r.promise.makespan_s_range
    assert lo <= r.promise.makespan_s <= hi and r.promise.cost_usd_range[0] <= r.promise.cost_usd


def test_the_forecast_keeps_what_the_buying_rule_keeps():
    """The controller plans for the work's point value and buys the hedge later (hedge_later,
    and a cost-first goal likewise): a replicate keeps its work plus the hysteresis floor,
    not the upper value's band (which charged capacity the controller sheds, and promised
    LM with estimates within 10% 2.7-2.8% above what it delivered). Without the rule the
    controller covers the upper value, and the forecast keeps between the two."""
    from broker.core.control.estimates import RemainingWork
    from broker.core.control.promising import keep_margin

    rem = RemainingWork(point_ref_s=1e6, upper_ref_s=1.3e6, mean_ref_s=600.0, sd_ref_s=600.0, pending=1600,
                        running=10, estimate_ratio=1.0)
    floor = ControllerConfig().hysteresis_min
    assert keep_margin(Controller(Goal("deadline", DEADLINE_S)), rem) == floor
    assert keep_margin(Controller(Goal("none", None)), rem) == floor
    lo, hi = keep_margin(Controller(Goal("deadline", DEADLINE_S), ControllerConfig(hedge_later=False)), rem)
    assert lo == floor and hi == pytest.approx(1.3 * 1.2 - 1)


def test_a_deadlines_promise_looks_ahead_to_the_give_backs_the_controller_will_make(monkeypatch):
    """The controller gives back half of its slack at each refresh (``_adjust_allowance``) and
    sheds its fleet against the later planning deadline; the promise is read off the fleet
    shed against today's planning deadline and against where those give-backs end, not the
    first alone (the promise made at 10% done missed the delivered makespan in 65% of
    bimodal runs, mostly below it).

    Here a fleet shed against a planning deadline H ends an hour before H."""
    import broker.core.control.promises as promises

    def shed_to(ctl, snap_, rem, now, releases, launches, rng, horizon_at_s=None, *args, **kw):
        return forecast_at(horizon_at_s - 3600.0)

    monkeypatch.setattr(promises, "forecast_fleet", shed_to)
    ctl = Controller(Goal("deadline", DEADLINE_S))
    now = 3600.0
    memory = Memory(deadline_at_s=DEADLINE_S - 7200.0, tail_allowance_s=7200.0)
    first = shed_to(ctl, None, None, now, {}, [], None, memory.deadline_at_s)
    told = promises._after_give_backs(ctl, snap(now), memory, now, None, Scratch(), [], first, 10)
    # what the controller's own refreshes do with the same forecasts, one after the other
    held = memory
    for _ in range(10):
        held = _adjust_allowance(ctl, snap(now), held, now, shed_to(ctl, None, None, now, {}, [], None,
                                                                     held.deadline_at_s), Scratch())
    assert held.deadline_at_s == pytest.approx(DEADLINE_S)  # every second of the allowance given back
    # the promise spans the run as it stands and the run after the give-backs
    assert told.makespan_quantile(0.95) == pytest.approx(held.deadline_at_s - 3600.0)
    assert told.makespan_quantile(0.05) == pytest.approx(DEADLINE_S - 3 * 3600.0)
    assert first.makespan_quantile(0.95) == pytest.approx(DEADLINE_S - 3 * 3600.0)  # what was promised before
    # a budget goal has no planning deadline to give back: its forecast stands
    assert promises._after_give_backs(Controller(Goal("budget", 5.0)), snap(now), memory, now, None, Scratch(), [],
                                      first, 10) is first


@pytest.mark.slow
def test_the_promise_at_ten_percent_done_holds_a_bimodal_bags_makespan():
    """Issue 16: the promises made during a run must hold too, not only the first. A bimodal
    bag (half 5 min, half 60 min, no estimates, no prior) of 2,000 tasks on a free 8-slot
    private node and four hourly EC2 types booting in 90-200 s, under a 7 h deadline: the
    first promise made once 10% of the bag is done held the delivered makespan in 3 of these
    12 runs, mostly above it (the forecast queued what the instances leave on the slow private
    node up to the deadline, where the controller keeps instances on to its planning
    deadline); 10 of 12 with that modelled. The 90% goal itself is measured over 20 seeds of
    10,000 tasks by bench/promises.py."""
    from broker.sim.workloads import build_workload

    types = tuple(MachineType(n, slots, speed, price, 20, boot, Billing.hourly()) for n, slots, speed, price, boot in
                  (("small", 1, 1.0, 0.05, 90.0), ("medium", 2, 1.5, 0.17, 120.0), ("large", 4, 2.0, 0.40, 150.0),
                   ("xlarge", 8, 2.5, 0.95, 200.0)))
    inv = Inventory(private=(PrivateNode("own", slots=8, speed=1.0, cost_per_hour=0.0, local=True),), types=types)
    spec = {"runtime": {"dist": "bimodal", "weight": 0.5, "mean1": "5m", "sd1": "1m", "mean2": "60m", "sd2": "10m"},
            "prior": "none"}
    n, held = 2000, 0
    for seed in range(1, 13):
        wl = build_workload(spec, seed, tasks=n, name="bimodal")
        r = Simulation(inv, wl, Goal("deadline", 7 * 3600.0), ControllerConfig(confidence=0.9),
                       SimOptions(seed=seed)).run()
        promise = next(p for _, done, _, p in r.promise_log if done >= 0.1 * n)
        held += promise.holds(r.makespan_s, r.cost_usd)[0]
    assert held >= 9, f"the promise at 10% done held the makespan in {held} of 12 runs"
