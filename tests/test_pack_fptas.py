"""Subset-sum FPTAS (thesis Algorithms 4, 6) against brute force, and the rearrangement
(Algorithm 5): never dearer, never a new billing unit."""


import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from broker.core.billing import Billing
from broker.core.pack import (UNASSIGNED, Assignment, Bin, approx_subset_sum, billing_units,
                              cost_usd, fptas_assign, rearrange, subset_order, trim)

EPSILONS = st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.6])


def best_subset_sum(sizes, target):
    """Brute force over all subsets: the largest sum not above the target."""
    sums = np.zeros(1)
    for s in sizes:
        sums = np.concatenate((sums, sums + s))  # every subset's sum, 2^n of them
    return float(sums[sums <= target].max())


def algorithm_4(values, delta):
    """The printed trimming loop: keep z_i when z_i > last / (1 - delta)."""
    kept, last = [values[0]], values[0]
    for z in values[1:]:
        if z > last / (1 - delta):
            kept.append(z)
            last = z
    return kept


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=300), st.sampled_from([1e-4, 0.01, 0.1, 0.5]))
def test_trimming_keeps_a_close_lower_representative_of_every_dropped_sum(values, delta):
    values = np.unique(np.array(values))
    kept = trim(values, delta)
    assert (np.diff(kept) > 0).all() and kept[0] == 0
    kept_values = values[kept]
    for y in values:
        z = kept_values[np.searchsorted(kept_values, y, side="right") - 1]  # largest kept <= y
        assert (1 - delta) * y <= z * (1 + 1e-12)
    assert kept.size <= 2 * len(algorithm_4(values.tolist(), delta))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 100).map(float), st.floats(0.0, 100.0)), max_size=14),
       st.floats(0.0, 400.0), EPSILONS)
def test_the_chosen_subset_is_within_one_minus_eps_of_the_best_and_never_over(sizes, target, eps):
    total, chosen = approx_subset_sum(np.array(sizes), target, eps)
    assert len(set(chosen.tolist())) == chosen.size
    assert total == pytest.approx(sum(sizes[k] for k in chosen), abs=1e-9)
    assert total <= target * (1 + 1e-12)
    assert total >= (1 - eps) * best_subset_sum(sizes, target) - 1e-9


def test_large_items_need_the_lists_not_just_largest_first_fit():
    # Largest-first fit takes 6 and stops at 6 < 0.9 x 10; only 5 + 5 meets the bound.
    total, chosen = approx_subset_sum(np.array([6.0, 5.0, 5.0]), 10.0, 0.1)
    assert total == 10.0 and chosen.tolist() == [1, 2]


def small_catalogue(n_bins, rng):
    speeds = rng.choice([1.0, 2.0, 5.0], n_bins)
    prices = rng.choice([0.08, 0.165, 0.32], n_bins)
    return [Bin(f"b{i}", "t", 1, float(speeds[i]), float(prices[i])) for i in range(n_bins)]


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 4), EPSILONS)
def test_each_target_gets_a_near_best_subset_of_the_tasks_left_at_its_turn(seed, n_tasks, n_bins, eps):
    rng = np.random.default_rng(seed)
    sizes = np.round(rng.uniform(0, 50, n_tasks), 1)
    bins = small_catalogue(n_bins, rng)
    targets = np.round(rng.uniform(0, 120, n_bins), 1)
    a = fptas_assign(sizes, bins, targets, eps, billing=None, place_leftovers=False)
    left = set(range(n_tasks))
    for i in subset_order(bins, targets):
        if targets[i] <= 0:
            break
        part = np.flatnonzero(a.bin_of_task == i)
        assert set(part.tolist()) <= left
        got = sizes[part].sum()
        assert got <= targets[i] + 1e-9
        assert got >= (1 - eps) * best_subset_sum([sizes[k] for k in sorted(left)], targets[i]) - 1e-9
        left -= set(part.tolist())
    assert set(a.unassigned.tolist()) == left


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 60), st.integers(1, 8), EPSILONS,
       st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 1200)]))
def test_fptas_places_every_task_once_and_never_past_a_target(seed, n_tasks, n_bins, eps, billing):
    rng = np.random.default_rng(seed)
    sizes = 60 * 2 ** np.clip(rng.normal(1.8, 3, n_tasks), -3, 8)
    bins = small_catalogue(n_bins, rng)
    targets = rng.uniform(0, 2 * sizes.sum() / n_bins + 1, n_bins)
    a = fptas_assign(sizes, bins, targets, eps, billing=billing)
    parts = a.parts()
    assert sorted(np.concatenate(parts + [a.unassigned]).tolist()) == list(range(n_tasks))
    assert (a.loads_ref_s <= targets * (1 + 1e-9) + 1e-6).all()
    room = targets - a.loads_ref_s
    for j in a.unassigned:  # the leftover pass offered it every bin's room
        assert (room < sizes[j] - 1e-9).all()


def test_rearrangement_moves_a_straggler_into_paid_time_and_returns_the_machine():
    bins = (Bin("cheap", "t", 1, 1.0, 0.10), Bin("dear", "t", 1, 1.0, 0.50))
    sizes = np.array([1_500.0, 1_500.0, 400.0, 100.0])
    a = Assignment(bins, sizes, np.array([0, 0, 1, 1]))  # cheap busy 3,000 s of its paid hour
    hourly = Billing.hourly()
    r = rearrange(a, hourly, limits_ref_s=[3_600.0, 3_600.0])
    assert r.bin_of_task.tolist() == [0, 0, 0, 0]
    assert cost_usd(r, hourly) == pytest.approx(cost_usd(a, hourly) - 0.50)


def test_rearrangement_never_buys_time_to_save_time():
    bins = (Bin("cheap", "t", 1, 1.0, 0.10), Bin("dear", "t", 1, 1.0, 0.50))
    sizes = np.array([3_000.0, 700.0])  # 700 s do not fit the 600 s left of cheap's hour
    a = Assignment(bins, sizes, np.array([0, 1]))
    assert rearrange(a, Billing.hourly(), [7_200.0, 7_200.0]).bin_of_task.tolist() == [0, 1]
    # ... nor past a limit: the paid room neither bin may use (limits) stays unused.
    small = Assignment(bins, np.array([3_000.0, 100.0]), np.array([0, 1]))
    assert rearrange(small, Billing.hourly(), [3_050.0, 150.0]).bin_of_task.tolist() == [0, 1]
    # With the dear bin's whole paid hour allowed, the cheap bin's work moves there instead:
    # one unit fewer (the cheap hour), the dear hour was paid anyway.
    moved = rearrange(small, Billing.hourly(), [3_050.0, 3_600.0])
    assert moved.bin_of_task.tolist() == [1, 1]
    assert cost_usd(moved, Billing.hourly()) == pytest.approx(0.50)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 50), st.integers(1, 7),
       st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 1200)]),
       st.booleans())
def test_rearrangement_never_costs_more_never_adds_a_unit_and_keeps_every_task(
        seed, n_tasks, n_bins, billing, with_private):
    rng = np.random.default_rng(seed)
    bins = tuple(Bin(f"b{i}", "t", int(rng.integers(1, 4)), float(rng.choice([1.0, 2.0, 5.0])),
                     float(rng.choice([0.0, 0.08, 0.165, 0.32, 0.66])),
                     private=bool(with_private and i == 0)) for i in range(n_bins))
    sizes = rng.uniform(0, 3_000, n_tasks)
    a = Assignment(bins, sizes, rng.integers(-1, n_bins, n_tasks))
    limits = a.loads_ref_s * rng.uniform(1.0, 3.0, n_bins) + rng.uniform(0, 5_000, n_bins)
    r = rearrange(a, billing, limits)
    assert cost_usd(r, billing) <= cost_usd(a, billing) + 1e-9
    assert (billing_units(r, billing) <= billing_units(a, billing)).all()
    assert (r.bin_of_task[a.bin_of_task == UNASSIGNED] == UNASSIGNED).all()
    assert (r.bin_of_task[a.bin_of_task != UNASSIGNED] != UNASSIGNED).all()
    grew = r.loads_ref_s > a.loads_ref_s + 1e-9
    assert (r.loads_ref_s[grew] <= limits[grew] + 1e-6).all()


def test_eps_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="eps"):
        fptas_assign([1.0], [Bin("a", "t", 1, 1.0, 1.0)], [1.0], 1.0)
