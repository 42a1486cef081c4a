"""The adopted plan's figures are what the run buys (the plan line, the launch question,
status, the report and the metrics all show them)."""

from __future__ import annotations

import pytest

from broker.core.billing import Billing
from broker.core.control.actions import Launch
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Memory, Observations, Snapshot
from broker.core.model import MachineType

MARGIN = ControllerConfig().margin_s


def test_the_plan_costs_what_it_launches_when_launches_are_trimmed_to_the_pending_tasks():
    """Regression: the plan line said `cost $9.68`, then the launch question asked for 13
    instances (~$1.47): the plan's figures priced the instances the controller trims away
    (never more new slots than pending tasks)."""
    slow = MachineType("slow", 1, 1.0, 0.10, 40, 0.0, Billing.hourly())
    pool = TaskPool()
    pool.extend((f"t{k}", 36_000.0) for k in range(3))  # three 10 h tasks, a 2 h deadline
    obs = Observations()
    for k in range(60):
        obs = obs.add(400.0 + 400.0 * (k % 3), None)
    snap = Snapshot(now_s=0.0, types={"slow": slow}, nodes=(), pending=pool, tasks_total=100, tasks_done=60,
                    observations=obs, committed_usd=0.0)
    d = Controller(Goal("deadline", 2 * 3600.0)).decide(snap, Memory(), 0.0, None, tick=True)
    launches = [a for a in d.actions if isinstance(a, Launch)]
    bought = sum(a.count * slow.billing.cost_usd(a.release_after_s + MARGIN, slow.price_per_hour) for a in launches)
    assert sum(a.count for a in launches) == 3
    assert d.memory.last_plan.cost_usd > bought + 1.0  # the solver priced all 40
    assert d.memory.planned_cost_usd == pytest.approx(bought)
