"""The forecast's fast paths (issue 20, the simulator's goals) give what main's gave.

- ``reference_list_schedule`` is main's ``broker.core.plan.promise._list_schedule`` before
  the change (commit cce33be), verbatim: every task recomputes, for every replicate and slot,
  whether it fits before the release. The incremental one rebuilds that only when the
  assumed size changes and otherwise updates the one slot per replicate a task changed.
  Compared bit for bit on generated fleets (private, closed and paid slots, extensions,
  budgets, estimates and shared fit sizes).
- ``reference_draw_beyond`` is main's ``RuntimeLaw.draw_beyond`` (commit cce33be), verbatim:
  a pass over every atom per running task. The fast one searches the law's survival
  function; the same atoms on generated laws (the two sum in different orders, so a draw
  within a rounding error of an atom's boundary could differ: never seen in 750,000 draws
  on laws of up to 300,000 atoms), the same generator state after.
- ``reference_units_shed`` is the step loop of main's ``broker.core.plan.shed.shed`` before
  the change (commit 90b1e78), verbatim: one machine's billing units tried one step at a
  time. ``_units_shed`` tries them all at once; the same steps, bit for bit.
- Whole simulations with both references patched in: every start, the makespan, cost and
  every promise the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import broker.core.plan.promise as promise_mod
from broker.core.plan.shed import _units_shed
from broker.core.plan.law import RuntimeLaw
from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, Simulation
from broker.sim.workloads import BUILTIN, build_workload


def reference_list_schedule(free, rel, speed, x, fit, extend=True):
    """main's _list_schedule before the change (commit cce33be), verbatim."""
    free = free.copy()
    rows = np.arange(free.shape[0])
    last_start = np.full(free.shape, -np.inf)
    last_ref = np.zeros(free.shape)
    undone = np.zeros(free.shape[0], dtype=int)
    private = np.isposinf(rel)  # only private slots have no release (a closed slot's is -inf)
    for k in range(x.shape[1]):
        fits = free + fit[k] / speed <= rel
        avail = np.where(fits, free, np.inf)
        j = np.argmin(avail, axis=1)
        none = ~np.isfinite(avail[rows, j])
        if none.any():
            j = np.where(none, np.argmin(free if extend else np.where(private, free, np.inf), axis=1), j)
        ok = np.isfinite(free[rows, j]) & (extend | ~none | private[rows, j])
        undone += ~ok
        r, j = rows[ok], j[ok]
        last_start[r, j] = free[r, j]
        last_ref[r, j] = x[ok, k]
        free[r, j] = free[r, j] + x[ok, k] / speed[r, j]
    return free, last_start, last_ref, undone


def reference_draw_beyond(self, rng, age_ref_s, count):
    """main's RuntimeLaw.draw_beyond before the change (commit cce33be), verbatim."""
    above = self.values_ref_s > age_ref_s
    real = above & (self.values_ref_s < self.cap_ref_s)
    if self.tail_from_ref_s is not None:
        real &= self.values_ref_s <= self.tail_from_ref_s
    if not real.any():
        mean = max(self.tail_excess_ref_s, 0.5 * age_ref_s, 1e-9)
        return np.minimum(rng.exponential(mean, count), max(self.cap_ref_s - age_ref_s, 0.0)), True
    w = self.weights[above]
    cum = np.cumsum(w / w.sum())
    idx = np.minimum(np.searchsorted(cum, rng.random(count), side="right"), cum.size - 1)
    return self.values_ref_s[above][idx] - age_ref_s, False


@st.composite
def tails(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    R, m, k = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(0, 40))
    speed = rng.choice([0.5, 1.0, 2.0, 5.0, 20.0], size=(R, m)) * (1.0 + 0.1 * rng.random((R, m)) * draw(st.booleans()))
    # slot states: a finite release, private (inf), closed (-inf), and free times that are
    # sometimes inf (a slot that took no more work after the bulk) and often tied
    kind = rng.choice(4, size=(R, m), p=draw(st.sampled_from([(0.7, 0.1, 0.1, 0.1), (0.25, 0.25, 0.25, 0.25),
                                                                (1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0)])))
    free = np.round(rng.random((R, m)) * 200.0, int(draw(st.integers(-2, 1))))
    rel = np.where(kind == 1, np.inf, free + rng.random((R, m)) * draw(st.sampled_from([50.0, 500.0, 5000.0])))
    rel = np.where(kind == 2, -np.inf, rel)
    free = np.where(kind == 3, np.inf, free)
    x = rng.lognormal(3.0, 1.0, (R, k))
    # fit sizes: one shared size (tasks without an estimate), estimates, or both (estimates first)
    n_est = draw(st.integers(0, k))
    shared = float(draw(st.sampled_from([10.0, 40.0, 300.0])))
    fit = np.concatenate((np.sort(rng.lognormal(3.0, 1.0, n_est))[::-1], np.full(k - n_est, shared)))
    return free, rel, speed, x, fit, draw(st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tails())
def test_list_schedule_equals_the_whole_array_rule(case):
    free, rel, speed, x, fit, extend = case
    got = promise_mod._list_schedule(free, rel, speed, x, fit, extend)
    want = reference_list_schedule(free, rel, speed, x, fit, extend)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert np.array_equal(g, w), (g, w)


@st.composite
def laws_and_ages(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["observed", "parametric", "unsorted", "tied"]))
    n = draw(st.integers(2, 3000))
    finished = rng.lognormal(3.0, draw(st.sampled_from([0.3, 1.0, 2.0])), n)
    if kind == "tied":  # runtimes measured to the second: many equal atoms
        finished = np.ceil(finished)
    ages = rng.lognormal(3.0, 1.0, draw(st.integers(0, 50)))
    cap = float(finished.max()) * draw(st.sampled_from([1.0, 4.0]))
    if kind == "parametric":
        law = RuntimeLaw.parametric(float(finished.mean()), float(finished.std()), 0.1, cap)
    elif kind == "unsorted":  # atoms in any order take the scan
        law = RuntimeLaw(finished, rng.random(n) + 0.01, 0.0, cap)
    else:
        law = RuntimeLaw.observed(finished, ages, cap)
    probes = np.concatenate((ages, rng.choice(law.values_ref_s, 20), [0.0, cap, 2 * cap, float(finished.max())],
                             rng.uniform(0, 2 * cap, 20)))
    return law, probes, draw(st.integers(1, 300))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(laws_and_ages())
def test_draw_beyond_draws_what_the_scan_draws(case):
    law, probes, count = case
    for age in probes:
        seed = int(age * 1000) % (2**31)
        a_rng, b_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        got, got_capped = law.draw_beyond(a_rng, float(age), count)
        want, want_capped = reference_draw_beyond(law, b_rng, float(age), count)
        assert got_capped == want_capped
        assert np.array_equal(got, want), (age, got, want)
        assert a_rng.random() == b_rng.random()  # the same draws taken from the generator


def _run(goal: Goal, tasks: int, seed: int, billing: Billing):
    types = tuple(MachineType(n, 1, s, p, 8, 60.0, billing)
                  for n, s, p in [("m1.small", 1, 0.080), ("c1.medium", 5, 0.165), ("c1.xlarge", 20, 0.660)])
    inv = Inventory(private=(PrivateNode("xeon", 1, 10.0, 0.32, local=True),), types=types)
    wl = build_workload(BUILTIN["LM"], seed, tasks=tasks)
    sim = Simulation(inv, wl, goal, ControllerConfig(policy="broker"), SimOptions(seed=seed))
    starts = []
    original_start = sim._start

    def record(a):
        starts.append((sim.now, a.task_id, a.slot.node, a.slot.index))
        original_start(a)

    sim._start = record
    r = sim.run()
    promises = [(t, p.to_json()) for t, _, _, p in r.promise_log]
    return r.makespan_s, r.cost_usd, r.instances_launched, starts, promises


@pytest.mark.parametrize("goal,billing", [(Goal("point", 1), Billing.hourly()), (Goal("deadline", 4 * 3600), Billing.hourly()),
                                          (Goal("budget", 6.0), Billing.per_second())])
@pytest.mark.parametrize("seed", [1, 2])
def test_simulations_decide_and_promise_as_with_the_references(goal, billing, seed, monkeypatch):
    """Whole runs: the same task on the same slot at the same moment, the same makespan,
    cost and promises, with the fast paths and with the references."""
    got = _run(goal, 400, seed, billing)
    monkeypatch.setattr(promise_mod, "_list_schedule", reference_list_schedule)
    monkeypatch.setattr(RuntimeLaw, "draw_beyond", reference_draw_beyond)
    want = _run(goal, 400, seed, billing)
    assert got[3] == want[3]
    assert got[:3] == want[:3]
    assert got[4] == want[4] and len(got[4]) > 0


def reference_units_shed(release_at_s, unit, units, full, sp, st, busy_max, surplus, horizon_at_s):
    """main's step loop in shed() (commit 90b1e78), verbatim but for its inputs' names."""
    k = np.zeros(full.shape[0], dtype=int)
    for step in range(1, units + 1):
        at = release_at_s - step * unit
        lost = full - (sp * np.clip(np.minimum(horizon_at_s, at) - st, 0.0, None)).sum(axis=1)
        ok = (lost <= surplus) & (busy_max <= at)
        if not ok.any():
            break
        k = np.where(ok, step, k)
    return k


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 4), st.integers(1, 48), st.booleans())
def test_units_shed_takes_the_steps_the_loop_takes(seed, R, slots, units, tight):
    rng = np.random.default_rng(seed)
    unit = float(rng.choice([300.0, 3600.0]))
    release = 20 * 3600.0 + float(rng.integers(0, 3600))
    horizon = float(rng.uniform(release - units * unit, release + 3600.0))
    sp = np.broadcast_to(rng.choice([1.0, 2.5, 20.0], size=slots), (R, slots)).copy()
    st_ = rng.uniform(0.0, release, (R, slots))
    full = (sp * np.clip(np.minimum(horizon, release) - st_, 0.0, None)).sum(axis=1)
    busy_max = rng.uniform(0.0, release, R) if tight else np.full(R, -np.inf)
    surplus = full * rng.uniform(-0.2, 1.2, R)
    got = _units_shed(release, unit, units, full, sp, st_, busy_max, surplus, horizon)
    want = reference_units_shed(release, unit, units, full, sp, st_, busy_max, surplus, horizon)
    assert np.array_equal(got, want), (got, want)
