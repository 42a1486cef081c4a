"""The stopping rules by name, and what each is expected to cost before sampling starts.

Names: ``aa`` (published AA), ``aa-thesis`` (the thesis's simplified constants), ``bats``
(BaTS's fixed n; needs the bag size), ``ebstop`` (the relative stop on a betting confidence
sequence; without replacement when the bag size is given), ``ebstop-msa`` (the same stop on
the empirical-Bernstein bound of Mnih et al.) and ``ebstop-geo`` (that bound with their
geometric schedule). See :mod:`broker.core.estimate.ebstop`.

Expected sample counts, for ``Z = runtime / R_max`` with mean ``mu`` and standard deviation
``sigma`` (both as fractions of ``R_max``):

* ``aa``, ``aa-thesis``: SRA stops near ``Y1 / mu`` samples, with ``mu1 ~ mu``; then
  ``2 N2(mu)`` pair samples and ``N3(max(sigma^2, eps mu), mu)`` final ones, the phase sizes
  of :mod:`broker.core.estimate.aa` (``E[(Z - Z')^2 / 2] = sigma^2``). Roughly
  ``proportional to 1 / mu``: halving ``R_max`` when every runtime fits under it about
  halves the count.
* ``ebstop``: where the betting bounds meet the stopping test
  ``(1 - eps) U <= (1 + eps) L`` along the path of expected log-gains
  (:class:`broker.core.estimate.betting.TypicalBettingPath`); real runs stop up to about
  a fifth earlier (their noisy paths cross the level sooner), so this errs high.
* ``ebstop-msa``, ``ebstop-geo``: the first ``t`` with ``c_t(sigma, x_t) <= eps mu`` (the
  stopping test with ``L, U = mu -/+ c_t``).
* ``bats``: its fixed ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .aa import AARule, ThesisAARule
from .bats import BatsRule, bats_sample_size
from .contract import StoppingRule
from .ebstop import (
    DEFAULT_GEOMETRIC_BETA,
    DEFAULT_P,
    BettingStopRule,
    EBStopRule,
    bernstein_radius,
    betting_expected_samples,
    log_terms,
)

RULE_NAMES = ("aa", "aa-thesis", "bats", "ebstop", "ebstop-msa", "ebstop-geo")
# Past this many samples the expected count of ebstop is reported as unbounded (inf).
_EBSTOP_SEARCH_LIMIT = 1 << 20


def make_rule(name: str, eps: float, delta: float, r_max_s: float, n_tasks: int | None = None) -> StoppingRule:
    """A fresh rule called ``name``; ``n_tasks`` (the bag size) is required by ``bats``."""
    if name == "aa":
        return AARule(eps, delta, r_max_s)
    if name == "aa-thesis":
        return ThesisAARule(eps, delta, r_max_s)
    if name == "bats":
        if n_tasks is None:
            raise ValueError("rule 'bats' needs the bag size N to size its sample")
        return BatsRule(eps, delta, r_max_s, n_tasks)
    if name == "ebstop":
        return BettingStopRule(eps, delta, r_max_s, n_tasks=n_tasks)
    if name == "ebstop-msa":
        return EBStopRule(eps, delta, r_max_s)
    if name == "ebstop-geo":
        return EBStopRule(eps, delta, r_max_s, beta=DEFAULT_GEOMETRIC_BETA)
    raise ValueError(f"unknown stopping rule {name!r}; choose one of {', '.join(RULE_NAMES)}")


def expected_samples(rule: str, eps: float, delta: float, mu_guess: float, sigma_guess: float, n_tasks: int) -> float:
    """Expected number of samples ``rule`` will take (may exceed the bag; ``inf`` if huge).

    ``mu_guess`` and ``sigma_guess`` are the mean and standard deviation of
    ``Z = runtime / R_max``, i.e. fractions of the timeout, with ``0 < mu_guess <= 1``.
    """
    if not (0.0 < mu_guess <= 1.0):
        raise ValueError(f"mu_guess is a fraction of R_max in (0, 1], got {mu_guess!r}")
    if sigma_guess < 0.0:
        raise ValueError(f"sigma_guess must be >= 0, got {sigma_guess!r}")
    if rule in ("aa", "aa-thesis"):
        aa = AARule(eps, delta, 1.0) if rule == "aa" else ThesisAARule(eps, delta, 1.0)
        sra = math.ceil(aa.sra_threshold() / mu_guess)
        rho = max(sigma_guess**2, eps * mu_guess)
        return float(sra + 2 * aa.pair_count(mu_guess) + aa.final_count(rho, mu_guess))
    if rule == "bats":
        return float(bats_sample_size(n_tasks, eps, delta))
    if rule == "ebstop":
        return betting_expected_samples(eps, delta, mu_guess, sigma_guess, _EBSTOP_SEARCH_LIMIT)
    if rule in ("ebstop-msa", "ebstop-geo"):
        beta = 1.0 if rule == "ebstop-msa" else DEFAULT_GEOMETRIC_BETA
        return _ebstop_expected(eps, delta, mu_guess, sigma_guess, beta)
    raise ValueError(f"unknown stopping rule {rule!r}; choose one of {', '.join(RULE_NAMES)}")


def _ebstop_expected(eps: float, delta: float, mu: float, sigma: float, beta: float) -> float:
    t_max = 1 << 12
    while t_max <= _EBSTOP_SEARCH_LIMIT:
        x = log_terms(delta, DEFAULT_P, beta, t_max)[2 : t_max + 1]
        t = np.arange(2, t_max + 1, dtype=float)
        ok = np.flatnonzero(bernstein_radius(sigma, x, t) <= eps * mu)
        if ok.size:
            return float(t[ok[0]])
        t_max <<= 2
    return math.inf


@dataclass(frozen=True, slots=True)
class RmaxSaving:
    """Expected samples under the bag's ``R_max`` and under a tighter one."""

    samples_now: float
    samples_tighter: float

    @property
    def saved(self) -> float:
        return self.samples_now - self.samples_tighter


def tighter_rmax_saving(
    rule: str,
    eps: float,
    delta: float,
    mean_ref_s: float,
    sd_ref_s: float,
    r_max_s: float,
    tighter_r_max_s: float,
    n_tasks: int,
) -> RmaxSaving:
    """What sampling with ``tighter_r_max_s`` instead of ``r_max_s`` would save.

    Runtimes are guessed as ``mean_ref_s +/- sd_ref_s``; both timeouts must exceed the mean
    (a timeout below it would cap most samples and change what is estimated).
    """
    if not (mean_ref_s < tighter_r_max_s <= r_max_s):
        raise ValueError("need mean_ref_s < tighter_r_max_s <= r_max_s")
    now = expected_samples(rule, eps, delta, mean_ref_s / r_max_s, sd_ref_s / r_max_s, n_tasks)
    tighter = expected_samples(rule, eps, delta, mean_ref_s / tighter_r_max_s, sd_ref_s / tighter_r_max_s, n_tasks)
    return RmaxSaving(now, tighter)
