"""Stopping rules: exact phase sizes, the feeding protocol, validation, expected counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from broker.core.estimate import RULE_NAMES, expected_samples, make_rule, tighter_rmax_saving
from broker.core.estimate.aa import AARule, upsilon, upsilon1, upsilon2
from broker.core.estimate.bats import bats_sample_size


def test_aa_phases_have_the_published_sizes():
    # Z = 0.5 always: SRA stops at the first N with N/2 >= Y1; phase 2 gets ceil(Y2 eps/mu1)
    # pairs with S = 0, so rho = eps mu1; phase 3 gets ceil(Y2 rho / mu1^2) samples.
    eps, delta = 0.1, 0.05
    y1 = upsilon1(math.sqrt(eps), delta / 3)
    n_sra = math.ceil(2 * y1)
    mu1 = y1 / n_sra
    n_pairs = math.ceil(upsilon2(eps, delta) * eps / mu1)
    n_final = math.ceil(upsilon2(eps, delta) * (eps * mu1) / mu1**2)
    rule = AARule(eps, delta, 100.0)
    used = rule.feed_many(np.full(100_000, 0.5))
    assert used == n_sra + 2 * n_pairs + n_final
    assert rule.estimate().mean_ref_s == pytest.approx(50.0)


def test_upsilon_constants():
    assert upsilon(0.1, 0.05) == pytest.approx(4 * (math.e - 2) * math.log(40) / 0.01)
    assert upsilon1(0.5, 0.1) == pytest.approx(1 + 1.5 * upsilon(0.5, 0.1))
    root = math.sqrt(0.04)
    assert upsilon2(0.04, 0.1) == pytest.approx(
        2 * (1 + root) * (1 + 2 * root) * (1 + math.log(1.5) / math.log(20)) * upsilon(0.04, 0.1))


def test_aa_pair_phase_estimates_the_variance():
    # alternating 0/1 pairs: (Z - Z')^2 / 2 = 1/2 each, so rho = 1/2 > eps mu1.
    eps, delta = 0.2, 0.1
    rule = AARule(eps, delta, 1.0)
    rule.feed_many(np.ones(math.ceil(rule.sra_threshold())))  # SRA on ones: N = ceil(Y1)
    assert rule.phase == "pairs"
    pairs = rule.needed().at_least - 1
    rule.feed_many(np.tile([0.0, 1.0], pairs // 2 + 1)[:pairs])
    assert rule.phase == "final"
    mu1 = rule.sra_threshold() / math.ceil(rule.sra_threshold())
    assert rule.needed().at_most == rule.final_count(0.5, mu1)


def test_bats_sample_size_matches_the_paper():
    # BaTS 003 Sec. 3: z = 1.96, Delta = 0.25, N = 1000 give n = 30 (their n_1000).
    assert bats_sample_size(1000, 0.25, 0.05) == 30
    # the bound z^2 / (2 Delta^2) for a huge bag: 1.96^2 / (2 * 0.01) = 192.1 -> 193 at most
    assert bats_sample_size(10**9, 0.1, 0.05) == math.ceil(1.959963984540054**2 / 0.02)
    rule = make_rule("bats", 0.1, 0.05, 60.0, n_tasks=1000)
    rule.feed_many(np.full(1000, 0.5))
    assert rule.samples == bats_sample_size(1000, 0.1, 0.05)
    assert rule.estimate().warnings  # 18 % of the bag: more than 5 %


sample_runs = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=400)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(RULE_NAMES), sample_runs, st.integers(1, 50))
def test_feeding_runs_equals_feeding_one_by_one(name, values, chunk):
    z = np.array(values * (3_000 // len(values) + 1))[:3_000]
    one, many = (make_rule(name, 0.3, 0.2, 10.0, n_tasks=50_000) for _ in range(2))
    for value in z:
        if not one.wants_more():
            break
        one.feed(value)
    position = 0
    while many.wants_more() and position < z.size:
        position += many.feed_many(z[position : position + chunk]) or chunk
    assert one.samples == many.samples
    assert one.wants_more() == many.wants_more()
    if not one.wants_more():
        a, b = one.estimate(), many.estimate()
        assert (a.samples, a.capped, a.warnings) == (b.samples, b.capped, b.warnings)
        assert a.mean_ref_s == pytest.approx(b.mean_ref_s, rel=1e-9)  # sums in another order


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(RULE_NAMES), sample_runs)
def test_needed_brackets_what_is_consumed(name, values):
    # at_least never overshoots, at_most never undershoots, whatever the data.
    z = np.array(values * (3_000 // len(values) + 1))[:3_000]
    rule = make_rule(name, 0.3, 0.2, 10.0, n_tasks=50_000)
    for position, value in enumerate(z):
        if not rule.wants_more():
            break
        need = rule.needed()
        probe = make_rule(name, 0.3, 0.2, 10.0, n_tasks=50_000)
        probe.feed_many(z[:position])
        remaining = probe.feed_many(z[position:])
        if not probe.wants_more():
            assert need.at_least <= remaining
            assert need.at_most is None or remaining <= need.at_most
        rule.feed(value)
        if position > 30:
            break


def test_capped_samples_are_counted():
    rule = make_rule("bats", 0.25, 0.05, 10.0, n_tasks=1000)
    rule.feed_many(np.array([1.0] * 5 + [0.5] * 100))
    assert rule.estimate().capped == 5


@pytest.mark.parametrize("eps, delta", [(0.0, 0.1), (1.0, 0.1), (0.1, 0.0), (0.1, 1.5)])
def test_bad_contract_is_refused(eps, delta):
    with pytest.raises(ValueError):
        make_rule("aa", eps, delta, 10.0)


def test_samples_outside_unit_interval_are_refused():
    rule = make_rule("ebstop", 0.1, 0.1, 10.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rule.feed(1.5)
    with pytest.raises(ValueError):
        rule.feed_many(np.array([0.2, math.nan]))


def test_estimate_before_stopping_and_feeding_after_are_errors():
    rule = make_rule("bats", 0.25, 0.05, 10.0, n_tasks=1000)
    with pytest.raises(RuntimeError, match="not stopped"):
        rule.estimate()
    rule.feed_many(np.full(30, 0.5))
    with pytest.raises(RuntimeError, match="satisfied"):
        rule.feed(0.5)
    assert rule.feed_many(np.full(3, 0.5)) == 0


def test_unknown_rule_and_bats_without_bag_size():
    with pytest.raises(ValueError, match="unknown stopping rule"):
        make_rule("magic", 0.1, 0.1, 1.0)
    with pytest.raises(ValueError, match="bag size"):
        make_rule("bats", 0.1, 0.1, 1.0)


def test_a_looser_timeout_costs_aa_about_proportionally():
    saving = tighter_rmax_saving("aa", 0.1, 0.05, mean_ref_s=600, sd_ref_s=60, r_max_s=4800,
                                 tighter_r_max_s=1200, n_tasks=10**6)
    assert saving.samples_now / saving.samples_tighter == pytest.approx(4.0, rel=0.1)
    assert saving.saved > 0
    with pytest.raises(ValueError):
        tighter_rmax_saving("aa", 0.1, 0.05, 600, 60, 4800, 500, 10**6)


def test_expected_samples_grows_as_the_contract_tightens():
    for name in ("aa", "ebstop", "ebstop-geo"):
        loose = expected_samples(name, 0.2, 0.1, 0.5, 0.1, 10**6)
        tight = expected_samples(name, 0.1, 0.05, 0.5, 0.1, 10**6)
        assert tight > 1.5 * loose
