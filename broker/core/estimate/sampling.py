"""The sampling phase as pure logic: which task to run next, and in what order results
reach the stopping rule (ALGORITHMS.md 2.1, "Rules that make it correct in a live system").

* Tasks are drawn uniformly at random without replacement (a permutation of the bag taken
  from the caller's generator); sampled tasks are real tasks and never run twice.
* Draws run in parallel, so results come back in *completion* order, in which short tasks
  come first. The rule is fed strictly in *draw* order: a result that arrives before the
  results of earlier draws waits in a buffer. Feeding completion order would bias the mean
  low (the tests show it).
* The driver keeps up to ``slots`` draws in flight but never more outstanding draws
  (in flight or waiting in the buffer) than the rule's upper bound on what it can still
  use (:class:`~broker.core.estimate.contract.Need`).
* Results that arrive after the rule is satisfied are kept as ``extra``: the work is done,
  and the online estimator (:mod:`broker.core.estimate.survival`) can use them.
* A rule that still wants samples once every task of the bag ran (a small bag, a strict
  ``eps``) has nothing left to learn: the runtimes of the whole bag are known, so their
  mean is the bag's exactly (:func:`~broker.core.estimate.contract.census`). Sampling then
  ends with that exact estimate (:attr:`SamplingDriver.finished`), not an error.

Runtimes are recorded in wall seconds with the speed of the slot they ran on; the rule sees
``Z = min(runtime * speed, R_max) / R_max``.
"""

from __future__ import annotations

import numpy as np

from .contract import Estimate, StoppingRule, census


class BagExhausted(RuntimeError):
    """Kept for callers that catch it; :meth:`SamplingDriver.estimate` no longer raises it
    (a bag used up gives its exact mean)."""


class SamplingDriver:
    """Draw tasks at random, collect their runtimes, feed the rule in draw order."""

    def __init__(
        self, n_tasks: int, rule: StoppingRule, rng: np.random.Generator, r_max_s: float, slots: int = 1
    ):
        if n_tasks < 1:
            raise ValueError(f"the bag must hold at least one task, got {n_tasks}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if not r_max_s > 0:
            raise ValueError(f"R_max must be positive, got {r_max_s!r}")
        self.n_tasks = int(n_tasks)
        self.rule = rule
        self.r_max_s = float(r_max_s)
        self.slots = int(slots)
        self._order = rng.permutation(self.n_tasks)
        self._next_order = 0  # position in the permutation of the next draw
        self._fed = 0  # draws whose result was offered to the rule (a prefix of the draw order)
        self._used = 0  # of those, how many the rule took (a shorter prefix once it stopped)
        self._runtime_ref_s: dict[int, float] = {}  # completed draws: reference runtime
        self._in_flight: set[int] = set()

    # -- dispatch ---------------------------------------------------------------------------
    def next_draw(self) -> int | None:
        """Index of the next task to run, or None when no draw is needed right now.

        None means: the rule is satisfied, all ``slots`` are busy, enough draws are already
        outstanding for what the rule can still use, or the bag is exhausted (see
        :attr:`exhausted`).
        """
        if self.done or len(self._in_flight) >= self.slots or self._next_order >= self.n_tasks:
            return None
        at_most = self.rule.needed().at_most
        if at_most is not None and self.outstanding >= at_most:
            return None
        task = int(self._order[self._next_order])
        self._next_order += 1
        self._in_flight.add(task)
        return task

    def record(self, task_index: int, runtime_s: float, speed: float = 1.0) -> None:
        """The draw ``task_index`` finished after ``runtime_s`` wall seconds on a slot of
        ``speed``. Results may come in any order; each draw is recorded exactly once."""
        if task_index not in self._in_flight:
            if task_index in self._runtime_ref_s:
                raise ValueError(f"task {task_index} was already recorded")
            raise ValueError(f"task {task_index} was not drawn by this sampling phase")
        if not (runtime_s >= 0 and speed > 0):
            raise ValueError(f"runtime must be >= 0 and speed > 0, got {runtime_s!r} at speed {speed!r}")
        self._in_flight.discard(task_index)
        self._runtime_ref_s[task_index] = float(runtime_s) * float(speed)
        self._feed_in_draw_order()

    def _feed_in_draw_order(self) -> None:
        """Offer the longest run of completed draws that follows the fed prefix to the rule
        (in one call, for speed); whatever it does not take is extra."""
        run: list[int] = []
        for position in range(self._fed, self._next_order):
            task = int(self._order[position])
            if task not in self._runtime_ref_s:
                break  # an earlier draw is still running: later results wait
            run.append(task)
        if not run:
            return
        z = np.minimum([self._runtime_ref_s[t] for t in run], self.r_max_s) / self.r_max_s
        self._used += self.rule.feed_many(z)
        self._fed += len(run)

    # -- state ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The rule is satisfied."""
        return not self.rule.wants_more()

    @property
    def finished(self) -> bool:
        """Sampling is over: the rule is satisfied, or every task ran (the exact mean is known)."""
        return self.done or self.exhausted

    @property
    def exhausted(self) -> bool:
        """Every task has been drawn and completed, and the rule still wants more."""
        return not self.done and self._next_order >= self.n_tasks and not self._in_flight

    @property
    def outstanding(self) -> int:
        """Draws not yet consumed by the rule (running, or finished and waiting in order)."""
        return self._next_order - self._fed

    @property
    def drawn(self) -> frozenset[int]:
        return frozenset(int(i) for i in self._order[: self._next_order])

    @property
    def completed(self) -> frozenset[int]:
        return frozenset(self._runtime_ref_s)

    @property
    def in_flight(self) -> frozenset[int]:
        return frozenset(self._in_flight)

    @property
    def extra(self) -> dict[int, float]:
        """Completed draws the rule did not take because it had stopped: task index ->
        reference runtime (s). Empty while the rule still wants samples."""
        if not self.done:
            return {}
        used = {int(task) for task in self._order[: self._used]}
        return {task: ref_s for task, ref_s in self._runtime_ref_s.items() if task not in used}

    @property
    def runtimes_ref_s(self) -> dict[int, float]:
        """Every completed draw (used by the rule or extra): task index -> reference runtime."""
        return dict(self._runtime_ref_s)

    def estimate(self) -> Estimate:
        """The rule's estimate; when the bag ran out first, the exact mean of the whole bag
        (``Estimate.exact``). An error while sampling is not :attr:`finished`."""
        if self.exhausted:
            ref = np.array([self._runtime_ref_s[t] for t in range(self.n_tasks)])
            return census(self.rule, np.minimum(ref, self.r_max_s))
        return self.rule.estimate()
