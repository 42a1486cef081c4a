"""The BaTS baseline on the thesis workloads (issue 15): it must keep buying after its first ATU."""

from __future__ import annotations

import os
import sys

from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.sim.engine import SimOptions, Simulation
from broker.sim.workloads import BUILTIN, build_workload

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from scenarios import thesis_inventory  # noqa: E402  (the thesis catalogue, n machines a type, the xeon)


def test_bats_sizes_its_fleet_on_the_remaining_work_not_on_the_longest_tasks_that_finished_first():
    """LM with estimates, a budget twice the cost floor. Dispatch runs the largest tasks first,
    so the finished tasks' mean was ~11x the bag's after the first hour; BaTS's knapsack then
    found no configuration within the budget and launched nothing for days (10,000 tasks on
    20 machines a type: nothing between t = 0 and 187.8 h)."""
    inventory = thesis_inventory(5)
    spec = dict(BUILTIN["LM"], estimates={"error": 0.1})
    workload = build_workload(spec, 1, tasks=4000)
    floor_usd = float(workload.runtimes_ref_s.sum()) * min(
        [t.price_per_hour / 3600 / t.capacity_per_s for t in inventory.types]
        + [p.cost_per_hour / 3600 / p.capacity_per_s for p in inventory.private])
    goal = Goal("budget", 2 * floor_usd)
    r = Simulation(inventory, workload, goal, ControllerConfig(policy="bats"),
                   SimOptions(seed=1, max_virtual_s=10 * 86400)).run()
    assert r.tasks_done == r.tasks_total
    # the work is about 7 h of the whole fleet; the private node alone needs 112 h
    assert r.makespan_s < 24 * 3600, f"{r.makespan_s / 3600:.1f} h"
    launched_after_first_atu = [c for c in r.fleet_changes if c[0] >= 3600.0]
    renewed = [x for x in r.releases if x["at_s"] > 3600.0]
    assert launched_after_first_atu or renewed
    assert r.cost_usd <= goal.value + 1e-6  # the whole bill, private node included
