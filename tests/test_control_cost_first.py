"""No goal (or theta 1) asks for the cheapest run; its promise is the cheapest front point,
which has no slack. Holding that point's finish for the work's upper confidence value, as a
deadline does, bought EC2 hours for work that was mostly not there: 300-task bags without
estimates on a private node and two EC2 types spent 87% over the promise on average (113% at
worst) and finished early, which nobody had asked for. A cost-first run plans for the work's
point value instead (a launch still has to survive the hysteresis band).
"""

from __future__ import annotations

import statistics

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, Simulation
from broker.sim.workloads import load_workload

TYPES = (
    MachineType("small", 1, 1.0, 0.08, 3, 0.0, Billing.hourly()),
    MachineType("big", 2, 4.0, 0.50, 2, 60.0, Billing.hourly()),
)
LAB = PrivateNode("lab", slots=2, speed=2.0, cost_per_hour=0.05, local=True)
SEEDS = range(6)


def simulate(inventory: Inventory, goal: Goal, seed: int, tasks: int):
    workload = load_workload("short", seed, tasks=tasks)  # uniform 1 s - 8 min, no per-task estimates
    r = Simulation(inventory, workload, goal, ControllerConfig(), SimOptions(seed=seed)).run()
    assert r.tasks_done == r.tasks_total == tasks
    return r


def test_no_goal_with_a_private_node_does_not_buy_ec2_to_hedge_the_cheapest_promise():
    runs = [simulate(Inventory(private=(LAB,), types=TYPES), Goal(), seed, 300) for seed in SEEDS]
    over = [r.cost_usd / r.planned_cost_usd - 1 for r in runs]
    assert statistics.mean(over) <= 0.25, over  # hedging: +87% on average
    assert sum(r.instances_launched > 0 for r in runs) <= 2, [r.instances_launched for r in runs]  # hedging: 6 of 6


def test_no_goal_on_ec2_alone_costs_about_what_it_promised():
    runs = [simulate(Inventory(private=(), types=TYPES), Goal(), seed, 200) for seed in SEEDS]
    over = [r.cost_usd / r.planned_cost_usd - 1 for r in runs]
    assert statistics.mean(over) <= 0.10, over  # hedging: +25% on average


def test_theta_one_is_the_same_run_as_no_goal():
    inventory = Inventory(private=(LAB,), types=TYPES)
    a, b = simulate(inventory, Goal(), 2, 300), simulate(inventory, Goal("theta", 1.0), 2, 300)
    assert (a.makespan_s, a.cost_usd, a.fleet_changes) == (b.makespan_s, b.cost_usd, b.fleet_changes)


def test_a_point_short_of_the_cheapest_still_holds_its_finish():
    # theta 0.5 is not cost-first: its plans still cover the upper value by the promised
    # finish, so the run does not end later than promised (by more than the end's allowance).
    for seed in (0, 1):
        r = simulate(Inventory(private=(LAB,), types=TYPES), Goal("theta", 0.5), seed, 300)
        assert r.makespan_s <= r.planned_makespan_s * 1.02
