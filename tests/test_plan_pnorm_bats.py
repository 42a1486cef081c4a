"""p-norm allocation (KKT and r = 1) and BaTS's configuration against brute force."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from broker.core.model import MachineType
from broker.core.plan import NoFeasiblePlan, Work, bats_configuration, pnorm_allocation


def objective(betas, psi, r):
    return sum(b * p**r for b, p in zip(betas, psi))


@pytest.mark.parametrize("seed", range(10))
def test_pnorm_allocation_satisfies_kkt(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    machines = [(float(s), float(c)) for s, c in zip(rng.uniform(0.5, 20, n), rng.uniform(0.05, 1.0, n))]
    alphas = list(rng.uniform(0.5, 2.0, n))
    r = float(rng.uniform(1.2, 4.0))
    W = 10_000.0
    psi = np.array(pnorm_allocation(machines, W, r, alphas))
    betas = np.array([a * c / s**r for a, (s, c) in zip(alphas, machines)])
    assert psi.sum() == pytest.approx(W)
    assert (psi > 0).all()
    # Numerical gradient of sum beta psi^r: equal in every coordinate at the optimum (= lambda).
    h = 1e-4
    grad = [(objective(betas, psi + h * np.eye(n)[i], r) - objective(betas, psi - h * np.eye(n)[i], r)) / (2 * h)
            for i in range(n)]
    assert max(grad) == pytest.approx(min(grad), rel=1e-5)
    # and no feasible move (keep the sum, stay >= 0) lowers the objective
    base = objective(betas, psi, r)
    for _ in range(50):
        d = rng.normal(size=n)
        d -= d.mean()
        step = 0.01 * W * d / np.abs(d).max()
        moved = np.clip(psi + step, 0, None)
        moved *= W / moved.sum()
        assert objective(betas, moved, r) >= base * (1 - 1e-12)


def test_pnorm_r_equal_one_gives_all_work_to_the_most_cost_efficient():
    machines = [(1.0, 0.08), (5.0, 0.165), (20.0, 0.66), (4.0, 0.32)]  # beta = c / s: 0.08, 0.033, 0.033, 0.08
    psi = pnorm_allocation(machines, 1000.0, 1.0)
    assert psi == pytest.approx((0.0, 500.0, 500.0, 0.0))  # exact ties split
    psi = pnorm_allocation([(1.0, 0.08), (5.0, 0.165)], Work(1000.0, 10, 100.0), 1.0)
    assert psi == (0.0, 1000.0)


def test_pnorm_rejects_r_below_one():
    with pytest.raises(ValueError):
        pnorm_allocation([(1.0, 1.0)], 10.0, 0.5)


def brute_force_bats(types, n_tasks, runtime_s, budget_usd, atu_s):
    best = None
    for counts in itertools.product(*(range(t.limit + 1) for t in types)):
        speed = sum(a * t.slots / runtime_s[t.name] for a, t in zip(counts, types))
        if speed <= 0:
            continue
        per_atu = sum(a * t.price_per_hour * atu_s / 3600 for a, t in zip(counts, types))
        cost = per_atu * math.ceil(n_tasks / (atu_s * speed) - 1e-9)
        if cost <= budget_usd + 1e-9 and (best is None or speed > best[0] * (1 + 1e-12)):
            best = (speed, cost)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_bats_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    types = [MachineType(f"c{i}", rng.randint(1, 2), 1.0, rng.choice([3.0, 9.0, 12.0, 0.165, 0.5]),
                         limit=rng.randint(1, 4)) for i in range(rng.randint(2, 3))]
    runtime = {t.name: rng.choice([300.0, 900.0, 1800.0]) for t in types}
    n_tasks = rng.randint(20, 400)
    budget = rng.uniform(1, 200)
    expected = brute_force_bats(types, n_tasks, runtime, budget, 3600.0)
    if expected is None:
        with pytest.raises(NoFeasiblePlan):
            bats_configuration(types, n_tasks, runtime, budget)
        return
    plan = bats_configuration(types, n_tasks, runtime, budget)
    speed = n_tasks / plan.makespan_s
    assert speed == pytest.approx(expected[0], rel=1e-9)
    assert plan.cost_usd <= budget + 1e-9
    # the fleet it reports has that speed
    assert sum(plan.fleet[t.name] * t.slots / runtime[t.name] for t in types) == pytest.approx(speed)


def test_bats_with_an_unbounded_budget_takes_every_machine():
    types = [MachineType("c0", 1, 1.0, 3.0, limit=32), MachineType("c1", 1, 4.0, 9.0, limit=32)]
    plan = bats_configuration(types, 1000, {"c0": 900.0, "c1": 225.0}, math.inf)
    assert dict(plan.fleet) == {"c0": 32, "c1": 32}
