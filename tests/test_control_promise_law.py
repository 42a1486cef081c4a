"""The promise's law (the censored tail fitted) is the user's, not the controller's (issue 16).

The fitted tail (``tailfit.py``) makes the promise made part-way through a heavy-tailed bag
honest; put in the law the controller plans its deadline hold, tail allowance and buying on,
it decided worse (the heavy-tailed deadline of test_control_deadline_tail missed on seed 7,
10.64 h against 9 h; the league's LM20 no-estimates knee run bought all 80 instances). So
only the promise is read off it: a run decides exactly the same whichever law the promise
uses, and the promise shown differs.
"""

import pytest

from broker.core.control import promising
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.sim.engine import SimOptions, Simulation

from test_control_deadline_tail import heavy_tailed_bag, issue_fleet


def run(seed: int, n: int = 3000):
    return Simulation(issue_fleet(), heavy_tailed_bag(n, seed), Goal("deadline", 9 * 3600.0), ControllerConfig(),
                      SimOptions(seed=seed)).run()


@pytest.mark.slow
def test_the_promise_law_does_not_steer_the_controller(monkeypatch):
    fitted = run(7)
    law = promising.runtime_law
    # the promise read off the controller's law instead: every decision must stay the same
    monkeypatch.setattr(promising, "runtime_law",
                        lambda snap, rem, ratio_rel_se=None, fit_tail=False: law(snap, rem, ratio_rel_se, False))
    plain = run(7)
    assert fitted.fleet_changes == plain.fleet_changes
    assert [(r["instance"], r["at_s"]) for r in fitted.releases] == [(r["instance"], r["at_s"]) for r in plain.releases]
    assert (fitted.makespan_s, fitted.cost_usd) == (plain.makespan_s, plain.cost_usd)
    assert fitted.makespan_s <= 9 * 3600.0
    # ... and the promises made once the tail is fitted (200 runtimes seen) are not the same
    shown = [(seen, p.makespan_s_range, p.cost_usd_range) for _t, _d, seen, p in fitted.promise_log if seen >= 200]
    other = [(seen, p.makespan_s_range, p.cost_usd_range) for _t, _d, seen, p in plain.promise_log if seen >= 200]
    assert shown and shown != other


def promise_at_a_tenth(r, n: int):
    """The first promise made once a tenth of the bag was done (``bench/promises.py``)."""
    return next((p for _t, done, _seen, p in r.promise_log if done >= 0.1 * n), None)


@pytest.mark.slow
def test_promise_at_a_tenth_done_through_the_controller_covers_a_heavy_tailed_bag():
    """The promise the controller makes once 10% of a heavy-tailed bag is done (lognormal
    sigma 1.5, 3,000 tasks, a 9 h deadline), 30 seeded runs: with the controller's law it
    held the delivered makespan in 73% of them and the cost in 83% (the long tasks still
    running were put just past the longest runtime seen); with the fitted tail 97% and 90%.
    A binomial 90% of 30 falls below 80% about one time in twenty; the bound is 85%."""
    n, inside_t, inside_c, made = 3000, 0, 0, 0
    for seed in range(1, 31):
        r = run(seed, n)
        p = promise_at_a_tenth(r, n)
        assert p is not None
        t, c = p.holds(r.makespan_s, r.cost_usd)
        inside_t, inside_c, made = inside_t + t, inside_c + c, made + 1
    assert inside_t >= 0.85 * made and inside_c >= 0.85 * made, (inside_t, inside_c, made)
