"""Online estimation: Kaplan-Meier residuals against a known truth, the fallback path,
BaTS's tau_e, the remaining-work upper value, and the speed estimator."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, strategies as st

from broker.core.estimate.speed import SpeedEstimator
from broker.core.estimate.survival import KaplanMeier, remaining_work, tau_e_residual

THETA_S, CAP_S = 600.0, 6000.0  # runtimes Gamma(shape 2, scale 600 s): mean 1200 s


def true_residual(age_s: float) -> float:
    """E[P - a | P > a] for Gamma(2, theta): theta (2 + a/theta) / (1 + a/theta)."""
    u = age_s / THETA_S
    return THETA_S * (2 + u) / (1 + u)


def snapshot(rng, n=2000, slots=100, t_obs_s=3 * 3600.0):
    """List-schedule a bag on ``slots`` and look at it at ``t_obs_s``."""
    runtimes = np.minimum(rng.gamma(2.0, THETA_S, n), CAP_S)
    free, starts = [0.0] * slots, np.full(n, np.inf)
    for j in range(n):
        t = heapq.heappop(free)
        if t >= t_obs_s:
            break
        starts[j] = t
        heapq.heappush(free, t + runtimes[j])
    ends = starts + runtimes
    finished = ends <= t_obs_s
    running = (starts < t_obs_s) & ~finished
    return runtimes, runtimes[finished], t_obs_s - starts[running], running, starts >= t_obs_s


@pytest.mark.slow
def test_kaplan_meier_residual_matches_the_truth_and_naive_reading_does_not():
    ages = (600.0, 1800.0, 3000.0)
    km_err = {a: [] for a in ages}
    naive_err = []
    for rep in range(150):
        _, finished, running_ages, _, _ = snapshot(np.random.default_rng([rep, 5]))
        km = KaplanMeier(finished, running_ages, CAP_S)
        for a in ages:
            km_err[a].append(km.residual(a).expected_ref_s / true_residual(a) - 1)
        # tau_e over finished tasks only ignores that long tasks are still running
        naive_err.append(tau_e_residual(finished, 1800.0, CAP_S).expected_ref_s / true_residual(1800.0) - 1)
    for a in ages:
        err = np.asarray(km_err[a])
        assert abs(err.mean()) < max(3 * err.std() / np.sqrt(err.size), 0.02), f"age {a}"
    naive = np.asarray(naive_err)
    assert naive.mean() < -0.05 and naive.mean() + 3 * naive.std() / np.sqrt(naive.size) < 0


@pytest.mark.slow
def test_upper_remaining_work_holds_with_probability_about_one_minus_delta():
    reps, delta, covered, point_err = 200, 0.1, 0, []
    for rep in range(reps):
        runtimes, finished, ages, running, unstarted = snapshot(np.random.default_rng([rep, 6]))
        km = KaplanMeier(finished, ages, CAP_S)
        work = remaining_work([km.mean_ref_s] * int(unstarted.sum()), ages, finished, delta, CAP_S)
        truth = runtimes[unstarted].sum() + (runtimes[running] - ages).sum()
        covered += truth <= work.upper_ref_s
        point_err.append(work.point_ref_s / truth - 1)
    bar = 3 * np.sqrt(delta * (1 - delta) / reps)
    assert covered / reps >= 1 - delta - bar
    assert covered / reps <= 1 - delta / 10  # an upper value, not a uselessly huge one
    assert abs(np.mean(point_err)) < 0.02


def test_a_task_older_than_every_observation_falls_back_and_is_flagged():
    km = KaplanMeier([100.0, 200.0, 300.0], [50.0], cap_ref_s=1000.0)
    inside = km.residual(150.0)
    assert not inside.fallback
    assert inside.expected_ref_s == pytest.approx(100.0)  # {200, 300} equally likely
    outside = km.residual(450.0)
    assert outside.fallback and outside.expected_ref_s == pytest.approx(550.0)  # up to the cap
    assert km.residual(5000.0).expected_ref_s == 0.0  # past the timeout: nothing, no error
    work = remaining_work([10.0], [150.0, 450.0], [100.0, 200.0, 300.0], 0.1, 1000.0)
    assert work.fallbacks == (1,)
    # with the two running tasks censored, S = 0.8, 0.533, 0.267 after 100, 200, 300 and the
    # last 0.267 sits at the cap: the task of age 150 ends at 200, 300 or 1000, equally likely
    assert work.point_ref_s == pytest.approx(10.0 + (50.0 + 150.0 + 850.0) / 3 + 550.0)
    assert tau_e_residual([100.0, 200.0], 250.0, 1000.0).fallback


def test_a_censored_tail_is_put_at_the_cap():
    # largest observation censored: S never reaches 0 and its mass goes to the cap
    km = KaplanMeier([100.0], [400.0], cap_ref_s=1000.0)
    assert km.survival(100.0) == pytest.approx(0.5)
    assert km.mean_ref_s == pytest.approx(0.5 * 100 + 0.5 * 1000)
    assert km.residual(400.0).expected_ref_s == pytest.approx(600.0)
    empty = KaplanMeier([], [], cap_ref_s=1000.0)
    assert empty.residual(10.0).expected_ref_s == pytest.approx(990.0)


@given(st.lists(st.floats(1.0, 1000.0), min_size=1, max_size=40))
def test_without_censoring_kaplan_meier_is_the_empirical_distribution(xs):
    km = KaplanMeier(xs, [], cap_ref_s=2000.0)
    assert km.mean_ref_s == pytest.approx(np.mean(xs))
    assert km.variance_ref_s2 == pytest.approx(np.var(xs), abs=1e-6 * max(xs) ** 2)
    a = float(np.median(xs))
    longer = [x for x in xs if x > a]
    if longer:
        assert km.residual(a).expected_ref_s == pytest.approx(np.mean(longer) - a)
        assert tau_e_residual(xs, a, 2000.0).expected_ref_s == pytest.approx(np.mean(longer) - a)


def test_speed_starts_declared_and_moves_to_the_ratio_by_ten_tasks():
    speeds = SpeedEstimator({"c5": 4.0})
    assert speeds.speed("c5") == 4.0
    for k in range(1, 16):
        speeds.record("c5", ref_work_s=600.0, wall_s=100.0)  # observed speed 6
        expected = 6.0 if k >= 10 else (k / 10) * 6.0 + (1 - k / 10) * 4.0
        assert speeds.speed("c5") == pytest.approx(expected)
    with pytest.raises(KeyError):
        speeds.record("m5", 1.0, 1.0)
    with pytest.raises(ValueError):
        SpeedEstimator({"x": 0.0})
