"""The front as a person reads it (broker/cli/frontview.py): the chosen plan marked as the row it
is, the private column, the run's offsets, and what the plot draws."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from broker.cli import main
from broker.cli.frontview import FrontView, draw_front, private_work_share, render_table
from broker.config.inventory import load_inventory
from broker.core.plan import Goal, Work, pareto_front, plan_for_goal

REPO = Path(__file__).resolve().parent.parent
THESIS = load_inventory(str(REPO / "examples" / "thesis-catalogue.yaml"))
WORK = Work(total_ref_s=2000 * 1020.0, tasks=2000, mean_ref_s=1020.0)


@pytest.fixture(scope="module")
def front():
    return pareto_front(THESIS.types, THESIS.private, WORK)


def _marked(table: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith("*  ")]


def test_a_chosen_front_point_is_marked_as_its_row_even_as_another_solve_of_it(front):
    """Regression: the chosen plan, solved again (another object, another private split), was
    printed as `* -` although it is front point 5."""
    k = min(5, len(front))
    chosen = replace(front[k - 1], private_share={n: 0.5 for n in front[k - 1].private_share})
    table = render_table(FrontView(WORK, THESIS.types, front, chosen))
    marked = _marked(table)
    assert len(marked) == 1 and marked[0].split()[1] == str(k), table
    assert not any(line.split()[:2] == ["*", "-"] for line in table.splitlines())


def test_a_plan_between_points_gets_a_dash_row_in_makespan_order_and_a_note(front):
    chosen = plan_for_goal(THESIS.types, THESIS.private, WORK,
                           Goal("deadline", (front[0].makespan_s + front[1].makespan_s) / 2))
    view = FrontView(WORK, THESIS.types, front, chosen)
    rows = view.rows()
    assert [r.label for r in rows if r.chosen] in (["-"], ["1"], ["2"])
    assert [r.makespan_s for r in rows] == sorted(r.makespan_s for r in rows)
    if rows[1].label == "-":
        assert "not a front point" in render_table(view)


def test_the_private_column_is_the_share_of_the_work_on_private_nodes():
    inventory = load_inventory(str(REPO / "inventory.yaml"))
    work = Work(total_ref_s=10.0, tasks=10, mean_ref_s=1.0)
    points = pareto_front(inventory.types, inventory.private, work)
    cheapest = points[-1]
    assert sum(cheapest.fleet.values()) == 0  # nothing rented: the private node does it all
    assert private_work_share(cheapest, work) == pytest.approx(1.0)
    assert "100%" in render_table(FrontView(work, inventory.types, points, None)).splitlines()[-1]
    # A plan that rents: the column is the private node's capacity over the work, not its busy
    # time over the horizon (the solver's private_share, which a rented fleet does not shrink).
    big = Work(total_ref_s=20 * 3600.0, tasks=2000, mean_ref_s=36.0)
    fastest = pareto_front(inventory.types, inventory.private, big)[0]
    assert sum(fastest.fleet.values()) > 0
    share = private_work_share(fastest, big)
    assert share == pytest.approx(fastest.capacity["local"] / big.total_ref_s)
    assert share < fastest.private_share["local"] - 0.1


def test_figures_from_the_runs_start_add_the_time_already_run(front):
    view = FrontView(WORK, THESIS.types, front, front[1], offset_s=600.0, committed_usd=2.0)
    rows = view.rows()
    assert [r.makespan_s for r in rows] == [600.0 + p.makespan_s for p in front]
    assert [r.cost_usd for r in rows] == pytest.approx([2.0 + p.cost_usd for p in front])
    assert "10m00s already run, $2.00 already committed" in render_table(view)


def test_the_plot_draws_steps_numbered_points_the_deadline_and_the_chosen_row(front):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deadline = Goal("deadline", front[2].makespan_s + 60)
    view = FrontView(WORK, THESIS.types, front, front[2], goal=deadline)
    fig, ax = plt.subplots()
    draw_front(ax, view, per=3600.0)  # (hours, whatever plot_front would pick)
    labels = [t.get_text() for t in ax.texts]
    assert labels == [str(k) for k in range(1, len(front) + 1)]
    step = ax.lines[0]
    assert step.get_drawstyle() == "steps-post"
    xs = list(step.get_xdata())[:-1]
    assert xs == pytest.approx([p.makespan_s / 3600 for p in front])
    vertical = [line for line in ax.lines if list(line.get_xdata()) == [deadline.value / 3600] * 2]
    assert vertical, "no deadline line"
    ring = [line for line in ax.lines if line.get_label() == "chosen: point 3"]
    assert ring and list(ring[0].get_xdata()) == pytest.approx([front[2].makespan_s / 3600])
    plt.close(fig)


def test_broker_plan_point_k_is_the_plan_the_run_promises(capsys):
    """`broker plan --point K` prints the plan `broker run --point K` adopts: point K's cost,
    as soon as it finishes (FleetPlanner.soonest_at_cost), marked on row K."""
    from broker.core.control.planning import FleetPlanner, PlannerInput

    inventory = str(REPO / "examples" / "thesis-catalogue.yaml")
    assert main(["plan", "--inventory", inventory, "--tasks", "2000", "--mean-runtime", "17m", "--point", "3"]) == 0
    out = capsys.readouterr().out
    marked = _marked(out)
    assert len(marked) == 1 and marked[0].split()[1] == "3", out
    points = pareto_front(THESIS.types, THESIS.private, WORK)
    run_choice = FleetPlanner().soonest_at_cost(PlannerInput(tuple(THESIS.types), tuple(THESIS.private), (), WORK, 0.0),
                                                points[2])
    cost = re.search(r"\$([\d,]+\.\d\d)", marked[0]).group(1).replace(",", "")
    assert float(cost) == pytest.approx(run_choice.cost_usd, abs=0.006)
