"""Remaining work and its upper confidence value, from what the controller has seen.

Notation (ALGORITHMS.md 2.3): n_p pending tasks, mean mu_hat and standard deviation
sigma_hat of finished runtimes in reference seconds, n_o observations, z the normal
quantile of the confidence level.

- Pending tasks without estimates are mean-sized. The mean (and sd) counts the running
  tasks without estimates as censored: each at its age plus its expected residual
  (``censored_moments``); finished tasks alone are the short ones. Pending tasks with the
  bag's estimates are corrected by the ratio r = sum(actual) / sum(estimate) over finished tasks that had one,
  but only upward (r >= 1): dispatch runs the largest estimates first, so the finished tasks
  are the over-estimated ones and their ratio runs low even when the estimates are right on
  average (30% error: r = 0.87 after 3 of 46 hours, the remaining work taken 14% short and
  the fleet shed). That bias only pushes r down, so an r above 1 is evidence the estimates
  are short; one below 1 is not, and the estimates are then taken as they are.
- A running task with elapsed reference work a has expected remaining work
  max(e - a, 0) when its estimate e is known, else the conditional mean residual from the
  normal approximation, floored at 5% of the mean (a task older than every observation
  still needs *some* time: conservative, never a division by zero).
- Upper confidence, tasks without estimates: W_up = W + z (n_p sigma_hat / sqrt(n_o) +
  sqrt(n_p) sigma_hat): the error of the estimated mean is shared by every pending task, and
  the tasks' own spread adds in quadrature. Tasks with estimates: their error is the
  estimates' relative error s_r (of actual/estimate; 15% until 10 have ended), shared through
  the correction ratio (s_r / sqrt(k + prior weight)) plus each task's own in quadrature
  (s_r / sqrt(n_k) of their total). A prior mean (from a sampling phase that met its (eps, delta) contract,
  or from the bag's estimation tools) counts as ``PRIOR_WEIGHT`` observations, so n_o never
  starts at one when something is already known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .snapshot import Snapshot

PRIOR_WEIGHT = 30


@dataclass(frozen=True, slots=True)
class RemainingWork:
    point_ref_s: float
    upper_ref_s: float
    mean_ref_s: float
    sd_ref_s: float
    pending: int
    running: int
    estimate_ratio: float
    # Of upper - point: z x the correction ratio's error over the tasks with estimates, which
    # the promise's forecast draws itself (``ratio_rel_se``), so the promise's band leaves it out.
    ratio_upper_ref_s: float = 0.0

    @property
    def band(self) -> float:
        """How well the remaining work is known: (upper - point) / point."""
        return (self.upper_ref_s - self.point_ref_s) / max(self.point_ref_s, 1e-9)


def mean_estimate(snap: Snapshot, observed_mean_ref_s: float | None = None) -> float | None:
    """The mean runtime: what tasks showed (``observed_mean_ref_s``, default the finished
    tasks' mean), shrunk toward the prior while few have finished."""
    obs = snap.observations
    seen = obs.mean_ref_s if observed_mean_ref_s is None else observed_mean_ref_s
    if obs.count >= 1 and snap.prior_mean_ref_s is None:
        return seen
    if obs.count >= 1 and snap.prior_mean_ref_s is not None:
        # Shrink the prior toward what finished tasks show, fully trusting data after ~30.
        w = min(obs.count / float(PRIOR_WEIGHT), 1.0)
        return w * seen + (1 - w) * snap.prior_mean_ref_s
    return snap.prior_mean_ref_s


def censored_moments(snap: Snapshot) -> tuple[float, float] | None:
    """Mean and standard deviation of runtimes from finished tasks *and* the running ones
    without estimates, each counted at its age plus its expected residual (None when no
    task has finished or none without an estimate runs).

    Finished tasks alone are a length-biased sample: at any moment the long tasks are the
    ones still running, so their mean runs low for the whole run (LM, 200 slots: 759 ref-s
    against a true 1,009 after half an hour, still 2.5% low after ten hours; the fleet shed
    38 machines in the first hour and bought them back at hour 8-13, 7-11% late). Counting
    a running task as E[X | X > age] (the normal model's, ``_residual_mean``) puts the long
    ones back; three fixed-point rounds, each with the moments of the last.
    """
    obs = snap.observations
    if obs.count < 2:
        return None
    ages: dict[str, float] = {}
    for node in snap.nodes:
        for r in node.running:
            if r.estimate_ref_s is None and not r.queued:  # a queued task has not started: no age
                a = max(0.0, snap.now_s - r.started_at_s) * node.speed
                ages[r.task_id] = max(a, ages.get(r.task_id, 0.0))  # a replica: the older copy
    if not ages:
        return None
    n = obs.count + len(ages)
    mu, sd = obs.sum_ref_s / obs.count, obs.sd_ref_s
    for _ in range(3):
        totals = [a + _residual_mean(mu, sd, a) for a in ages.values()]
        mu = (obs.sum_ref_s + sum(totals)) / n
        second = (obs.sumsq_ref_s + sum(t * t for t in totals)) / n
        sd = math.sqrt(max(second - mu * mu, 0.0) * n / max(n - 1, 1))
    return mu, sd


def remaining_work(snap: Snapshot, z: float = 1.645) -> RemainingWork | None:
    mu = mean_estimate(snap)
    if mu is None:
        return None
    obs = snap.observations
    censored = censored_moments(snap)
    if censored is not None:
        mu = mean_estimate(snap, observed_mean_ref_s=censored[0])
    if censored is not None and (obs.count >= 10 or snap.prior_sd_ref_s is None):
        sd = censored[1]
    elif obs.count >= 10 or (obs.count >= 2 and snap.prior_sd_ref_s is None):
        sd = obs.sd_ref_s
    elif snap.prior_sd_ref_s is not None:
        sd = snap.prior_sd_ref_s
    else:
        sd = mu * 0.5
    ratio = 1.0
    if obs.count_with_estimate >= 5 and obs.sum_estimate_ref_s > 0:
        ratio = obs.sum_ref_s / obs.sum_estimate_ref_s if obs.count == obs.count_with_estimate else 1.0
        ratio = max(ratio, 1.0)  # one-sided: see the module docstring
    pool = snap.pending
    pending_work = pool.unknown_count * mu + pool.known_total_ref_s * ratio
    running_work = 0.0
    n_running = 0
    for node in snap.nodes:
        for r in node.running:
            n_running += 1
            elapsed_ref = 0.0 if r.queued else max(0.0, snap.now_s - r.started_at_s) * node.speed
            running_work += residual_ref_s(r.estimate_ref_s, elapsed_ref, mu, sd, ratio)
    point = pending_work + running_work
    # Tasks without estimates: mean-sized, so the error of the mean is shared by all of them.
    n_u = pool.unknown_count
    n_o = max(obs.count + (PRIOR_WEIGHT if snap.prior_mean_ref_s is not None else 0), 1)
    unknown_err = n_u * sd / math.sqrt(n_o) + math.sqrt(n_u + n_running) * sd
    # Tasks with estimates: their error is the estimates' relative error (actual/estimate),
    # shared through the correction ratio, plus each task's own error in quadrature.
    known = pool.known_total_ref_s * ratio
    known_err = shared_err = 0.0
    if known > 0:
        r_sd = obs.ratio_sd()
        k = max(obs.count_with_estimate, 1)
        n_k = max(len(pool) - n_u, 1)
        shared_err = known * r_sd / math.sqrt(k + PRIOR_WEIGHT)
        known_err = shared_err + known * r_sd / math.sqrt(n_k)
    upper = point + z * (unknown_err + known_err)
    n_p = len(pool)
    return RemainingWork(point, upper, mu, sd, n_p, n_running, ratio, z * shared_err)


def residual_ref_s(estimate_ref_s: float | None, elapsed_ref_s: float, mu: float, sd: float, ratio: float) -> float:
    """The expected remaining work of a running task that has done ``elapsed_ref_s``: its
    estimate (corrected by ``ratio``) less that, floored at 5% of it, or without an estimate
    the conditional mean residual (module docstring)."""
    if estimate_ref_s is not None:
        return max(estimate_ref_s * ratio - elapsed_ref_s, 0.05 * estimate_ref_s * ratio)
    return _residual_mean(mu, sd, elapsed_ref_s)


_SQRT2, _SQRT_2PI = math.sqrt(2), math.sqrt(2 * math.pi)


def _residual_mean(mu: float, sd: float, elapsed: float) -> float:
    """E[X - a | X > a] for X ~ Normal(mu, sd) truncated at 0, floored at 5% of mu."""
    floor = 0.05 * mu
    if sd <= 0:
        return max(mu - elapsed, floor)
    alpha = (elapsed - mu) / sd
    tail = 0.5 * math.erfc(alpha / _SQRT2)
    if tail < 1e-12:
        return max(floor, sd / max(alpha, 1.0))
    pdf = math.exp(-0.5 * alpha * alpha) / _SQRT_2PI
    return max(mu + sd * pdf / tail - elapsed, floor)
