"""A deadline on a heavy-tailed bag is met with the stated confidence (issue 16).

Lognormal runtimes (mean 980 s, sigma 1.5, capped at a 6 h timeout: a few tasks take the
whole 6 h) on a free 8-slot private node and four hourly EC2 types booting in 90-200 s,
no estimates and no prior. The broker used to plan for the sum of the work and then let a
long task start late on a slow slot: it finished at 10.9-12.0 h against a 9 h deadline.
Now the first plan is held at the makespan's 90% quantile, the tail allowance follows the
forecast, near the deadline slow slots leave long-tailed tasks to fast ones, the sample does
not wait on a straggling runtime, and a long task left on a slow slot is copied to a fast
one (``bench/straggler.py`` prints why each seed meets or misses).
"""

import math

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation

TIMEOUT_S = 6 * 3600.0


def issue_fleet() -> Inventory:
    types = tuple(MachineType(n, slots, speed, price, 20, boot, Billing.hourly())
                  for n, slots, speed, price, boot in (("small", 1, 1.0, 0.05, 90.0), ("medium", 2, 1.5, 0.17, 120.0),
                                                       ("large", 4, 2.0, 0.40, 150.0), ("xlarge", 8, 2.5, 0.95, 200.0)))
    return Inventory(private=(PrivateNode("own", slots=8, speed=1.0, cost_per_hour=0.0, local=True),), types=types)


def heavy_tailed_bag(n: int, seed: int) -> SimWorkload:
    rng = np.random.default_rng(seed)
    x = np.minimum(rng.lognormal(math.log(980.0) - 1.5**2 / 2, 1.5, n), TIMEOUT_S)
    return SimWorkload(x, None, None, None, "lognormal-1.5", timeout_ref_s=TIMEOUT_S)


DEADLINE_S = 9 * 3600.0


class _FirstPlan(Simulation):
    """A simulation that notes the cause of the first plan's launches (``deadline_at_risk``:
    the broker said, before spending, that no plan holds the deadline at the confidence)."""

    first_cause = None

    def _launch(self, a) -> None:
        if self.first_cause is None:
            self.first_cause = a.cause.value
        super()._launch(a)


def run_seed(seed: int, n: int = 3000) -> tuple:
    sim = _FirstPlan(issue_fleet(), heavy_tailed_bag(n, seed), Goal("deadline", DEADLINE_S), ControllerConfig(),
                     SimOptions(seed=seed))
    return sim.run(), sim.first_cause


@pytest.mark.slow
def test_heavy_tailed_bag_meets_its_deadline():
    """30 seeds (about 30 s of CPU). The deadline is held at 90% confidence: of the runs the
    broker took on without saying the deadline was at risk, at least 90% meet it (27 of
    30 when it says so of none), each task done exactly once. Before the end-of-bag rules
    (``straggler.py``, ``sampling.samples_in_flight``) 16 of 30 met it; with them 30
    (``python3 bench/straggler.py --seeds 30``)."""
    met, promised, met_promised = 0, 0, 0
    for seed in range(1, 31):
        r, cause = run_seed(seed)
        assert r.tasks_done == 3000 and set(r.completions.values()) == {1}
        ok = r.makespan_s <= DEADLINE_S
        met += ok
        if cause != "deadline_at_risk":
            promised += 1
            met_promised += ok
            # the promise made at the first plan said so, with its interval
            assert r.promise is not None and r.promise.makespan_s_range[0] <= r.promise.makespan_s <= DEADLINE_S
    assert met_promised >= math.ceil(0.9 * promised), (met_promised, promised)
    assert met >= 27, met


@pytest.mark.slow
def test_a_free_slot_never_waits_for_a_straggling_sample():
    """Seed 8: 29 runtimes seen by 1.5 h, the 30th sample a 6 h task on the private node; the
    other slots stood idle and the first plan came at 6.0 h, too late for a 9 h deadline
    (missed at 10.0 h). A sample older than twice the mean runtime seen no longer holds a
    slot's place: the first plan now comes within the first hour."""
    r, _ = run_seed(8)
    assert r.promise_log and r.promise_log[0][0] < 3600.0, r.promise_log[:1]
    assert r.makespan_s <= DEADLINE_S


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 9, 13])
def test_a_long_task_on_a_slow_slot_is_copied_to_a_fast_one(seed):
    """With nothing left to hand out, a 5-6 reference-hour task started at 4-5 h on the
    private node (speed 1) ran on alone while xlarge slots (speed 2.5) stood idle: missed
    at 9.5-10.5 h. It is copied there once its high quantile given its age ends past the
    deadline, and that copy is the one kept at its instance's release (the private copy
    used to be, and the fast one was killed at the next billing boundary)."""
    r, _ = run_seed(seed)
    assert r.tasks_done == 3000 and set(r.completions.values()) == {1}
    assert r.makespan_s <= DEADLINE_S, r.makespan_s / 3600


def test_quantile_beyond_matches_brute_force():
    """``straggler.quantile_beyond`` is the smallest atom v > a with P(X <= v | X > a) >= q."""
    from broker.core.control.straggler import quantile_beyond
    from broker.core.plan.law import RuntimeLaw

    rng = np.random.default_rng(5)
    for _ in range(50):
        v = np.sort(rng.lognormal(6, 1.2, 40))
        w = rng.random(40)
        law = RuntimeLaw(v, w, 0.0, float(v.max()) * 3)
        a = float(rng.choice(v[:-1]))
        q = float(rng.uniform(0.5, 0.99))
        above = v > a
        cond = np.cumsum(law.weights[above]) / law.weights[above].sum()
        expected = v[above][int(np.argmax(cond >= q - 1e-12))]
        assert quantile_beyond(law, a, q) == pytest.approx(expected)
    # past every runtime seen: an exponential remainder, never past the cap
    law = RuntimeLaw(np.array([10.0, 20.0]), np.array([1.0, 1.0]), 0.0, 100.0, tail_from_ref_s=20.0,
                     tail_excess_ref_s=5.0)
    assert quantile_beyond(law, 30.0, 0.99) == pytest.approx(min(30.0 + 15.0 * math.log(100.0), 100.0))
