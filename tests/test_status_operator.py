"""`broker status` and `broker runs` as an operator meets them: whether a daemon is attached and
how to resume or release a run without one, --watch before the run exists, --json for scripts,
human figures, a run brought down, and the list of runs."""

from __future__ import annotations

import json
import time

import pytest

import broker.cli.status as status_cli
from broker.cli import main
from broker.shells.journal import Journal
from broker.shells.runlock import hold
from tests.test_cli_status import make_run


def test_a_running_run_without_a_daemon_says_so_and_how_to_resume_or_release_it(tmp_path, capsys):
    """Regression: a run left with --on-stop leave (or killed) showed `running`, no more."""
    run_dir = tmp_path / "r1"
    make_run(run_dir)
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "daemon NONE attached" in out
    assert f"--budget 5 --run-dir {run_dir}`" in out and f"`broker down {run_dir}`" in out
    with hold(run_dir):
        assert main(["status", str(run_dir)]) == 0
        out = capsys.readouterr().out
    assert "daemon attached (pid" in out and "NONE" not in out


def test_watch_waits_for_a_journal_that_does_not_exist_yet(tmp_path, monkeypatch, capsys):
    """Regression: `status --watch` exited at once when started before the run."""
    run_dir = tmp_path / "later"
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            make_run(run_dir)  # the run starts while status waits
        if len(sleeps) == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    assert main(["status", str(run_dir), "--watch", "--interval", "2s"]) == 0
    out = capsys.readouterr().out
    assert "waiting for a run to write" in out and "4/10 done" in out


def test_json_carries_the_plan_the_promise_the_eta_and_the_instances(tmp_path, capsys):
    run_dir = tmp_path / "r1"
    make_run(run_dir)
    with Journal.open(run_dir) as journal:
        anchor = journal.run().created_at_s
        journal.record_event("plan.solved", {"makespan_s": 5400.0, "cost_usd": 0.51, "fleet": {"c5.xlarge": 1},
                                             "cause": "budget_plan", "note": None, "work_ref_s": 1000.0,
                                             "work_upper_ref_s": 1200.0, "mean_ref_s": 100.0, "sd_ref_s": 10.0,
                                             "work_tasks": 6}, at_s=anchor + 10)
    assert main(["status", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["state"] == "running" and doc["run"]["phase"] == "executing"
    assert doc["run"]["goal"] == {"kind": "budget", "value": 5.0}
    assert doc["daemon"] == {"attached": False, "pid": None}
    assert doc["plan"]["makespan_s"] == 5400.0 and doc["plan"]["cost_usd"] == 0.51
    assert doc["promise"] == {"makespan_s": 5400.0, "cost_usd": 0.51}
    eta = doc["eta"]
    assert eta["low_s"] <= eta["expected_s"] <= eta["high_s"] and 0 < eta["confidence"] < 1
    ids = {i["id"]: i for i in doc["instance_list"]}
    assert set(ids) == {"i-0abc", "i-0old"}
    assert ids["i-0abc"]["state"] == "running" and ids["i-0abc"]["tasks"] == 1
    assert ids["i-0abc"]["release_at_s"] == pytest.approx(100 + 3600 - 120, abs=1)
    assert ids["i-0old"]["terminated_at_s"] is not None


def test_goals_and_times_are_human(tmp_path, capsys):
    """Regression: `goal deadline 600` in raw seconds."""
    run_dir = tmp_path / "r1"
    journal = Journal.open(run_dir)
    journal.create_run("r1", goal_kind="deadline", goal_value=600.0, deadline_s=600.0, at_s=time.time() - 60)
    journal.close()
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "goal deadline 10m00s" in out and "goal deadline 600" not in out
    assert "running (sampling)" in out


def test_a_dry_run_brought_down_reads_in_run_time(tmp_path, capsys):
    """Regression: after `broker down` a dry run read `ran 23s` and `plan #1 (-1186s ago)`: down
    recorded the end in wall time, the run's clock runs 60x."""
    run_dir = tmp_path / "r1"
    anchor = time.time() - 100  # 100 wall s ago = 6000 s of run time at 60x
    journal = Journal.open(run_dir)
    journal.create_run("r1", goal_kind="budget", goal_value=1.0, budget_usd=1.0, at_s=anchor,
                       options={"dry_run": True, "time_scale": 60.0, "epoch_anchor_s": anchor})
    journal.record_plan(makespan_s=4000.0, cost_usd=0.2, fleet={}, chosen={}, reason="budget_plan",
                        at_s=anchor + 3000)
    journal.close()
    assert main(["down", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "stopped" in out and "-" + "1" not in out.split("plan")[1].split(",")[0]
    ran = out.split("ran ")[1].split(" ")[0].rstrip(",")
    assert ran.startswith("1h"), out  # ~6000 s of run time, not ~100 wall seconds
    assert "made 50m00s into the run" in out


def test_runs_lists_state_goal_progress_spend_and_age_newest_first(tmp_path, capsys):
    base = tmp_path / "runs"
    make_run(base / "old", finished=True)
    time.sleep(0.01)
    make_run(base / "new")
    (base / "empty").mkdir()
    with hold(base / "new"):
        assert main(["runs", str(base)]) == 0
        out = capsys.readouterr().out
        assert main(["runs", str(base), "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "GOAL", "PROGRESS", "SPEND", "AGE", "DIR"]
    assert "running" in lines[1] and "no daemon" not in lines[1] and "finished" in lines[2]
    assert "budget $5.00" in lines[1] and "4/10" in lines[1] and "$0.27 of $5.00" in lines[1]
    assert [r["state"] for r in rows] == ["running", "finished"] and rows[0]["daemon"] is True
    assert main(["runs", str(base)]) == 0
    assert "running, no daemon" in capsys.readouterr().out


def test_after_a_resume_the_phase_is_running_and_a_finished_run_has_no_stop_reason(tmp_path):
    """Regression: after a resume every progress line said `(sampling)`, and a run left with
    --on-stop leave then resumed to its end read `finished (user_stop)`."""
    from types import SimpleNamespace

    from broker.cli.report import build
    from broker.cli.runview import RunConsole

    run_dir = tmp_path / "r1"
    make_run(run_dir)
    with Journal.open(run_dir) as journal:
        at = journal.run().created_at_s
        journal.record_event("plan.solved", {"makespan_s": 5400.0, "cost_usd": 0.51}, at_s=at + 10)
        journal.record_event("run.stop", {"reason": "user_stop", "on_stop": "leave"}, at_s=at + 20)
        journal.record_event("run.resume", {"run_dir": str(run_dir)}, at_s=at + 30)
        goal = SimpleNamespace(kind="budget", value=5.0)
        fresh = RunConsole(None, goal, 10, yes=True, json_report=False, journal=journal, resumed=False)
        resumed = RunConsole(None, goal, 10, yes=True, json_report=False, journal=journal, resumed=True)
        assert fresh.phase == "sampling" and resumed.phase == "running"
        journal.finish_run("finished", at_s=at + 40)
        report = build(journal, run_dir)
    assert report["state"] == "finished" and report["stop_reason"] is None


def test_a_run_with_tasks_left_reports_no_deviation_from_the_plan(tmp_path, capsys):
    """Regression: a stopped run with 96 tasks left reported a makespan deviation of -34.7%."""
    from broker.shells.daemon import RunReport

    run_dir = tmp_path / "r1"
    make_run(run_dir)
    with Journal.open(run_dir) as journal:
        at = journal.run().created_at_s
        journal.record_event("plan.solved", {"makespan_s": 5400.0, "cost_usd": 0.51}, at_s=at + 10)
        journal.finish_run("stopped", at_s=at + 1800)
    assert main(["report", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"]["left"] == 6 and report["deviation_pct"] == {"makespan": None, "cost": None}
    assert main(["report", str(run_dir)]) == 0
    assert "no deviation: 6 tasks left" in capsys.readouterr().out
    stopped = RunReport("r", "stopped", 100, 4, 0, 0, 0, 600.0, 1.0, 1.0, 0.0, 900.0, 2.0, {}, False, 1.0)
    finished = RunReport("r", "finished", 100, 100, 0, 0, 0, 600.0, 1.0, 1.0, 0.0, 900.0, 2.0, {}, False, 1.0)
    assert stopped.to_json()["deviation_pct"] == {"makespan": None, "cost": None}
    assert finished.to_json()["deviation_pct"] == {"makespan": -33.33, "cost": -50.0}
