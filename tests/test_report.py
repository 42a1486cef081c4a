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
