"""How well the promise knows the bag's estimates as a whole: the correction ratio's error.

A task with an estimate ``e`` runs ``e rho exp(N(0, s_r^2) - s_r^2 / 2)`` in the promise's
forecast (``broker.core.plan.promise``): ``s_r`` is each estimate's own error, ``rho`` the
correction ratio (sum of actual over sum of estimate), shared by every task, drawn per
replicate around the controller's value with a relative standard error ``c``. With 10,000
tasks the tasks' own errors cancel; ``c`` is what the cost interval of a bag with estimates
is made of before its tasks have run (LM, 10,000 tasks, estimates within 10%, first promise:
7.9 of its 11.2 points of cost width; the controller's hysteresis floor 2.0; the tasks' own
errors, billing rounding and the end of the bag 1.3).

Before any task with an estimate has ended (fewer than ``RATIO_MIN_TASKS``: the controller
takes ``rho = 1`` until then, ``estimates.remaining_work``) nothing but the bag's word says
how far its estimates are off as a whole:

- the user may declare it: ``estimate_bias = B`` (``--estimate-bias``) says the estimates'
  total lies within a share ``B`` of the truth at the promise's confidence, so
  ``c = B / z`` (``z`` the normal quantile of the central interval);
- undeclared, ``DEFAULT_ESTIMATE_BIAS`` (15%, the error the controller assumes of a single
  estimate until ten have ended, ``Observations.ratio_sd``): a tool is taken to be off as
  a whole by as much as one of its estimates. The former rule (``s_r / sqrt(k + 30)``, the
  prior counted as 30 checked tasks: 2.7%) promised a bag whose estimates were all 10% low
  a cost interval that held the delivered cost in 1 of 20 runs (``bench/promises.py``,
  ``LM-est10-low``).

Once ``k >= RATIO_MIN_TASKS`` tasks with estimates have ended, the controller's ratio is the
raw ratio of what they show, so its error is theirs: ``c = s_r / sqrt(k)`` (the declaration
no longer enters: the point it would have backed is not used).

Only the promise reads ``c`` from here: the controller's own forecasts (the deadline's hold,
the tail allowance, the give-backs a promise looks ahead) keep ``RuntimeLaw.ratio_rel_se``
as ``promising.runtime_law`` sets it, and the promise is read off the same runs forecast
again with ``c`` (``promises._after_give_backs``). So the bias declared, or assumed, changes
what the user is promised, not what the broker buys (read off the controller's forecast,
a 15% prior pulled the allowance in and bought capacity; the makespan then ended below the
interval in a third of the runs).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from .snapshot import Snapshot

DEFAULT_ESTIMATE_BIAS = 0.15  # undeclared: the estimates' total is off by up to this, at the confidence
RATIO_MIN_TASKS = 5  # the controller corrects by the ratio from this many ended tasks with estimates


def check_estimate_bias(value: float | None) -> None:
    """A declared bias is a share in [0, 1): ValueError otherwise."""
    if value is not None and not (0.0 <= value < 1.0 and math.isfinite(value)):
        raise ValueError(f"estimate_bias must be a share in [0, 1), got {value!r}")


def promise_ratio_se(snap: Snapshot, declared: float | None, confidence: float) -> float | None:
    """The correction ratio's relative standard error the promise draws (module docstring);
    None when no task left has an estimate (the ratio then multiplies nothing)."""
    pool = snap.pending
    if len(pool) == pool.unknown_count and not any(
            r.estimate_ref_s is not None for n in snap.nodes for r in n.running):
        return None
    obs = snap.observations
    k = obs.count_with_estimate
    if k >= RATIO_MIN_TASKS and obs.count == k:
        return obs.ratio_sd() / math.sqrt(k)
    return prior_ratio_se(declared, confidence)


def prior_ratio_se(declared: float | None, confidence: float) -> float:
    """Before tasks with estimates have run: the declared bias (or the default) as a
    relative standard error, ``B / z``."""
    bias = DEFAULT_ESTIMATE_BIAS if declared is None else declared
    return bias / NormalDist().inv_cdf(0.5 + confidence / 2)
