"""The contract every stopping rule keeps, and the estimate it hands back.

A stopping rule estimates the mean runtime of a bag from a random sample of its tasks.
It sees each sampled runtime as ``Z = min(P, R_max) / R_max`` in ``[0, 1]``, where ``R_max``
is the bag's timeout (ALGORITHMS.md 2.1): a sample that hit the timeout counts as ``Z = 1``
and is counted as *capped*, so what is estimated is the mean of the capped runtimes. Samples
arrive one at a time (or in runs, see :meth:`StoppingRule.feed_many`) in the order the tasks
were *drawn*; the rule says whether it wants more (:meth:`StoppingRule.wants_more`), gives
bounds on how many more it will take (:meth:`StoppingRule.needed`), and once satisfied
returns an :class:`Estimate`.

Rules are pure state machines over the samples they are fed: no clock, no I/O, no
randomness of their own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Estimate:
    """An estimate of the mean runtime of a bag, in reference seconds.

    ``samples`` counts every sample the rule consumed (all phases); ``capped`` those that
    hit ``R_max``. ``guarantee`` says in words what ``(eps, delta)`` promises for this rule;
    ``warnings`` carries conditions the caller should log (for example a sample that is a
    large share of the bag). ``exact``: every task of the bag was measured (the rule used up
    the bag before it could stop), so ``mean_ref_s`` is the bag's mean with no sampling error.
    """

    mean_ref_s: float
    samples: int
    eps: float
    delta: float
    rule: str
    capped: int
    guarantee: str
    warnings: tuple[str, ...] = ()
    exact: bool = False


def census(rule: "StoppingRule", capped_ref_s: np.ndarray) -> Estimate:
    """The estimate when ``rule`` used up the bag: ``capped_ref_s`` holds every task's runtime
    (capped at R_max), so their mean is the bag's mean exactly, whatever the rule still wanted.

    A rule that wants more samples than the bag holds is asking for more certainty about a
    finite population's mean than measuring all of it gives; measuring all of it gives the
    mean itself (the population is the bag). The rule's ``(eps, delta)`` contract is then met
    with error 0 and probability 1.
    """
    values = np.asarray(capped_ref_s, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError("a census needs the runtime of every task of the bag (at least one)")
    capped = int(np.count_nonzero(values >= rule.r_max_s))
    return Estimate(
        mean_ref_s=float(values.mean()),
        samples=int(values.size),
        eps=rule.eps,
        delta=rule.delta,
        rule=rule.name,
        capped=capped,
        guarantee=(f"exact: all {values.size} tasks of the bag ran before rule {rule.name!r} could stop, so this "
                   "is the bag's mean runtime (capped at R_max), with no sampling error"),
        exact=True,
    )


@dataclass(frozen=True, slots=True)
class Need:
    """How many more samples a rule will consume: at least ``at_least``; at most
    ``at_most`` (``None`` when the rule cannot bound it before it sees more data)."""

    at_least: int
    at_most: int | None


class StoppingRule(ABC):
    """Base of every stopping rule: validation, counting, and the feeding protocol.

    Subclasses implement :meth:`_consume` (take a prefix of a run of samples, return its
    length), :meth:`wants_more`, :meth:`needed`, :meth:`_mean_z` and :attr:`guarantee`.
    """

    name: str = ""

    def __init__(self, eps: float, delta: float, r_max_s: float):
        if not (0.0 < eps < 1.0):
            raise ValueError(f"eps (relative error) must lie strictly between 0 and 1, got {eps!r}")
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta (failure probability) must lie strictly between 0 and 1, got {delta!r}")
        if not (r_max_s > 0.0 and math.isfinite(r_max_s)):
            raise ValueError(f"R_max (the task timeout) must be a positive number of seconds, got {r_max_s!r}")
        self.eps = float(eps)
        self.delta = float(delta)
        self.r_max_s = float(r_max_s)
        self.samples = 0
        self.capped = 0

    # -- feeding --------------------------------------------------------------------------
    def feed(self, z: float) -> None:
        """Take one sample ``z`` in ``[0, 1]``; an error if the rule is already satisfied."""
        if not self.wants_more():
            raise RuntimeError(f"rule {self.name!r} is satisfied and takes no more samples")
        self.feed_many(np.array([z], dtype=float))

    def feed_many(self, zs: np.ndarray) -> int:
        """Take samples from the front of ``zs`` (in draw order) until satisfied.

        Returns how many were consumed (a prefix of ``zs``); the rest are not looked at.
        Feeding a run of samples is exactly the same as feeding them one by one.
        """
        zs = np.asarray(zs, dtype=float)
        if zs.ndim != 1:
            raise ValueError("samples must be a one-dimensional sequence")
        if zs.size and (np.isnan(zs).any() or zs.min() < 0.0 or zs.max() > 1.0):
            raise ValueError("every sample Z = runtime / R_max must lie in [0, 1]")
        if not self.wants_more() or zs.size == 0:
            return 0
        used = self._consume(zs)
        self.samples += used
        self.capped += int(np.count_nonzero(zs[:used] >= 1.0))
        return used

    # -- results --------------------------------------------------------------------------
    def estimate(self) -> Estimate:
        """The final estimate; an error while the rule still wants samples."""
        if self.wants_more():
            raise RuntimeError(f"rule {self.name!r} has not stopped yet ({self.samples} samples so far)")
        return Estimate(
            mean_ref_s=self._mean_z() * self.r_max_s,
            samples=self.samples,
            eps=self.eps,
            delta=self.delta,
            rule=self.name,
            capped=self.capped,
            guarantee=self.guarantee,
            warnings=self._warnings(),
        )

    def _warnings(self) -> tuple[str, ...]:
        return ()

    # -- for subclasses -------------------------------------------------------------------
    @property
    @abstractmethod
    def guarantee(self) -> str: ...

    @abstractmethod
    def wants_more(self) -> bool: ...

    @abstractmethod
    def needed(self) -> Need: ...

    @abstractmethod
    def _consume(self, zs: np.ndarray) -> int: ...

    @abstractmethod
    def _mean_z(self) -> float: ...
