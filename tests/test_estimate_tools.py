"""Estimation tools weighted by their breakpoint accuracy (thesis Eq. 6.1, 6.2) and the
sweep regression that joins them as one more tool."""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.estimate.regression import SweepRegression
from broker.core.estimate.tools import Breakpoint, combined_estimate, tool_weights


def _bag(rng, n=300):
    truth = {f"t{i}": float(v) for i, v in enumerate(rng.uniform(100, 1000, n))}
    good = {k: v * rng.normal(1, 0.05) for k, v in truth.items()}
    bad = {k: v * rng.normal(1, 0.5) for k, v in truth.items()}
    return truth, {"good": good, "bad": bad}


def test_equal_weights_before_any_breakpoint():
    _, tools = _bag(np.random.default_rng(0))
    assert tool_weights(tools, []) == {"good": 0.5, "bad": 0.5}


def test_the_accurate_tool_gets_the_weight_and_the_blend_beats_the_average():
    rng = np.random.default_rng(1)
    truth, tools = _bag(rng)
    seen = list(truth)[:60]
    points = [Breakpoint(k, f, f * truth[k]) for k in seen for f in (0.25, 0.5, 1.0)]
    weights = tool_weights(tools, points)
    assert weights["good"] > 0.8 and sum(weights.values()) == pytest.approx(1.0)
    rest = list(truth)[60:]
    err = {name: np.mean([abs(by[k] / truth[k] - 1) for k in rest]) for name, by in tools.items()}
    blended = np.mean([abs(combined_estimate(tools, weights, k) / truth[k] - 1) for k in rest])
    equal = np.mean([abs(combined_estimate(tools, {"good": .5, "bad": .5}, k) / truth[k] - 1) for k in rest])
    assert blended < 0.5 * equal and err["good"] < blended < err["bad"]


def test_a_perfect_prediction_is_floored_not_infinite():
    tools = {"exact": {"a": 100.0}, "off": {"a": 200.0}}
    weights = tool_weights(tools, [Breakpoint("a", 0.5, 50.0)])
    # 1/0.01 = 100 against 1/1 = 1
    assert weights["exact"] == pytest.approx(100 / 101)
    assert tool_weights(tools, [Breakpoint("a", 0.5, 0.0)]) == {"exact": 0.5, "off": 0.5}  # b* = 0 ignored


def test_a_task_missing_a_tool_renormalises_over_the_others():
    tools = {"x": {"a": 100.0, "b": 10.0}, "y": {"a": 300.0}}
    assert combined_estimate(tools, {"x": 0.25, "y": 0.75}, "a") == pytest.approx(250.0)
    assert combined_estimate(tools, {"x": 0.25, "y": 0.75}, "b") == pytest.approx(10.0)
    with pytest.raises(KeyError):
        combined_estimate(tools, {"x": 1.0, "y": 0.0}, "zzz")
    with pytest.raises(ValueError):
        tool_weights(tools, [Breakpoint("a", 1.5, 3.0)])


def test_linear_regression_recovers_the_sweep_relation():
    rng = np.random.default_rng(2)
    params = [{"n": int(n), "alpha": float(a), "name": "run"} for n, a in zip(rng.integers(1, 50, 80), rng.uniform(0, 1, 80))]
    runtimes = [30 + 4 * p["n"] + 100 * p["alpha"] + rng.normal(0, 2) for p in params]
    model = SweepRegression.fit(params, runtimes)
    assert model is not None and model.columns == ("alpha", "n")  # "name" is not numeric
    assert model.predict({"n": 20, "alpha": 0.5}) == pytest.approx(30 + 80 + 50, rel=0.02)


def test_log_regression_recovers_a_power_of_two_law_with_its_mean():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 6, 400)
    runtimes = 60 * 2**x * rng.lognormal(0, 0.3, x.size)  # multiplicative noise
    model = SweepRegression.fit([{"x": float(v)} for v in x], runtimes, log_runtime=True)
    # the mean of lognormal(0, 0.3) noise is exp(0.045): smearing puts it back
    assert model.predict({"x": 3.0}) == pytest.approx(60 * 8 * np.exp(0.045), rel=0.05)


def test_too_few_tasks_means_no_regression_tool_yet():
    assert SweepRegression.fit([{"x": 1}, {"x": 2}], [1.0, 2.0]) is None
    model = SweepRegression.fit([{"x": i} for i in range(5)], [1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="'x'"):
        model.predict({"y": 3})
