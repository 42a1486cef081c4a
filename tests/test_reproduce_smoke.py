"""The reproduction report's code path on tiny versions of its scenarios.

Every thesis scenario (LS, LM, LL at 300 tasks, 3 machines per type) and one BaTS scenario
(S1-4 at 60 tasks, 2 machines per cluster) run through ``bench/reproduce.py`` exactly as the
full report does; the test checks that each table has every row, that every simulated
number is finite, and that every goal line is a verdict. Only one BaTS scenario: budget
goals make the broker re-solve the planner many times per tick, which costs seconds even
at this size.
"""

from __future__ import annotations

import math
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import reproduce as rp  # noqa: E402
import scenarios as sc  # noqa: E402

TINY = rp.Scale(thesis_tasks=300, machine_counts=(3,), sla_workloads=("LM",), bats_scenarios=("S1-4",),
                bats_tasks=60, bats_machines=2, speed_run=False)


@pytest.fixture(scope="module")
def tiny_report():
    runs, fronts = rp.plan_runs(TINY, seed=3)
    outcomes = rp.run_all(runs, jobs=1)
    return runs, fronts, outcomes


def test_every_run_finishes_with_finite_figures(tiny_report):
    runs, _, outcomes = tiny_report
    assert len(outcomes) == len(runs)
    for o in outcomes:
        assert o.error is None, (o.spec, o.error)
        assert o.tasks_done == o.tasks_total == o.spec.tasks, o.spec
        for name in ("makespan_s", "cost_usd", "max_committed_usd", "sim_wall_s"):
            value = getattr(o, name)
            assert math.isfinite(value) and value >= 0, (o.spec, name, value)
        assert o.makespan_s > 0 and o.cost_usd > 0, o.spec
        if o.spec.policy == "broker" and o.spec.section in ("thesis", "sla"):
            assert math.isfinite(o.planned_makespan_s) and math.isfinite(o.planned_cost_usd), o.spec


def test_the_run_list_covers_every_policy_point_and_budget(tiny_report):
    runs, fronts, _ = tiny_report
    assert set(fronts) == {"LS3", "LM3", "LL3"}
    for name in fronts:
        mine = {(r.policy, r.label) for r in runs if r.section == "thesis" and r.scenario == name}
        assert mine == {("broker", rp.BEST_MAKESPAN), ("broker", rp.BEST_COST), ("list", rp.BEST_MAKESPAN),
                        ("list", rp.BEST_COST), ("rr", "all machines"), ("bats", rp.BEST_COST)}
    for name, f in fronts.items():
        lists = {(r.label, r.variant): r for r in runs if r.scenario == name and r.policy == "list"}
        assert set(lists) == {(rp.BEST_MAKESPAN, rp.SAME_MACHINES)} | {(rp.BEST_COST, v) for v in rp.LIST_VARIANTS}
        # the goal's List runs on exactly the machines of our point's plan
        assert lists[(rp.BEST_COST, rp.SAME_MACHINES)].list_fleet == f.cost_fleet
        assert lists[(rp.BEST_MAKESPAN, rp.SAME_MACHINES)].list_fleet == f.makespan_fleet
        assert lists[(rp.BEST_COST, rp.ETA_BY_NAME)].list_fleet is None
    sla = {(r.label, r.estimate_error) for r in runs if r.section == "sla"}
    assert sla == {(p, e) for p in (rp.BEST_MAKESPAN, rp.BEST_COST) for e in (0.0, 0.3, None)}
    budgets = sc.bats_budgets_usd("S1-4", TINY.bats_tasks)
    bats = {(r.policy, r.label, r.goal_value) for r in runs if r.section == "bats"}
    assert bats == {("rr", "none", None)} | {(p, k, v) for k, v in budgets.items() for p in ("bats", "broker")}


def test_printed_tables_have_every_row_and_finite_numbers(tiny_report, capsys):
    _, fronts, outcomes = tiny_report
    goals = rp.report(outcomes, fronts)
    out = capsys.readouterr().out
    for title in ("Table 6.4", "Table 6.5", "Table 6.6", "BaTS Sec. 3", "wall time per run", "Goals"):
        assert title in out
    for name in fronts:
        # one row in each of Tables 6.4, 6.5 and List_eta's; LM3 has eight SLA rows (0%, 10%, 30%, no estimates) x 2
        rows = [line for line in out.splitlines() if line.startswith(name + " ")]
        expected = 3 + (8 if name == "LM3" else 0)
        assert len(rows) == expected, (name, rows)
    bats_rows = [line for line in out.splitlines() if line.startswith("S1-4 ")]
    assert len(bats_rows) == 1 + 2 + 1  # RR, two budgets, our B_min
    assert not re.search(r"\bnan\b|\binf\b|ERROR", out)
    # 2 best-cost goals (LM, LL), 4 SLA goals, 2 x 2 BaTS goals
    assert len(goals) == 2 + 4 + 4
    assert all(g.startswith(("PASS ", "MISS ")) for g in goals)
    assert any("never over budget" in g for g in goals)


def test_bats_budgets_scale_with_the_bag():
    full = sc.bats_budgets_usd("S4-1")
    assert full == {"RR cost": 2034, "1.1 B_min": 1128}
    assert sc.bats_budgets_usd("S4-1", 500) == {"RR cost": 1017, "1.1 B_min": 564}


def test_min_budget_uses_the_most_profitable_cluster():
    workload = sc.bats_workload(0, tasks=40)
    hours = workload.runtimes_ref_s.sum() / 3600
    # S1-4: cluster1 is 4x as fast at the same price, so the bag takes hours / 4 on it.
    assert sc.bats_min_budget_usd("S1-4", workload) == math.ceil(hours / 4) * 3.0
    # S4-1: cluster1 costs 4x for the same speed, so cluster0 is the most profitable.
    assert sc.bats_min_budget_usd("S4-1", workload) == math.ceil(hours) * 3.0


def test_same_machines_list_launches_exactly_the_plans_machines(tiny_report):
    runs, fronts, outcomes = tiny_report
    f = fronts["LM3"]
    spec = next(r for r in runs if r.scenario == "LM3" and r.policy == "list" and r.variant == rp.SAME_MACHINES
                and r.label == rp.BEST_COST)
    inventory = sc.thesis_inventory(spec.machines)
    workload = sc.thesis_workload("LM", spec.seed, tasks=spec.tasks)
    config = rp.ControllerConfig(policy="list", list_fleet=spec.list_fleet)
    result = rp.Simulation(inventory, workload, rp.Goal("none", None), config, rp.SimOptions(seed=spec.seed)).run()
    launched: dict[str, int] = {}
    for _, type_name, count in result.fleet_changes:
        launched[type_name] = launched.get(type_name, 0) + count
    assert tuple(sorted(launched.items())) == f.cost_fleet
    assert result.tasks_done == result.tasks_total


def test_eta_faster_first_takes_the_faster_of_equally_efficient_types():
    inventory = sc.thesis_inventory(20)
    # the xeon is the most cost-efficient machine; c1.xlarge and c1.medium tie, c1.xlarge is faster
    assert rp.eta_faster_first(inventory, 12) == (("c1.xlarge", 11),)
    assert rp.eta_faster_first(inventory, 25) == (("c1.medium", 4), ("c1.xlarge", 20))
    assert rp.eta_faster_first(inventory, 1) == ()


def test_cost_floor_is_the_work_at_the_lowest_price_per_reference_second():
    inventory = sc.thesis_inventory(20)
    workload = sc.thesis_workload("LM", 1, tasks=500)
    # the xeon: $0.32/h for 10 reference seconds per second
    expected = float(workload.runtimes_ref_s.sum()) * 0.32 / 3600.0 / 10.0
    assert rp.cost_floor_usd(inventory, workload) == pytest.approx(expected)


def test_thesis_cut_table_obeys_the_cut_and_orders_the_front():
    # bench/thesis_cut.py at n = 2,000: every row's longest task is within its cut, and a
    # looser cut gives a longer longest task; point 2 is slower and cheaper than point 1.
    import thesis_cut

    rows = thesis_cut.cut_rows(seed=2, tasks=2000, cuts=(6, 8, 10))
    assert [(r.scenario, r.hi) for r in rows] == [(s, hi) for s in ("LM20", "LM60", "LL20", "LL60")
                                                  for hi in (6, 8, 10)]
    for r in rows:
        assert r.longest_h * 60 <= 2 ** r.hi + 1e-6
        assert r.work_h > 0 and math.isfinite(r.point2[1])
        assert r.point2[0] > r.best_makespan[0] and r.point2[1] < r.best_makespan[1]
    for a, b in zip(rows, rows[1:]):
        if a.scenario == b.scenario:
            assert b.longest_h > a.longest_h
