"""A deadline held at a confidence: the cheapest plan whose makespan's quantile meets it
(ALGORITHMS.md 8; the forecasts come from ``promise.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .promise import Forecast


@dataclass(frozen=True, slots=True)
class HeldDeadline:
    """The plan that holds a deadline at the confidence (or the best found), its forecast,
    the horizon it was solved for, and whether the deadline is held."""

    plan: object
    forecast: Forecast
    horizon_s: float
    held: bool
    rounds: int


def hold_deadline(
    solve: Callable[[float], object | None],
    predict: Callable[[object], Forecast],
    deadline_s: float,
    confidence: float,
    *,
    elapsed_s: float = 0.0,
    first_horizon_s: float | None = None,
    max_rounds: int = 5,
) -> HeldDeadline | None:
    """The cheapest plan whose makespan's ``confidence`` quantile is within the deadline.

    ``solve(h)``: the min-cost plan for horizon ``h`` seconds from now (None when none
    exists); ``predict(plan)``: its forecast (makespans from the run's start, ``elapsed_s``
    ago). The planner covers an amount of work by ``h``; what decides the end is the tail,
    so ``h`` starts at the deadline and is pulled in by the forecast's overshoot
    ``q_conf(M) - T`` (plus 2% of the horizon, so the search does not creep) until the
    quantile fits: more capacity is bought only as far as the risk asks. When no horizon
    holds it, the plan with the smallest quantile is returned with ``held`` False: the
    caller says so and offers what can be promised."""
    h = deadline_s - elapsed_s if first_horizon_s is None else first_horizon_s
    best: HeldDeadline | None = None
    for rounds in range(1, max_rounds + 1):
        if h <= 0:
            break
        plan = solve(h)
        if plan is None:
            break
        f = predict(plan)
        q = f.makespan_quantile(confidence)
        held = q <= deadline_s
        found = HeldDeadline(plan, f, h, held, rounds)
        if held:
            return found
        if best is None or q < best.forecast.makespan_quantile(confidence):
            best = found
        h -= (q - deadline_s) + 0.02 * h
    return best
