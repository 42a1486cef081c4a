"""``broker report RUN_DIR``: on a real dry run's directory (the shared observed run), and the
report ``broker run`` prints at its end."""

from __future__ import annotations

import json

import pytest

from broker.cli import main
from tests.run_fixtures import TASKS


def report_json(run_dir, capsys) -> dict:
    assert main(["report", str(run_dir), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return json.loads(out)


def test_json_report_matches_the_runs_journal_and_events(observed_dry_run, capsys):
    run = observed_dry_run
    report = report_json(run.run_dir, capsys)
    run_done = run.events("run.done")[-1]
    first_plan = run.events("plan.solved")[0]
    assert report["run_id"] == run_done["run_id"] and report["state"] == "finished"
    assert report["tasks"] == {"total": TASKS + 1, "done": TASKS, "failed": 1, "left": 0}
    # Proposed: the first plan (the one confirmed); delivered: what run.done recorded.
    assert report["planned"] == {"makespan_s": first_plan["makespan_s"], "cost_usd": first_plan["cost_usd"]}
    assert report["delivered"] == {"makespan_s": run_done["makespan_s"], "cost_usd": run_done["cost_usd"]}
    expected_dev = 100 * (run_done["makespan_s"] - first_plan["makespan_s"]) / first_plan["makespan_s"]
    assert report["deviation_pct"]["makespan"] == pytest.approx(expected_dev, abs=0.01)
    # Cost per type: each terminated instance's cost, summed by its type.
    by_type: dict[str, float] = {}
    for e in run.events("instance.terminated"):
        by_type[e["type"]] = by_type.get(e["type"], 0.0) + e["cost_usd"]
    assert report["cost_by_type_usd"] == pytest.approx(by_type)
    assert sum(by_type.values()) + report["private_cost_usd"] == pytest.approx(run_done["cost_usd"])
    assert report["instances_launched"] == len(run.events("instance.launch")) >= 1
    assert report["samples"] == len(run.events("sample.done")) > 0
    # The failing task, each attempt's error, from the journal's events.
    [failed] = report["failed_tasks"]
    assert failed == {"task": f"t{TASKS + 1:06d}", "attempts": 2, "errors": ["exit code 3", "exit code 3"],
                      "quarantined": "failed 2 times (retries: 1)", "stderr_tail": "boom\n"}
    util = report["utilization_by_type"]
    assert set(util) == set(by_type) | {"private"}
    # A share of paid slot time; an instance may be launched and released unused when the
    # machine is slow (the work ran out first), so only the private node surely worked.
    assert all(0 <= u <= 1 for u in util.values()) and util["private"] > 0
    assert report["time_scale"] == 60.0


def test_human_report_is_what_broker_run_printed_at_its_end(observed_dry_run, capsys):
    run = observed_dry_run
    assert run.returncode == 1  # a task failed for good
    assert main(["report", str(run.run_dir)]) == 0
    text = capsys.readouterr().out.strip()
    printed = run.stdout.rstrip().splitlines()
    assert printed[-1].startswith("deadline ")  # the goal's verdict comes last, after the report
    assert text and "\n".join(printed[:-1]).endswith(text)
    lines = text.splitlines()
    assert lines[1].split() == ["proposed", "delivered", "deviation"]
    assert lines[2].split()[0] == "makespan" and lines[3].split()[0] == "cost"
    assert f"{TASKS} done, 1 failed, 0 left of {TASKS + 1}" in text
    assert f"failed t{TASKS + 1:06d} after 2 attempts: exit code 3" in text
    assert "utilization" in text and "(run time at scale 60" in text


def test_report_of_a_directory_without_a_journal_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"no journal at {tmp_path / 'journal.sqlite'}" in err


def test_the_report_names_the_nodes_lost_and_a_run_finished_on_fewer_private_nodes(tmp_path, capsys):
    """Issue 18, item 5: a node lost (and not back) is named with when and why; one that was
    lost then rejoined is not lost; a finished run says it ended on fewer private nodes than
    it was given."""
    from broker.core.model import Task
    from broker.shells.journal import AttemptResult, Journal

    run_dir = tmp_path / "run"
    with Journal.open(run_dir) as journal:
        journal.create_run("r1", goal_kind="theta", goal_value=1.0, retries=0, at_s=0.0)
        journal.add_tasks([Task("t0", "echo 0")])
        for name in ("h0", "h1", "h2"):
            journal.record_private_node(name, slots=1, speed=1.0, cost_per_hour=0.0, at_s=0.0)
        journal.record_event("node.lost", {"node": "h1", "reason": "its link dropped"}, at_s=5.0)
        journal.record_event("agent.reattached", {"node": "h1", "reason": "link back"}, at_s=9.0)
        journal.record_event("node.lost", {"node": "h2", "reason": "the agent closed the connection"}, at_s=12.0)
        journal.task_started("t0", 1, "h0", at_s=1.0)
        journal.task_finished("t0", 1, AttemptResult(exit_code=0, runtime_s=20.0), node="h0", at_s=21.0)
        journal.finish_run("finished", at_s=21.0)
    report = report_json(run_dir, capsys)
    assert [(n["node"], n["state"], n["done"]) for n in report["nodes"].pop("list")] == [
        ("h0", "starting", 1), ("h1", "rejoined", 0), ("h2", "lost", 0)]  # per node: tests/test_node_view.py
    assert report["nodes"] == {"private": ["h0", "h1", "h2"], "rejoined": ["h1"], "lost": [
        {"node": "h2", "at_s": 12.0, "reason": "the agent closed the connection", "private": True}]}
    assert main(["report", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "node lost: h2 at 12s (the agent closed the connection)" in text
    assert "finished on 2 of the 3 private nodes it was given (h2 lost)" in text
    assert "rejoined after being lost: h1" in text and "node lost: h1" not in text


def test_the_json_run_report_names_the_nodes_lost_from_the_ledger():
    """``broker run --json-report`` (the ledger's :class:`RunReport`): the nodes lost, the
    private nodes given and how many were left."""
    from broker.core.control.ledger import Ledger
    from broker.core.model import PrivateNode
    from broker.shells.run.report import build_report

    led = Ledger({})
    led.add_tasks([("a", None)])
    for name in ("h0", "h1"):
        led.add_private(PrivateNode(name, 1, 1.0))
        led.on_node_ready(name, 0.0)
    led.start("a", "h1", 0, 1.0)
    led.on_node_lost("h1", 2.0)
    doc = build_report(led, run_id="r", state="finished", now_s=3.0, first_plan=None, budget_stopped=False,
                       time_scale=1.0, stop_reason=None).to_json()
    assert doc["nodes"] == {"private": ["h0", "h1"], "lost": ["h1"], "private_left": 1}
