"""``broker status``: the --json contract, the human view, the default run directory, --watch
on a finished run, and the errors for a missing or unreadable journal."""

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import broker.cli.status as status_cli
from broker.cli import main
from broker.core.billing import Billing
from broker.core.model import Task
from broker.shells.journal import JOURNAL_FILE, SCHEMA_VERSION, AttemptResult, Journal

REPO = Path(__file__).resolve().parents[1]


def make_run(run_dir, n_tasks=10, n_done=4, finished=False):
    now = time.time()
    journal = Journal.open(run_dir)
    journal.create_run(run_dir.name, goal_kind="budget", goal_value=5.0, budget_usd=5.0, at_s=now - 1800)
    journal.add_tasks(Task(f"t{i}", f"echo {i}") for i in range(n_tasks))
    for i in range(n_done + 1):
        journal.task_started(f"t{i}", 1, "i-0abc", at_s=now - 600)
    for i in range(n_done):
        journal.task_finished(f"t{i}", 1, AttemptResult(0, 30.0), at_s=now - 300)
    journal.record_launch("i-0abc", "c5.xlarge", launched_at_s=now - 1700, price_per_hour=0.17,
                          billing=Billing.hourly(), state="running")
    journal.set_release("i-0abc", now - 1700 + 3600 - 120)
    journal.record_launch("i-0old", "m5.large", launched_at_s=now - 1700, price_per_hour=0.10,
                          billing=Billing.hourly())
    journal.record_instance_state("i-0old", "terminated", at_s=now - 1000)
    journal.record_plan(makespan_s=5400.0, cost_usd=0.51, fleet={"c5.xlarge": 1}, chosen={"budget": 5.0},
                        reason="initial", confidence=0.95, at_s=now - 1790)
    if finished:
        journal.finish_run("finished")
    journal.close()


def test_json_prints_exactly_one_object_in_the_documented_shape(tmp_path, capsys):
    make_run(tmp_path / "r1")
    assert main(["status", str(tmp_path / "r1"), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    payload = json.loads(out)
    assert set(payload) == {"tasks", "instances", "committed_usd", "budget_usd"}
    assert payload["tasks"] == {"total": 10, "done": 4, "running": 1, "failed": 0, "left": 6}
    assert payload["instances"] == {"running": 1, "terminated": 1}
    assert payload["committed_usd"] == pytest.approx(0.17 + 0.10)
    assert payload["budget_usd"] == 5.0


def test_human_view_shows_progress_spend_plan_and_fleet(tmp_path, capsys):
    make_run(tmp_path / "r1")
    assert main(["status", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "4/10 done" in out and "[" + "#" * 12 + "." * 18 + "]" in out
    assert "$0.27 committed of $5.00 budget (5%)" in out
    assert "makespan 1h30m" in out and "confidence 95%" in out and "ETA in 1h00m" in out
    fleet_row = next(line for line in out.splitlines() if "i-0abc" in line)
    assert "c5.xlarge" in fleet_row and "running" in fleet_row and "in 31m" in fleet_row and "in 29m" in fleet_row  # paid until, release
    assert "i-0old" not in out and "1 alive, 1 terminated" in out


def test_missing_journal_is_a_clear_error_with_exit_2(tmp_path, capsys):
    assert main(["status", str(tmp_path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no journal at {tmp_path / JOURNAL_FILE}" in captured.err


def test_missing_journal_exit_status_from_a_real_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "status", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60,
    )
    assert proc.returncode == 2
    assert "no journal" in proc.stderr and "Traceback" not in proc.stderr


def test_default_run_dir_is_the_most_recently_written_under_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["status"]) == 2
    assert "no run directory with a journal.sqlite under ./runs/" in capsys.readouterr().err
    make_run(tmp_path / "runs" / "b-older", n_tasks=7)
    make_run(tmp_path / "runs" / "a-newer", n_tasks=12)
    (tmp_path / "runs" / "not-a-run").mkdir()
    old = time.time() - 3600
    for name in (JOURNAL_FILE, JOURNAL_FILE + "-wal"):
        path = tmp_path / "runs" / "b-older" / name
        if path.exists():
            os.utime(path, (old, old))
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"]["total"] == 12


def test_watch_returns_at_once_on_a_finished_run(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "r1", finished=True)

    def no_sleep(_seconds):
        raise AssertionError("--watch kept refreshing a finished run")

    monkeypatch.setattr(status_cli.time, "sleep", no_sleep)
    assert main(["status", str(tmp_path / "r1"), "--watch", "--interval", "1s"]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and out.count("4/10 done") == 1


def test_watch_refreshes_a_running_run_until_interrupted(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "r1")
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    assert main(["status", str(tmp_path / "r1"), "--watch", "--interval", "2s"]) == 0
    assert sleeps == [2.0, 2.0]
    assert capsys.readouterr().out.count("4/10 done") == 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--json", "--watch"], "--json prints one snapshot"),
        (["--interval", "5"], "--interval only applies with --watch"),
        (["--watch", "--interval", "soon"], "--interval: expected a duration"),
    ],
)
def test_bad_flag_combinations_exit_2(tmp_path, capsys, flags, message):
    make_run(tmp_path / "r1")
    assert main(["status", str(tmp_path / "r1"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_journal_from_a_newer_broker_is_refused_with_exit_2(tmp_path, capsys):
    make_run(tmp_path / "r1")
    raw = sqlite3.connect(tmp_path / "r1" / JOURNAL_FILE)
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    assert main(["status", str(tmp_path / "r1"), "--json"]) == 2
    assert "newer broker" in capsys.readouterr().err
