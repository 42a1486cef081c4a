"""Per-task runtime estimates from several tools, weighted by how well each has predicted
so far (thesis 002 Ch. 6.4.1, Eq. 6.1 and 6.2; ALGORITHMS.md 2.4).

Tool ``t`` estimates task ``i`` at ``p_(i,t)`` reference seconds. A task reports progress
breakpoints (fraction ``f`` done after ``b*`` reference seconds; a finished task is the
breakpoint ``f = 1``); tool ``t`` predicted that breakpoint at ``b = f p_(i,t)``. At the
start of each interval ``h`` the weights are recomputed from every breakpoint seen so far:

    psi_t^h = sum_{b* > 0} b* / |b* - b|  /  sum_t' sum_{b* > 0} b* / |b* - b'|,
    psi_t^0 = 1 / tau                      (no breakpoint yet; tau tools),

where ``|b* - b| / b*``, the relative error, is floored at 1 % so a perfect prediction
weighs 100 times its breakpoint, not infinity. The combined estimate is

    p_i^h = sum_t psi_t^h p_(i,t),

renormalized over the tools that have an estimate for task ``i``. A tool without an
estimate for a breakpoint's task simply contributes nothing for it. The regression of
runtime on sweep parameters (:mod:`.regression`) enters as one more tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

DEFAULT_ERROR_FLOOR = 0.01

# tool name -> task id -> estimate in reference seconds
ToolEstimates = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """Task ``task_id`` reached fraction ``fraction`` (0 < f <= 1) after ``elapsed_ref_s``."""

    task_id: str
    fraction: float
    elapsed_ref_s: float


def tool_weights(
    estimates: ToolEstimates, breakpoints: Iterable[Breakpoint], error_floor: float = DEFAULT_ERROR_FLOOR
) -> dict[str, float]:
    """``psi_t`` for every tool in ``estimates`` (Eq. 6.1); equal weights before any data."""
    if not estimates:
        raise ValueError("no estimation tool given")
    if not error_floor > 0:
        raise ValueError(f"the relative-error floor must be positive, got {error_floor!r}")
    score = {tool: 0.0 for tool in estimates}
    for point in breakpoints:
        if not (0.0 < point.fraction <= 1.0):
            raise ValueError(f"breakpoint fraction must lie in (0, 1], got {point.fraction!r}")
        actual = point.elapsed_ref_s
        if actual <= 0:
            continue  # b* = 0 carries no information (Eq. 6.1 sums over b* > 0)
        for tool, by_task in estimates.items():
            if point.task_id in by_task:
                predicted = point.fraction * by_task[point.task_id]
                relative_error = max(abs(actual - predicted) / actual, error_floor)
                score[tool] += 1.0 / relative_error
    total = sum(score.values())
    if total == 0.0:
        return {tool: 1.0 / len(estimates) for tool in estimates}
    return {tool: s / total for tool, s in score.items()}


def combined_estimate(estimates: ToolEstimates, weights: Mapping[str, float], task_id: str) -> float:
    """``p_i = sum_t psi_t p_(i,t)`` over the tools that estimate ``task_id`` (Eq. 6.2)."""
    present = [(weights[tool], by_task[task_id]) for tool, by_task in estimates.items() if task_id in by_task]
    if not present:
        raise KeyError(f"no tool has an estimate for task {task_id!r}")
    weight_sum = sum(w for w, _ in present)
    if weight_sum == 0.0:  # every tool present has weight 0: fall back to their plain mean
        return sum(p for _, p in present) / len(present)
    return sum(w * p for w, p in present) / weight_sum
