"""What a plan on spot means for the people and the parts that read it (issue 21, parts 2 and
5): ``spot_summary`` (the plan table's spot lines, ``--json``'s ``spot``), the expected savings
against the on-demand-only plan, the fallback or a budget's reserve, the worst case, and how
far interruptions spread the makespan and cost; ``forecast_types`` and ``widened`` for a
forecast that models no interruption. The planning itself is in ``spotplan.py``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from ..model import ExistingInstance, MachineType, PrivateNode
from ..units import format_duration
from .capacity import Catalogue
from .mincost import assemble, choice_of, min_cost
from .spot import at_price_cap, efficiency
from .spotplan import SpotRisk, Trigger, budget_reserve, fallback_triggers, on_demand_only, plan_risk, uses_spot
from .types import NoFeasiblePlan, Plan, PlanOptions, Work


@dataclass(frozen=True)
class SpotSummary:
    """A mixed plan's figures (module docstring). Costs from now, at the expected spot prices
    unless said; ``worst_case_usd`` at the caps for a budget."""

    confidence: float
    expected_cost_usd: float
    on_demand_cost_usd: float | None  # the on-demand-only plan (None: none meets the goal)
    on_demand_makespan_s: float | None
    fallback_usd: float  # the dearest whole-type loss beyond the plan (inf: not recoverable)
    worst_case_usd: float
    risk: SpotRisk
    triggers: tuple[Trigger, ...]
    spot_instances: int
    budget_usd: float | None = None  # a budget goal's: fallback_usd is then its reserve

    @property
    def savings_usd(self) -> float | None:
        return None if self.on_demand_cost_usd is None else self.on_demand_cost_usd - self.expected_cost_usd

    @property
    def savings_share(self) -> float | None:
        if self.on_demand_cost_usd is None or self.on_demand_cost_usd <= 0:
            return None
        return self.savings_usd / self.on_demand_cost_usd

    def to_json(self) -> dict[str, object]:
        def num(x, digits=4):
            return None if x is None or not math.isfinite(x) else round(float(x), digits)

        r = self.risk
        return {
            "confidence": self.confidence, "spot_instances": self.spot_instances,
            "expected_cost_usd": num(self.expected_cost_usd),
            "on_demand_cost_usd": num(self.on_demand_cost_usd), "on_demand_makespan_s": num(self.on_demand_makespan_s, 1),
            "savings_usd": num(self.savings_usd), "savings_share": num(self.savings_share),
            "fallback_usd": num(self.fallback_usd), "worst_case_usd": num(self.worst_case_usd),
            "interruptions": num(r.interruptions, 2),
            "makespan_s": num(r.makespan_s, 1), "makespan_s_range": [num(r.makespan_s_range[0], 1),
                                                                     num(r.makespan_s_range[1], 1)],
            "cost_usd_range": [num(r.cost_usd_range[0]), num(r.cost_usd_range[1])],
            "triggers": [t.to_json() for t in self.triggers], "budget_usd": self.budget_usd,
        }

    def lines(self) -> list[str]:
        """What ``broker plan`` prints under its table."""
        r, pct = self.risk, f"{100 * self.confidence:g}%"
        head = (f"spot: {self.spot_instances} spot instances, ~{r.interruptions:.1f} interruptions expected; "
                f"expected cost ${self.expected_cost_usd:,.2f}")
        if self.on_demand_cost_usd is not None:
            head += (f", {100 * (self.savings_share or 0.0):.0f}% (${self.savings_usd:,.2f}) below on-demand only "
                     f"(${self.on_demand_cost_usd:,.2f}, {format_duration(self.on_demand_makespan_s or 0.0)})")
        else:
            head += ("; no on-demand-only plan meets the deadline" if self.triggers
                     else "; no on-demand-only plan is as fast")
        unit, div = ("h", 3600.0) if r.makespan_s >= 2 * 3600 else ("min", 60.0)  # as Promise.text
        lo, hi = (r.makespan_s - r.makespan_s_range[0]) / div, (r.makespan_s_range[1] - r.makespan_s) / div
        out = [head, f"  interruptions spread the makespan by -{lo:.1f}/+{hi:.1f} {unit} and the cost by "
                     f"-${max(0.0, r.cost_usd - r.cost_usd_range[0]):,.2f}/"
                     f"+${max(0.0, r.cost_usd_range[1] - r.cost_usd):,.2f} ({pct}; "
                     "in the promise's interval)"]
        for t in self.triggers:
            if not t.feasible:
                out.append(f"  fallback: nothing on demand can finish in time if {t.lost} is lost at "
                           f"{format_duration(t.by_s)}")
            elif t.launch:
                what = ", ".join(f"{n} x {name}" for name, n in t.launch.items())
                out.append(f"  fallback: if {t.lost} is lost at {format_duration(t.by_s)}, launch {what} "
                           f"(+${t.extra_usd:,.2f})")
        if self.budget_usd is not None:
            out.append(f"  reserve ${self.fallback_usd:,.2f} for a whole spot type lost and for running on; "
                       f"worst case ${self.worst_case_usd:,.2f} (spot at its price cap) within the budget of "
                       f"${self.budget_usd:,.2f}")
        elif not self.triggers and math.isfinite(self.fallback_usd):
            out.append(f"  a whole spot type lost, and running on, cost up to ${self.fallback_usd:,.2f} more: worst case "
                       f"${self.worst_case_usd:,.2f}")
        elif math.isfinite(self.worst_case_usd):
            out.append(f"  worst case (a whole spot type lost, spot at its price cap): ${self.worst_case_usd:,.2f}")
        return out


def spot_summary(plan: Plan, types: Sequence[MachineType], private: Sequence[PrivateNode], work: Work, goal, *,
                 existing: Sequence[ExistingInstance] = (), now_s: float = 0.0,
                 options: PlanOptions = PlanOptions(), confidence: float = 0.9) -> SpotSummary | None:
    """The figures of ``plan`` (None when it rents no spot instance). ``goal`` is a
    :class:`broker.core.goal.Goal` or None; a budget's plan is priced at the caps."""
    kind = getattr(goal, "kind", None)
    kind = getattr(kind, "value", kind)
    budget = kind == "budget"
    priced = at_price_cap(types) if budget else tuple(types)
    if not uses_spot(plan, priced):
        return None
    expected_cat = Catalogue.build(types, private, work, existing, now_s, options)
    choice = choice_of(expected_cat, plan)
    choice.busy_s = {n: s * plan.horizon_s for n, s in plan.private_share.items()}
    expected_plan = assemble(expected_cat, work, plan.horizon_s, choice, plan.status, plan.solve_ms)
    risk = plan_risk(expected_plan, expected_cat, work, confidence=confidence)
    deadline = float(goal.value) if kind == "deadline" else max(plan.horizon_s, risk.makespan_hold_s)
    od_at = deadline if kind == "deadline" else plan.makespan_s
    try:
        od = min_cost(on_demand_only(types), private, work, od_at, existing=existing, now_s=now_s, options=options)
    except NoFeasiblePlan:
        od = None
    priced_cat = Catalogue.build(priced, private, work, existing, now_s, options)
    if kind != "deadline":  # no deadline to recover by: what recovering costs
        triggers: list[Trigger] = []
        fallback = budget_reserve(plan, priced, work, catalogue=priced_cat, options=options, confidence=confidence)
        worst = plan.cost_usd + fallback
    else:
        triggers = fallback_triggers(plan, priced, private, work, deadline, catalogue=priced_cat, existing=existing,
                                     now_s=now_s, options=options)
        fallback = max((t.extra_usd for t in triggers), default=0.0)
        worst = risk.cost_hold_usd + fallback
    spot_names = {t.name for t in types if t.is_spot}
    return SpotSummary(confidence, risk.cost_usd, None if od is None else od.cost_usd,
                       None if od is None else od.makespan_s, fallback, worst, risk, tuple(triggers),
                       sum(n for name, n in plan.fleet.items() if name in spot_names),
                       float(goal.value) if budget else None)


def forecast_types(types: Sequence[MachineType], work: Work) -> tuple[MachineType, ...]:
    """The types as a forecast that knows nothing of interruptions should see them: a spot
    offer's slots at its effective speed eta v (for ``promise.machines_of_plan``; never plan
    with these, ``Catalogue.build`` would count eta twice)."""
    return tuple(dataclasses.replace(t, speed=t.speed * max(efficiency(t, work), 1e-9)) if t.is_spot else t
                 for t in types)


def widened(point: float, interval: tuple[float, float] | None, risk_mid: float,
            risk_interval: tuple[float, float]) -> tuple[float, float] | None:
    """An interval around ``point`` whose half-widths combine a forecast's (the work's
    uncertainty) with the interruptions' (independent: root of the summed squares)."""
    if interval is None:
        return None
    lo, hi = interval
    return (point - math.hypot(point - lo, risk_mid - risk_interval[0]),
            point + math.hypot(hi - point, risk_interval[1] - risk_mid))
