"""What a run delivered next to what was planned (thesis Table 6.6 style), from its ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.core.control.ledger import Ledger


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class RunReport:
    run_id: str
    state: str  # finished | stopped | left (stopped with --on-stop leave: resumable)
    tasks_total: int
    tasks_done: int
    tasks_failed: int
    samples: int
    instances_launched: int
    makespan_s: float
    cost_usd: float
    cloud_cost_usd: float
    private_cost_usd: float
    planned_makespan_s: float | None
    planned_cost_usd: float | None
    cost_by_type_usd: dict[str, float]
    budget_stopped: bool
    time_scale: float
    stop_reason: str | None = None
    unterminated: tuple[str, ...] = ()  # instances EC2 never confirmed terminated: they may still bill
    nodes_lost: list[str] = field(default_factory=list)  # lost, bad or failed setup, and not back at the end
    private_nodes: list[str] = field(default_factory=list)  # the private nodes the run was given
    spot: dict[str, Any] | None = None  # the ledger's SpotCounts (None: no spot instance launched)

    def deviation_pct(self, delivered: float, planned: float | None) -> float | None:
        if planned is None or planned <= 0 or self.tasks_done + self.tasks_failed < self.tasks_total:
            return None  # tasks left: what was delivered is not the bag's makespan or cost
        return 100.0 * (delivered - planned) / planned

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": self.state,
            "tasks": {"total": self.tasks_total, "done": self.tasks_done, "failed": self.tasks_failed,
                      "left": self.tasks_total - self.tasks_done - self.tasks_failed},
            "samples": self.samples,
            "instances_launched": self.instances_launched,
            "makespan_s": round(self.makespan_s, 3),
            "cost_usd": round(self.cost_usd, 6),
            "cloud_cost_usd": round(self.cloud_cost_usd, 6),
            "private_cost_usd": round(self.private_cost_usd, 6),
            "planned": {"makespan_s": _round(self.planned_makespan_s, 3), "cost_usd": _round(self.planned_cost_usd, 6)},
            "deviation_pct": {
                "makespan": _round(self.deviation_pct(self.makespan_s, self.planned_makespan_s), 2),
                "cost": _round(self.deviation_pct(self.cost_usd, self.planned_cost_usd), 2),
            },
            "cost_by_type_usd": {k: round(v, 6) for k, v in sorted(self.cost_by_type_usd.items())},
            "budget_stopped": self.budget_stopped,
            "time_scale": self.time_scale,
            "stop_reason": self.stop_reason,
            "instances_not_terminated": list(self.unterminated),
            "nodes": {"private": list(self.private_nodes), "lost": list(self.nodes_lost),
                      "private_left": len([n for n in self.private_nodes if n not in self.nodes_lost])},
            "spot": self.spot,
        }


def build_report(ledger: Ledger, *, run_id: str, state: str, now_s: float, first_plan: tuple | None,
                 budget_stopped: bool, time_scale: float, stop_reason: str | None,
                 unterminated: tuple[str, ...] = ()) -> RunReport:
    by_type: dict[str, float] = {}
    for node in ledger.nodes.values():
        if node.type is not None:
            by_type[node.type.name] = by_type.get(node.type.name, 0.0) + node.cost_usd(now_s)
    cloud = sum(by_type.values())
    private = ledger.private_cost_usd()
    planned = first_plan or (None, None)
    return RunReport(
        run_id=run_id, state=state, tasks_total=ledger.tasks_total, tasks_done=len(ledger.done),
        tasks_failed=len(ledger.quarantined), samples=len(ledger.sample_keys),
        instances_launched=ledger.instances_launched, makespan_s=ledger.last_done_s, cost_usd=cloud + private,
        cloud_cost_usd=cloud, private_cost_usd=private, planned_makespan_s=planned[0], planned_cost_usd=planned[1],
        cost_by_type_usd=by_type, budget_stopped=budget_stopped, time_scale=time_scale, stop_reason=stop_reason,
        unterminated=unterminated,
        nodes_lost=[n.id for n in ledger.nodes.values() if n.lost],
        private_nodes=[n.id for n in ledger.nodes.values() if n.is_private],
        spot={**ledger.spot_counts.to_json(), "rates": ledger.spot_rates(now_s)} if any(n.type is not None and n.type.is_spot
                                                 for n in ledger.nodes.values()) else None,
    )
