"""The capacity model shared by every planner in this package (ALGORITHMS.md 3.1).

Notation (seconds from the planning moment ``now``; work in reference seconds):

    q_i   planning quantum of type i: its billing unit beta_i when beta_i >= Q, else the
          smallest multiple of beta_i that is >= Q (Q = PlanOptions.per_second_quantum_s);
          a quantum costs c_i q_i / 3600 and the first one at least c_i m_i / 3600
    r     rate of a machine: slots x speed (reference seconds of work per wall second)
    g     packing allowance: min(phi, phi_tasks x long task / speed) + tail_task_fraction x mean task / speed
    b_i   boot delay of a new instance of type i

Every resource contributes work as a *ramp*: it works at rate r from ``start`` until ``end``,

    cap(T) = r * (min(T, end) - start)^+

    new instance of type i kept u quanta:   start = b_i + g_i,             end = u q_i
    existing instance e extended u quanta:  start = (ready_e - now)^+ + g_e, end = (paid_until_e - now) + u q_e
    private node v busy x_v of the horizon: start = g_v,                   end = g_v + x_v T

(the allowance g is the tail of a machine's life the plan does not count on; for a private
node it caps its share at x_v <= 1 - g_v / T; an instance's g follows its billing,
``instance_start_s``). A spot offer's rate r is its effective rate eta r (``spot.py``, S2):
the work its paid time does in expectation, interruptions counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..billing import Billing
from ..model import ExistingInstance, MachineType, PrivateNode
from .spot import spot_rate_factor
from .types import PlanOptions, Work

# Relative slack when comparing capacity with work (floating-point sums of ramps).
WORK_RTOL = 1e-9


def planning_quantum_s(billing: Billing, options: PlanOptions) -> float:
    """q_i: the billing unit, or a coarser multiple of it when the unit is finer than Q."""
    if billing.unit_s >= options.per_second_quantum_s:
        return billing.unit_s
    return billing.unit_s * math.ceil(options.per_second_quantum_s / billing.unit_s - 1e-9)


def allowance_s(speed: float, work: Work, options: PlanOptions) -> float:
    """g = min(phi, phi_tasks x long task / speed) + tail_task_fraction x (mean task / speed)
    (:meth:`PlanOptions.allowance_s`: phi scales down with short tasks)."""
    return options.allowance_s(speed, work.mean_ref_s, work.sd_ref_s)


def instance_start_s(t: MachineType, work: Work, options: PlanOptions) -> float:
    """An instance's ramp starts this long after it is ready: its allowance g (at the end of
    its life, taken at the start), which may depend on its billing unit
    (``PlanOptions.phi_fine_billed``)."""
    return options.allowance_s(t.speed, work.mean_ref_s, work.sd_ref_s, t.billing.unit_s)


@dataclass(frozen=True, slots=True)
class Ramp:
    """Work at ``rate_per_s`` from ``start_s`` until ``end_s`` (both from now)."""

    rate_per_s: float
    start_s: float
    end_s: float

    def capacity(self, horizon_s: float) -> float:
        return self.rate_per_s * max(0.0, min(horizon_s, self.end_s) - self.start_s)


def least_time_s(ramps: Iterable[Ramp], work_ref_s: float) -> float:
    """The least T with sum of cap(T) >= work (+inf if never): an exact piecewise-linear solve."""
    ramps = [r for r in ramps if r.rate_per_s > 0 and r.end_s > r.start_s]
    if work_ref_s <= 0:
        return 0.0
    target = work_ref_s * (1.0 - WORK_RTOL)
    points = sorted({r.start_s for r in ramps} | {r.end_s for r in ramps if math.isfinite(r.end_s)})
    done = 0.0  # capacity at the previous breakpoint
    previous = points[0] if points else 0.0
    for point in points + [math.inf]:
        slope = sum(r.rate_per_s for r in ramps if r.start_s <= previous < r.end_s)
        reach = done + slope * (point - previous) if slope > 0 else done
        if reach >= target:
            return previous + (target - done) / slope
        done, previous = reach, point
    return math.inf


@dataclass(frozen=True, slots=True)
class NewOffer:
    """New instances of one type: up to ``limit`` more, each a ramp from ``start_s`` to u q."""

    index: int  # position in the catalogue: the deterministic tie-break order
    type: MachineType
    rate_per_s: float
    start_s: float
    quantum_s: float
    limit: int  # L_i minus the existing instances of the type

    def cost_usd(self, quanta: int) -> float:
        return self.type.billing.cost_usd(quanta * self.quantum_s, self.type.price_per_hour)

    def paid_s(self, quanta: int) -> float:
        return self.type.billing.billed_s(quanta * self.quantum_s)

    @property
    def linear_cost(self) -> bool:
        """True when u quanta cost exactly u times one (the minimum fits in the first quantum)."""
        return self.type.billing.minimum_s <= self.quantum_s

    def saturation_quanta(self, work_ref_s: float) -> int:
        """u_sat: one instance kept this long does all the work; longer is never cheaper."""
        return max(1, math.ceil((work_ref_s / self.rate_per_s + self.start_s) / self.quantum_s - 1e-9))


@dataclass(frozen=True, slots=True)
class ExistingOffer:
    """An instance already paid until ``paid_s`` from now; more quanta cost ``quantum_usd`` each."""

    instance: ExistingInstance
    type: MachineType
    rate_per_s: float
    start_s: float
    paid_s: float
    quantum_s: float

    @property
    def quantum_usd(self) -> float:
        return self.type.price_per_hour * self.quantum_s / 3600.0

    def ramp(self, extra_quanta: int) -> Ramp:
        return Ramp(self.rate_per_s, self.start_s, self.paid_s + extra_quanta * self.quantum_s)

    def saturation_s(self, work_ref_s: float) -> float:
        need_s = work_ref_s / self.rate_per_s + self.start_s
        if need_s <= self.paid_s:
            return self.paid_s
        return self.paid_s + self.quantum_s * math.ceil((need_s - self.paid_s) / self.quantum_s - 1e-9)


@dataclass(frozen=True, slots=True)
class PrivateOffer:
    node: PrivateNode
    rate_per_s: float
    start_s: float  # its allowance g

    def cost_per_ref_s_usd(self) -> float:
        return self.node.cost_per_hour / 3600.0 / self.rate_per_s


@dataclass(frozen=True, slots=True)
class Catalogue:
    """Everything the plan can use, normalized to ramps. Built once per planning call."""

    new: tuple[NewOffer, ...]
    existing: tuple[ExistingOffer, ...]
    private: tuple[PrivateOffer, ...]
    types: tuple[MachineType, ...]

    @classmethod
    def build(
        cls,
        types: Sequence[MachineType],
        private: Sequence[PrivateNode],
        work: Work,
        existing: Sequence[ExistingInstance],
        now_s: float,
        options: PlanOptions,
    ) -> "Catalogue":
        by_name = {t.name: t for t in types}
        kept: dict[str, int] = {}
        olds = []
        for inst in existing:
            t = by_name.get(inst.type_name)
            if t is None:
                raise ValueError(
                    f"existing instance {inst.id} has type {inst.type_name!r}, which is not in the "
                    f"inventory (types: {', '.join(by_name) or 'none'})"
                )
            kept[t.name] = kept.get(t.name, 0) + 1
            ready_s = 0.0 if inst.ready_at_s is None else max(0.0, inst.ready_at_s - now_s)
            olds.append(
                ExistingOffer(
                    instance=inst,
                    type=t,
                    rate_per_s=t.capacity_per_s * spot_rate_factor(t, work),
                    start_s=ready_s + instance_start_s(t, work, options),
                    paid_s=max(0.0, inst.paid_until_s - now_s),
                    quantum_s=planning_quantum_s(t.billing, options),
                )
            )
        news = []
        for index, t in enumerate(types):
            room = t.limit - kept.get(t.name, 0)
            if room <= 0 or t.capacity_per_s * spot_rate_factor(t, work) <= 0:
                continue
            news.append(
                NewOffer(
                    index=index,
                    type=t,
                    rate_per_s=t.capacity_per_s * spot_rate_factor(t, work),
                    start_s=t.boot_s + instance_start_s(t, work, options),
                    quantum_s=planning_quantum_s(t.billing, options),
                    limit=room,
                )
            )
        privs = tuple(
            PrivateOffer(v, v.capacity_per_s, allowance_s(v.speed, work, options))
            for v in private
            if v.capacity_per_s > 0
        )
        return cls(tuple(news), tuple(o for o in olds if o.rate_per_s > 0), privs, tuple(types))

    def has_capacity(self) -> bool:
        return bool(self.new or self.existing or self.private)

    def unlimited_ramps(self) -> list[Ramp]:
        """Every resource used as long as it helps: all new instances, existing ones extended."""
        ramps = [Ramp(o.rate_per_s * o.limit, o.start_s, math.inf) for o in self.new]
        ramps += [Ramp(o.rate_per_s, o.start_s, math.inf) for o in self.existing]
        ramps += [Ramp(p.rate_per_s, p.start_s, math.inf) for p in self.private]
        return ramps

    def max_capacity_ref_s(self, horizon_s: float) -> float:
        return sum(r.capacity(horizon_s) for r in self.unlimited_ramps())

    def fastest_horizon_s(self, work_ref_s: float) -> float:
        """T_lower: the least deadline any plan can meet (+inf with nothing to run on)."""
        return least_time_s(self.unlimited_ramps(), work_ref_s)

    def saturation_horizon_s(self, work_ref_s: float) -> float:
        """A deadline beyond which no plan is cheaper: MinCost(T) = MinCost(T_sat) for T >= T_sat.

        An instance kept longer than it takes to do all the work alone costs at least as much
        as that instance kept just long enough, and so does a longer private share; so every
        optimal plan at any T >= T_sat uses ramps that end by T_sat.
        """
        ends = [o.saturation_quanta(work_ref_s) * o.quantum_s for o in self.new]
        ends += [o.saturation_s(work_ref_s) for o in self.existing]
        ends += [work_ref_s / p.rate_per_s + p.start_s for p in self.private]
        return max(ends, default=math.inf)
