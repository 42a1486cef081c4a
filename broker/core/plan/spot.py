"""Work on spot offers: what an interruption costs, as the planner counts it (issue 21, part 2;
ALGORITHMS.md 10).

Notation, per spot offer i (``MachineType`` with ``market: spot``): lambda = its
``interruptions_per_hour`` / 3600 (per second, per running instance); b its boot delay (launch
to ready); s its slots, v its speed, r = s v its rate (reference seconds per second). A task
takes D = P / v wall seconds on one of its slots, P its reference runtime with mean mu and
standard deviation sd (the bag's ``Work``). D is modelled as a gamma variable with those two
moments (shape k = mu^2 / sd^2, scale theta = sd^2 / mu, in wall seconds; sd = 0: D = mu).

**The interruption model.** Interruptions of a running instance are a Poisson process of rate
lambda (AWS's Spot Instance Advisor buckets are monthly shares; the inventory turns them into a
rate). An interruption ends every task running on the instance; their work so far is lost (no
checkpoints) and they run again from the start; the lost slot waits a relaunch: a replacement
instance, ready b seconds after the interruption. Billing: spot is billed per second, so an
instance is charged for the time it ran (boot included), and a lineage (an instance and its
replacements) kept L seconds costs exactly price x L. On hourly billing AWS does not charge the
partial hour it interrupted (on average half a unit per interruption saved), while the
replacement's units run from its own launch, so its last one, released at its boundary before
the lineage's planned end, gives back up to a unit of the lineage's time: the plan counts the
planned units, which a lineage never exceeds (the replacement's paid units end by the
lineage's last boundary).

**One task on a slot** (restart without checkpoint, the classical "preemptive-repeat-identical"
completion time; e.g. Kulkarni, Nicola and Trivedi, "The completion time of a job on multimode
systems", Adv. Appl. Prob. 1987): an attempt of length D
survives with probability e^{-lambda D}; a failed attempt lasted E[X | X < D] with X the time
to the next interruption, then waits b. The number of failed attempts is geometric with mean
e^{lambda D} - 1, and summing the lost time (ALGORITHMS.md 10: (1 - e^{-lambda D}) / lambda -
D e^{-lambda D} a failed attempt, in expectation) gives the expected wall time to finish it

    E[C | D] = (e^{lambda D} - 1) (1 / lambda + b)                              (S1)

(-> D as lambda -> 0). Over the bag, with M(lambda) = E[e^{lambda D}] (the gamma variable's
moment generating function: M = (1 - lambda theta)^{-k}, finite for lambda theta < 1;
e^{lambda mu} for sd = 0),

    E[C] = (M(lambda) - 1) (1 / lambda + b).

**Efficiency.** A slot that runs tasks one after another does mu useful seconds per E[C] wall
seconds (renewal-reward), so the offer's *effective rate*, the capacity the planner counts, is

    eta = lambda mu / ((M(lambda) - 1) (1 + lambda b)),     r_eff = eta r            (S2)

To first order eta = 1 - lambda ((mu^2 + sd^2) / (2 mu) + b): per interruption a slot loses
the age of its running task (the length-biased half task, (mu^2 + sd^2) / (2 mu): half a task
for equal tasks, more for a spread bag) and a boot. A spot instance kept for L seconds (a
*lineage*: the instance and its replacements) is paid for L seconds and delivers
eta r (L - b - g) in expectation (g the packing allowance, ``capacity.py``); this is how
``Catalogue.build`` counts every spot offer and every running spot instance (the one hook:
``spot_rate_factor``), so ``min_cost``, ``min_makespan`` and the front plan mixed fleets
unchanged, the spot offers competing at USD per *effective* reference second. A task too long
for the offer (lambda theta >= 1: M infinite, the expected time to finish it on spot has no
bound) gives eta = 0: the offer cannot count on finishing it and is not used.

**The deficit, and the makespan's distribution.** Against its raw rate, a lineage loses
(1 - eta) r L in expectation; the loss comes in lumps, one per interruption, N ~ Poisson(lambda
n L) interruptions for n lineages. One interruption costs each of its s slots the age A of its
task plus b (A = U D* with D* the length-biased task, gamma(k + 1, theta), U uniform; its mean
is (mu^2 + sd^2) / (2 mu)); one A for all s slots, which start together after every boot (the
lump's largest spread), and the lumps are scaled so that their mean makes the expected
loss exactly (1 - eta) r / lambda per interruption (restarted tasks are younger than the
length-biased age; the scale carries that over from (S2)). The loss of the whole plan is the
sum over its spot lineages: a compound Poisson variable, drawn (``loss_draws``, a seeded
generator: the draws are a function of the plan) rather than approximated by a normal one,
which undercovers when a few interruptions are expected. The makespan of a draw is when the
plan's ramps at their raw rates have done the work plus the draw's loss (``spotplan.py``).

**Assumptions, and what they leave out.** Interruptions of different instances are
independent here; a whole type lost at once (correlated) is the fallback's worst case
(``spotplan.py``), not part of these draws. The dispatcher's "short tasks first on spot" makes
the tasks that run there shorter than the bag's mean, so (S2) at the bag's moments is
conservative; a task interrupted ``max_spot_attempts`` times moves to on-demand (a share
(1 - e^{-lambda D})^2 of tasks of length D, small for the short tasks spot is for), which the
model does not count. The expected spot price is the offer's ``price``; a budget counts spot at
its cap (``max_price``) where one is given (``at_price_cap``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from ..model import MachineType
from .types import Work

# Below this efficiency a spot offer is not worth planning on (its tasks almost never finish).
MIN_EFFICIENCY = 0.05


def rate_per_s(t: MachineType) -> float:
    """lambda of ``t``: interruptions per second per running instance (0 for on-demand)."""
    return max(0.0, t.interruptions_per_hour) / 3600.0 if t.is_spot else 0.0


def _gamma_shape_scale(mean_s: float, sd_s: float) -> tuple[float, float]:
    return mean_s * mean_s / (sd_s * sd_s), sd_s * sd_s / mean_s


def mgf_minus_one(lam: float, mean_s: float, sd_s: float) -> float:
    """M(lambda) - 1 = E[e^{lambda D}] - 1 for D gamma with ``mean_s`` and ``sd_s`` (+inf when
    lambda theta >= 1)."""
    if lam <= 0 or mean_s <= 0:
        return 0.0
    if sd_s <= 0:
        return math.expm1(lam * mean_s)
    k, theta = _gamma_shape_scale(mean_s, sd_s)
    if lam * theta >= 1.0:
        return math.inf
    return math.expm1(-k * math.log1p(-lam * theta))


def expected_task_time_s(lam: float, boot_s: float, mean_s: float, sd_s: float) -> float:
    """E[C]: expected wall time to finish a task on a slot interrupted at ``lam`` (S1)."""
    if lam <= 0:
        return mean_s
    return mgf_minus_one(lam, mean_s, sd_s) * (1.0 / lam + boot_s)


def efficiency(t: MachineType, work: Work) -> float:
    """eta (S2): the share of a spot instance's paid time that does useful work (1 for
    on-demand). 0 when the bag's tasks are too long for the offer (eta < ``MIN_EFFICIENCY``)."""
    lam = rate_per_s(t)
    if lam <= 0:
        return 1.0
    mean_s, sd_s = work.mean_ref_s / t.speed, work.sd_ref_s / t.speed
    if mean_s <= 0:
        eta = 1.0 / (1.0 + lam * t.boot_s)
    else:
        eta = mean_s / expected_task_time_s(lam, t.boot_s, mean_s, sd_s)
    return eta if eta >= MIN_EFFICIENCY else 0.0


def spot_rate_factor(t: MachineType, work: Work) -> float:
    """What ``Catalogue.build`` multiplies a type's raw rate by: eta for spot, 1 otherwise."""
    return efficiency(t, work) if t.is_spot else 1.0


def at_price_cap(types: Sequence[MachineType]) -> tuple[MachineType, ...]:
    """The types with every spot offer priced at its cap (``max_price``) where one is given:
    what a budget counts, so that a rising spot price cannot take it over."""
    return tuple(
        dataclasses.replace(t, price_per_hour=max(t.price_per_hour, t.max_price_per_hour))
        if t.is_spot and t.max_price_per_hour is not None else t
        for t in types
    )


def mean_age_s(mean_s: float, sd_s: float) -> float:
    """E[A]: the mean age of the task running at a random moment, (mu^2 + sd^2) / (2 mu)."""
    return (mean_s * mean_s + sd_s * sd_s) / (2.0 * mean_s) if mean_s > 0 else 0.0


def loss_per_interruption_ref_s(t: MachineType, work: Work) -> float:
    """Expected reference seconds one interruption of an instance of ``t`` costs against its raw
    rate: (1 - eta) r / lambda (the whole instance: every slot)."""
    lam = rate_per_s(t)
    if lam <= 0:
        return 0.0
    eta = efficiency(t, work)
    return (1.0 - eta) * t.capacity_per_s / lam


def loss_draws(exposures: Sequence[tuple[MachineType, float]], work: Work, draws: int,
               seed: int = 0) -> np.ndarray:
    """``draws`` samples of the total loss (reference seconds) of spot lineages: ``exposures``
    lists (type, instance-seconds exposed to interruptions). Compound Poisson: per type
    N ~ Poisson(lambda x exposure) interruptions, each a lump with the mean of
    :func:`loss_per_interruption_ref_s` and the spread of a task's age plus a boot."""
    rng = np.random.default_rng(seed)
    total = np.zeros(draws)
    for t, exposure_s in exposures:
        lam = rate_per_s(t)
        mean_lump = loss_per_interruption_ref_s(t, work)
        if lam <= 0 or exposure_s <= 0 or mean_lump <= 0:
            continue
        counts = rng.poisson(lam * exposure_s, size=draws)
        n = int(counts.sum())
        if n == 0:
            continue
        mean_s, sd_s = work.mean_ref_s / t.speed, work.sd_ref_s / t.speed
        if mean_s <= 0:
            shape = np.ones(n)
        else:
            # One age for all the instance's slots: they start together after every boot (equal
            # tasks stay in step), the upper end of the lump's spread.
            if sd_s > 0:
                k, theta = _gamma_shape_scale(mean_s, sd_s)
                biased = rng.gamma(k + 1.0, theta, size=n)
            else:
                biased = np.full(n, mean_s)
            shape = (rng.random(n) * biased + t.boot_s) / (mean_age_s(mean_s, sd_s) + t.boot_s)
        owner = np.repeat(np.arange(draws), counts)
        total += np.bincount(owner, weights=shape * mean_lump, minlength=draws)
    return total
