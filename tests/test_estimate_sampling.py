"""The sampling driver: random draws without replacement, draw-order feeding whatever the
completion order, bounded draw-ahead, extra results kept."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from broker.core.estimate import Need, SamplingDriver, StoppingRule, make_rule
from broker.core.estimate.workloads import workload


class MeanOfFirst(StoppingRule):
    """Test double: the plain mean of the first n samples it is fed, but it does not tell
    the driver n (at_most None), so the driver fills every slot as for an adaptive rule."""

    name = "mean-of-first"
    guarantee = "none"

    def __init__(self, n: int, r_max_s: float):
        super().__init__(0.5, 0.5, r_max_s)
        self.n, self._sum = n, 0.0

    def wants_more(self) -> bool:
        return self.samples < self.n

    def needed(self) -> Need:
        return Need(self.n - self.samples, None)

    def _consume(self, zs):
        take = min(zs.size, self.n - self.samples)
        self._sum += float(zs[:take].sum())
        return take

    def _mean_z(self) -> float:
        return self._sum / self.samples


def simulate(driver: SamplingDriver, runtimes_s: np.ndarray) -> list[int]:
    """Run draws on the driver's slots in virtual time until it is done; completion order."""
    clock, running, finished = 0.0, [], []

    def fill():
        while (task := driver.next_draw()) is not None:
            heapq.heappush(running, (clock + runtimes_s[task], task))

    fill()
    while running and not driver.done:
        clock, task = heapq.heappop(running)
        driver.record(task, runtimes_s[task])
        finished.append(task)
        fill()
    return finished


def test_reading_completion_order_is_biased_low_and_draw_order_is_not():
    # 100 slots, the rule uses the first 40 results. Read in completion order, those are the
    # 40 shortest of ~100 running draws; read in draw order, a uniform random sample.
    w, reps, bag_size = workload("lognormal"), 200, 2000
    draw_err, completion_err = [], []
    for rep in range(reps):
        rng = np.random.default_rng([rep, 11])
        bag = w.sample_s(rng, bag_size)
        capped_mean = np.minimum(bag, w.timeout_s).mean()
        driver = SamplingDriver(bag_size, MeanOfFirst(40, w.timeout_s), rng, w.timeout_s, slots=100)
        finished = simulate(driver, bag)
        draw_err.append(driver.estimate().mean_ref_s / capped_mean - 1)
        completion_err.append(np.minimum(bag[finished[:40]], w.timeout_s).mean() / capped_mean - 1)
    se = np.std(draw_err) / math.sqrt(reps)
    assert abs(np.mean(draw_err)) < 3 * se, "draw-order reading must be unbiased"
    assert np.mean(completion_err) < -0.3, "completion-order reading should be far too low"
    assert np.mean(completion_err) < np.mean(draw_err) - 10 * se


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["aa", "ebstop", "bats"]), st.integers(1, 64), st.integers(0, 2**32 - 1))
def test_any_completion_order_gives_the_sequential_estimate(rule_name, slots, seed):
    # The estimate depends only on the draw order: equal to feeding the permutation directly.
    w, n = workload("long"), 6000
    bag = w.sample_s(np.random.default_rng(seed), n)
    driver = SamplingDriver(n, make_rule(rule_name, 0.3, 0.2, w.timeout_s, n), np.random.default_rng(seed + 1),
                            w.timeout_s, slots=slots)
    finished = simulate(driver, bag)
    reference = make_rule(rule_name, 0.3, 0.2, w.timeout_s, n)
    order = np.random.default_rng(seed + 1).permutation(n)
    reference.feed_many(np.minimum(bag[order], w.timeout_s) / w.timeout_s)
    assert driver.estimate().samples == reference.samples
    assert driver.estimate().mean_ref_s == pytest.approx(reference.estimate().mean_ref_s, rel=1e-9)
    assert len(set(finished)) == len(finished)  # no task ran twice
    assert driver.completed == set(finished) and driver.completed <= driver.drawn
    assert len(driver.extra) == len(finished) - reference.samples


def test_draw_ahead_respects_slots_and_what_the_rule_can_still_use():
    rng = np.random.default_rng(0)
    rule = make_rule("bats", 0.25, 0.05, 100.0, n_tasks=1000)  # exactly 30 samples
    driver = SamplingDriver(1000, rule, rng, 100.0, slots=8)
    first = [driver.next_draw() for _ in range(10)]
    assert first[8:] == [None, None] and len(set(first[:8])) == 8  # 8 slots
    driver.slots = 100
    more = []
    while (task := driver.next_draw()) is not None:
        more.append(task)
    assert len(first[:8]) + len(more) == 30  # never more than bats can use
    assert driver.outstanding == 30


def test_results_after_the_stop_are_kept_as_extra_with_reference_runtimes():
    rng = np.random.default_rng(1)
    driver = SamplingDriver(500, MeanOfFirst(3, 100.0), rng, 100.0, slots=5)
    tasks = [driver.next_draw() for _ in range(5)]
    for task in reversed(tasks):  # the last drawn finishes first
        driver.record(task, 10.0, speed=2.0)
    assert driver.done
    assert driver.extra == {tasks[3]: 20.0, tasks[4]: 20.0}
    assert driver.estimate().mean_ref_s == pytest.approx(20.0)
    assert driver.next_draw() is None


def test_a_result_waits_for_earlier_draws():
    driver = SamplingDriver(100, MeanOfFirst(2, 100.0), np.random.default_rng(2), 100.0, slots=3)
    a, b, c = (driver.next_draw() for _ in range(3))
    driver.record(c, 1.0)
    driver.record(b, 2.0)
    assert driver.rule.samples == 0  # a is still running
    driver.record(a, 3.0)
    assert driver.estimate().mean_ref_s == pytest.approx(2.5)  # a and b, not c
    assert driver.extra == {c: 1.0}


def test_misuse_is_refused():
    driver = SamplingDriver(10, MeanOfFirst(5, 100.0), np.random.default_rng(3), 100.0, slots=2)
    task = driver.next_draw()
    other = next(i for i in range(10) if i != task)
    with pytest.raises(ValueError, match="not drawn"):
        driver.record(other, 1.0)
    driver.record(task, 1.0)
    with pytest.raises(ValueError, match="already recorded"):
        driver.record(task, 1.0)


def test_a_bag_too_small_for_the_rule_gives_its_exact_mean():
    """Regression: the driver raised BagExhausted once every task ran, though their mean is then
    the bag's exactly (runtimes above R_max count as R_max, as for every rule)."""
    runtimes = np.linspace(10.0, 130.0, 20)
    driver = SamplingDriver(20, make_rule("aa", 0.1, 0.05, 100.0), np.random.default_rng(4), 100.0, slots=4)
    simulate(driver, runtimes)
    assert driver.exhausted and driver.finished and not driver.done and len(driver.completed) == 20
    estimate = driver.estimate()
    assert estimate.exact and estimate.samples == 20 and estimate.rule == "aa"
    assert estimate.mean_ref_s == pytest.approx(np.minimum(runtimes, 100.0).mean())
    assert estimate.capped == int((runtimes >= 100.0).sum())
