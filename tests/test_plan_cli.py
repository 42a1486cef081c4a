"""``broker plan``: the JSON shape, the table, the reason line, the plot."""

from __future__ import annotations

import json

import pytest

from broker.cli import main

INVENTORY = """
private:
  - {name: lab, local: true, slots: 2, speed: 2, cost_per_hour: 0.05}
aws:
  billing: hourly
  types:
    - {name: small, slots: 1, speed: 1, price: 0.08, limit: 3}
    - {name: big, slots: 2, speed: 4, price: 0.50, limit: 2, boot: 60s}
"""


@pytest.fixture()
def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return str(path)


def test_json_prints_exactly_one_object_with_the_documented_keys(inventory, capsys):
    rc = main(["plan", "--inventory", inventory, "--tasks", "200", "--mean-runtime", "5m", "--theta", "0.5", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)  # raises if there is anything but one JSON document
    assert set(obj) == {"work", "front", "cheapest", "chosen", "promise", "solve_ms"}
    p = obj["promise"]  # makespan and cost as points and 90% intervals
    assert set(p) == {"confidence", "makespan_s", "makespan_s_range", "cost_usd", "cost_usd_range"}
    assert p["confidence"] == 0.9 and p["makespan_s_range"][0] <= p["makespan_s"] <= p["makespan_s_range"][1]
    assert set(obj["work"]) == {"tasks", "mean_ref_s", "total_ref_s", "planned_ref_s"}
    assert obj["work"] == {"tasks": 200, "mean_ref_s": 300.0, "total_ref_s": 60000.0, "planned_ref_s": 60000.0}
    assert obj["front"] and all(set(row) == {"makespan_s", "cost_usd", "fleet"} for row in obj["front"])
    assert set(obj["chosen"]) == {"makespan_s", "cost_usd", "fleet"}
    assert obj["chosen"] in obj["front"]
    makespans = [row["makespan_s"] for row in obj["front"]]
    assert makespans == sorted(makespans)


def test_json_with_an_impossible_deadline_has_no_chosen_plan_and_exits_1(inventory, capsys):
    rc = main(["plan", "--inventory", inventory, "--tasks", "200", "--mean-runtime", "5m", "--deadline", "5m",
               "--json"])
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads(captured.out)["chosen"] is None
    assert "no plan finishes" in captured.err


def test_table_marks_the_chosen_point_and_lists_types_with_billing(inventory, capsys):
    rc = main(["plan", "--inventory", inventory, "--tasks", "200", "--mean-runtime", "5m", "--point", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert "small (hourly)" in out and "big (hourly)" in out
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 1 and marked[0].split()[1] == "1"


def test_table_says_why_a_budget_cannot_be_met(inventory, capsys):
    rc = main(["plan", "--inventory", inventory, "--tasks", "2000", "--mean-runtime", "30m", "--budget", "0.01"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "cannot meet budget $0.01: " in out and "the cheapest plan costs $" in out


def test_bats_policy_needs_a_budget(inventory, capsys):
    rc = main(["plan", "--inventory", inventory, "--tasks", "20", "--mean-runtime", "5m", "--policy", "bats"])
    assert rc == 2
    assert "--budget" in capsys.readouterr().err
    rc = main(["plan", "--inventory", inventory, "--tasks", "20", "--mean-runtime", "5m", "--policy", "bats",
               "--budget", "5", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["chosen"]["cost_usd"] <= 5


def test_bad_flags_are_usage_errors(inventory, capsys):
    assert main(["plan", "--inventory", inventory, "--tasks", "20"]) == 2
    assert main(["plan", "--inventory", inventory, "--tasks", "20", "--mean-runtime", "5m", "--theta", "2"]) == 2
    assert main(["plan", "--inventory", inventory, "--tasks", "20", "--mean-runtime", "soon"]) == 2
    assert main(["plan", "--inventory", inventory, "--tasks", "20", "--mean-runtime", "5m", "--point", "99"]) == 2
    err = capsys.readouterr().err
    assert "--mean-runtime" in err and "theta" in err and "not on the front" in err


def test_bag_without_estimates_asks_for_a_mean(inventory, tmp_path, capsys):
    bag = tmp_path / "bag.yaml"
    bag.write_text("command: echo {x}\nsweep:\n  x: [1, 2, 3]\ntimeout: 10m\n")
    rc = main(["plan", "--inventory", inventory, str(bag)])
    assert rc == 2
    assert "this bag has no estimate columns" in capsys.readouterr().err


def test_plot_writes_a_png(inventory, tmp_path, capsys):
    png = tmp_path / "front.png"
    rc = main(["plan", "--inventory", inventory, "--tasks", "200", "--mean-runtime", "5m", "--theta", "1",
               "--plot", str(png)])
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_deadline_is_held_at_the_confidence_or_refused_with_what_can_be_promised(inventory, capsys):
    """A deadline plan is the cheapest whose makespan's 90% quantile meets the deadline; one
    that can only be met on average is refused (exit 1) with the promise that can be made."""
    args = ["plan", "--inventory", inventory, "--tasks", "400", "--mean-runtime", "5m", "--runtime-sd", "5m", "--json"]
    rc = main(args + ["--deadline", "3h"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["promise"]["makespan_s"] <= 3 * 3600
    fastest = obj["front"][0]["makespan_s"]
    rc = main(args + ["--deadline", f"{int(fastest) + 1}s"])
    captured = capsys.readouterr()
    obj = json.loads(captured.out)
    assert rc == 1
    assert "cannot be promised with 90% confidence" in captured.err
    assert obj["promise"]["makespan_s"] > 0


def test_a_budget_plans_promise_stays_within_the_budget(inventory, capsys):
    # 400 tasks of 30 min with a sd as large (about 200 h of work) on $8: the plan spends
    # nearly all of it; the promise's cost never goes past it (the private node runs what the
    # budget cannot buy, so no forecast stops with work left), and it says which budget.
    rc = main(["plan", "--inventory", inventory, "--tasks", "400", "--mean-runtime", "30m", "--runtime-sd", "30m",
               "--budget", "8", "--json"])
    assert rc == 0
    p = json.loads(capsys.readouterr().out)["promise"]
    assert p["cost_usd"] <= 8 and p["cost_usd_range"][1] <= 8
    assert p["budget_usd"] == 8 and p["stop_share"] == 0.0
