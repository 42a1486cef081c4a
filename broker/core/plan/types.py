"""What the planner takes in and what it hands back.

Units live in names: ``*_s`` seconds, ``*_usd`` dollars. Work is in reference seconds (seconds
of a task on one slot of speed 1). Times inside a :class:`Plan` are measured from the planning
moment ``now`` (makespan, ``release_after_s`` of new instances) except ``Extension.release_at_s``,
which is on the same clock as the existing instances' ``paid_until_s``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Mapping

from ..units import format_duration

# Plan.status values.
OPTIMAL = "optimal"  # the solver proved optimality (within PlanOptions.gap_rel)
TIME_LIMIT = "time_limit"  # the solver stopped at its time limit with a feasible plan
HEURISTIC = "heuristic"  # no solver answer in time: a greedy plan


@dataclass(frozen=True, slots=True)
class Work:
    """Remaining work of a bag.

    ``total_ref_s`` is the amount the plan must cover; callers that have an upper confidence
    value of the remaining work pass that, not the point estimate. ``mean_ref_s`` and
    ``sd_ref_s`` describe one task and size the packing allowance.
    """

    total_ref_s: float
    tasks: int
    mean_ref_s: float
    sd_ref_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("total_ref_s", "mean_ref_s", "sd_ref_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Work.{name} must be a finite number >= 0, got {value!r}")
        if self.tasks < 0:
            raise ValueError(f"Work.tasks must be >= 0, got {self.tasks!r}")


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Knobs of the planner (ALGORITHMS.md 3.1-3.3).

    Packing allowance of a machine whose slots run at ``speed`` (:meth:`allowance_s`):
    ``g = min(phi_s, phi_tasks * (mean_ref_s + 2 sd_ref_s) / speed) + tail_task_fraction *
    mean_ref_s / speed`` seconds at the end of its life that the plan does not count on
    (task indivisibility, dispatch and estimation slack).
    """

    phi_s: float = 300.0
    # The gap factor phi scales with the tasks: the thesis's 5 minutes were set for tasks of
    # tens of minutes (LM: 17 min mean), where it is a fraction of one task. On a bag of 1 s
    # tasks a fixed 5 minutes is 300 tasks of slack per slot: `broker plan --tasks 10
    # --mean-runtime 1s` planned 5m04s, and a 2-minute deadline a private node met in
    # 1m52s was called infeasible. What phi guards against is a machine's last tasks not
    # fitting (indivisibility beyond the half task below, a long task drawn late, the
    # dispatch gaps between tasks), which is a few long tasks' worth, not a fixed time: so
    # phi is capped at phi_tasks long tasks (mean + 2 sd) on that machine.
    phi_tasks: float = 4.0
    tail_task_fraction: float = 0.5
    per_second_quantum_s: float = 300.0  # planning grid for billing units shorter than this
    # Whether the gap factor phi is kept for types billed finer than per_second_quantum_s. A
    # budget plan drops it there (``FleetPlanner.for_budget``): phi is priced as paid time,
    # five minutes of every instance, where a plan that runs short is corrected at the next
    # re-plan for the seconds it needs, not a whole hour (thesis LM20 billed per second, 2,000
    # tasks, at the cost of List on the efficient machines, $18.94: delivered in 5.42 h with
    # phi paid, 1.87 h without; List took 1.13 h).
    phi_fine_billed: bool = True
    time_limit_s: float = 2.0
    # Relative optimality gap. 0: the cheapest plan, proven (HiGHS in process proves it in a
    # few ms on the thesis catalogue, 75 ms at worst near the fastest makespan; CBC took
    # seconds, so it used to run at 1e-3, plans within 0.1% of the cheapest).
    gap_rel: float = 0.0
    # Absolute optimality gap (USD): below the tie-break, so that equal-cost plans are told
    # apart by it whatever solver ran (mincost's docstring).
    gap_abs_usd: float = 1e-9
    # "auto" (HiGHS in process, CBC without highspy), "highs" or "cbc": see plan/solver.py.
    solver: str = "auto"
    # Per new instance-quantum; see mincost's docstring. Large enough for CBC to resolve (at
    # 1e-7 it returned plans 2e-8 above its optimum in the tie-broken objective, where HiGHS
    # did not), small against any quantum's price.
    tie_break_usd: float = 1e-6
    bisect_tol_s: float = 10.0  # min_makespan stops bisecting when the bracket is this narrow

    def allowance_s(self, speed: float, mean_ref_s: float, sd_ref_s: float = 0.0, unit_s: float | None = None) -> float:
        """g: the end of a machine's life (slots at ``speed``) the plan does not count on:
        ``min(phi_s, phi_tasks x a long task) + tail_task_fraction x a mean task``, a long task
        being ``mean + 2 sd`` (all on that machine, in seconds). ``unit_s``: the machine's
        billing unit (None: a private node), for ``phi_fine_billed``."""
        long_task_s = (mean_ref_s + 2.0 * sd_ref_s) / speed
        phi = self.phi_s
        if not self.phi_fine_billed and unit_s is not None and unit_s < self.per_second_quantum_s:
            phi = 0.0
        return min(phi, self.phi_tasks * long_task_s) + self.tail_task_fraction * mean_ref_s / speed


@dataclass(frozen=True, slots=True)
class NewGroup:
    """``count`` new instances of ``type_name``, launched now and kept ``quanta`` planning quanta.

    ``release_after_s`` is seconds after launch at which their last paid quantum ends (paid-until).
    """

    type_name: str
    count: int
    quanta: int
    release_after_s: float


@dataclass(frozen=True, slots=True)
class Extension:
    """What to do with an existing instance: buy ``extra_quanta`` more and release at ``release_at_s``.

    ``extra_quanta == 0`` means: do not extend, release when what is paid runs out.
    """

    instance_id: str
    extra_quanta: int
    release_at_s: float


@dataclass(frozen=True)
class Plan:
    """A fleet decision: what to launch, what to keep, and what it achieves.

    ``makespan_s``: planned time from now until the work is done.
    ``cost_usd``: money this plan commits from now on (new instances, extensions of existing
    ones, private nodes' hourly cost); money already committed is not in it.
    ``fleet``: instances used per type, new and existing.
    ``capacity``: work each type or private node can do within the plan, in the units of the
    plan's work (reference seconds; tasks for the BaTS policy).
    ``horizon_s``: the deadline the plan was solved for (``makespan_s <= horizon_s``).
    """

    makespan_s: float
    cost_usd: float
    fleet: Mapping[str, int]
    new: tuple[NewGroup, ...] = ()
    existing: tuple[Extension, ...] = ()
    private_share: Mapping[str, float] = field(default_factory=dict)
    status: str = OPTIMAL
    solve_ms: float = 0.0
    capacity: Mapping[str, float] = field(default_factory=dict)
    horizon_s: float = 0.0

    def row(self) -> dict[str, object]:
        """The plan as ``--json`` prints it."""
        return {
            "makespan_s": round(self.makespan_s, 3),
            "cost_usd": round(self.cost_usd, 6),
            "fleet": {name: count for name, count in self.fleet.items() if count > 0},
        }

    def summary(self) -> str:
        """``3h12m for $4.20`` style, for messages."""
        return f"{format_duration(self.makespan_s)} for ${self.cost_usd:.2f}"


class NoFeasiblePlan(Exception):
    """The goal cannot be met. ``cheapest`` and ``fastest`` say what could be done instead."""

    def __init__(self, message: str | Callable[[], str], *, cheapest: Plan | Callable[[], Plan] | None = None,
                 fastest: Plan | None = None):
        # ``message`` and ``cheapest`` may be given as functions, computed when first read:
        # the cheapest plan is a whole search, which a controller that only wants ``fastest``
        # (every re-plan past a deadline) should not pay for.
        super().__init__(message if isinstance(message, str) else "")
        self._message = message
        self._cheapest = cheapest
        self.fastest = fastest

    @property
    def cheapest(self) -> Plan | None:
        if callable(self._cheapest):
            self._cheapest = self._cheapest()
        return self._cheapest

    def __str__(self) -> str:
        if callable(self._message):
            self._message = self._message()
            self.args = (self._message,)
        return self._message
