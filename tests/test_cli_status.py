"""``broker status``: the --json contract, the human view, the default run directory, --watch
on a finished run, and the errors for a missing or unreadable journal."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

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
    promise = {"confidence": 0.95, "makespan_s": 5300.0, "makespan_s_range": [5000.0, 5400.0], "cost_usd": 0.5,
               "cost_usd_range": [0.45, 0.51]}
    journal.record_plan(makespan_s=5400.0, cost_usd=0.51, fleet={"c5.xlarge": 1},
                        chosen={"budget": 5.0, "promise": promise,
                                "promise_text": "done in 1.5 h (95%: 1.4-1.5 h), $0.50 (95%: $0.45-$0.51)"},
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
    assert set(payload) == {"tasks", "instances", "committed_usd", "budget_usd", "run", "daemon", "plan", "promise",
                            "eta", "instance_list", "promise_now", "node_list", "spot"}
    assert payload["spot"] is None  # no spot instance in this run
    assert payload["promise_now"] == {"confidence": 0.95, "makespan_s": 5300.0, "makespan_s_range": [5000.0, 5400.0],
                                  "cost_usd": 0.5, "cost_usd_range": [0.45, 0.51]}  # the current one
    assert payload["tasks"] == {"total": 10, "done": 4, "running": 1, "failed": 0, "left": 6, "dropped": 0}
    assert payload["instances"] == {"running": 1, "terminated": 1}
    assert payload["committed_usd"] == pytest.approx(0.17 + 0.10)
    assert payload["budget_usd"] == 5.0


def test_human_view_shows_progress_spend_plan_and_fleet(tmp_path, capsys):
    make_run(tmp_path / "r1")
    assert main(["status", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "4/10 done" in out and "[" + "#" * 12 + "." * 18 + "]" in out
    assert "$0.27 committed of $5.00 budget (5%)" in out
    assert "makespan 1h30m" in out and "confidence 95%" in out
    # the promise standing now, on a line of its own (issue 19: status shows it with its interval)
    assert "\npromise done in 1.5 h (95%: 1.4-1.5 h), $0.50 (95%: $0.45-$0.51), by plan #" in out
    assert "eta    in 1h00m (90% interval 1h00m-1h00m)" in out  # no plan.solved event: no interval
    assert "$4.73 left" in out
    fleet_row = next(line for line in out.splitlines() if "i-0abc" in line)
    assert "c5.xlarge" in fleet_row and "running" in fleet_row and "in 31m" in fleet_row and "in 29m" in fleet_row  # paid until, release
    assert fleet_row.split()[3] == "1"  # TASKS: t4 runs there
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


# -- the ETA: by the last plan (with its interval), by the pace; run time vs wall time ------
NOW = 1_800_000_000.0  # a fixed wall clock for the views below


def frozen_clock(monkeypatch, wall_now_s: float = NOW) -> None:
    monkeypatch.setattr(status_cli, "time", SimpleNamespace(time=lambda: wall_now_s, sleep=time.sleep))


def make_planned_run(run_dir, *, anchor_s, scale=1.0):
    """A run started at ``anchor_s``: 10 tasks, 4 done 300 s ago, one running, a plan made at
    run time 600 s for 5400 s on work whose point value is 80% of its upper value."""
    run_now = anchor_s + scale * (NOW - anchor_s)
    journal = Journal.open(run_dir)
    options = {"time_scale": scale, "epoch_anchor_s": anchor_s} if scale != 1.0 else {}
    journal.create_run(run_dir.name, goal_kind="budget", goal_value=5.0, budget_usd=5.0, options=options,
                       at_s=anchor_s)
    journal.add_tasks(Task(f"t{i}", f"echo {i}") for i in range(10))
    for i in range(5):
        journal.task_started(f"t{i}", 1, "i-0abc", at_s=run_now - 600)
    for i in range(4):
        journal.task_finished(f"t{i}", 1, AttemptResult(0, 30.0), at_s=run_now - 300)
    journal.record_launch("i-0abc", "c5.xlarge", launched_at_s=anchor_s, price_per_hour=3.6,
                          billing=Billing.per_second(), state="running")
    journal.record_plan(makespan_s=5400.0, cost_usd=0.51, fleet={"c5.xlarge": 1}, chosen={"budget": 5.0},
                        reason="initial", at_s=anchor_s + 600)
    journal.record_event("plan.solved", {"makespan_s": 5400.0, "work_ref_s": 800.0, "work_upper_ref_s": 1000.0,
                                         "cost_usd": 0.51, "fleet": {"c5.xlarge": 1}}, at_s=anchor_s + 600)
    journal.close()


def test_eta_by_the_plan_has_its_interval_and_eta_by_the_pace_its_own(tmp_path, monkeypatch, capsys):
    make_planned_run(tmp_path / "r1", anchor_s=NOW - 1800)
    frozen_clock(monkeypatch)
    assert main(["status", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    # Plan made at 600 s for 5400 s: 4800 s left then, scaled by W/W_hi = 0.8 (expected) and
    # (2W - W_hi)/W_hi = 0.6 (low): ends at 4440 s and 3480 s; now is 1800 s.
    end = datetime.fromtimestamp(NOW + 2640, timezone.utc).strftime("%H:%M UTC")
    assert f"eta    in 44m00s (90% interval 28m00s-1h00m), around {end} by the last plan" in out
    # 4 done in the last 15 minutes, 6 left: 6 x 900 / 4 = 1350 s; Poisson noise
    # 1.645 x sqrt(4) = 3.29: 6 x 900 / 7.29 = 741 s, 6 x 900 / 0.71 = 7606 s (2h06m46s).
    assert "pace   4 done in the last 15m00s: 6 left take 22m30s at that pace (90% interval 12m21s-2h06m)" in out
    assert "wall time" not in out  # time scale 1


def test_a_dry_run_view_is_in_run_time_and_says_the_wall_time(tmp_path, monkeypatch, capsys):
    # At time scale 60, 30 wall seconds are 1800 run seconds: the same journal figures.
    make_planned_run(tmp_path / "r1", anchor_s=NOW - 30, scale=60.0)
    frozen_clock(monkeypatch)
    assert main(["status", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "started 30m00s ago (run time: 60x the wall clock)" in out
    end = datetime.fromtimestamp(NOW + 2640 / 60, timezone.utc).strftime("%H:%M UTC")
    assert f"eta    in 44m00s (90% interval 28m00s-1h00m), around {end} by the last plan (run time; 44s of wall time)" in out
    assert main(["status", str(tmp_path / "r1"), "--json"]) == 0
    # The instance was launched at the run's start: 1800 run seconds at $3.60/h, not 30.
    assert json.loads(capsys.readouterr().out)["committed_usd"] == pytest.approx(1.80)


def test_no_pace_eta_when_nothing_finished_lately(tmp_path, monkeypatch, capsys):
    make_planned_run(tmp_path / "r1", anchor_s=NOW - 7200)  # the 4 results are 300 s old...
    frozen_clock(monkeypatch, NOW + 1200)  # ...and 1500 s by now, outside the 15-minute window
    assert main(["status", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "pace   no task finished in the last 15m00s: no ETA from the pace" in out
    assert "eta    the plan's end passed" in out  # 5400 s planned, 8400 s elapsed


def _seconds(text: str) -> float:
    """Back from format_duration: 3d04h, 2h05m, 14m30s, 45s."""
    m = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert m and text, text
    d, h, mi, sec = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + sec


ETA_LINE = re.compile(r"^eta    in (\S+) \(90% interval (\S+)-(\S+)\), around \d\d:\d\d UTC by the last plan "
                      r"\(run time; (\S+) of wall time\)$", re.M)


def test_status_of_a_real_dry_run_while_it_runs(tmp_path):
    """``broker status`` against the journal of a real ``broker run --dry-run`` in progress:
    the ETA comes from the run's own last plan.solved, the fleet from its instances."""
    bag = tmp_path / "bag.yaml"
    bag.write_text('name: slow\ncommand: "sleep {t} # {seed}"\nsweep:\n  t: [0.5, 0.6, 0.7, 0.8]\n'
                   "  seed: {range: [1, 16]}\ntimeout: 30s\nretries: 1\n")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", "--budget", "1", "--inventory",
         str(REPO / "deploy" / "inventory.example.yaml"), str(bag), "--run-dir", str(run_dir)],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    seen = None
    try:
        deadline = time.monotonic() + 120
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            if (run_dir / JOURNAL_FILE).exists():
                try:
                    with Journal.open(run_dir, readonly=True) as journal:
                        view = status_cli.snapshot(journal, time.time())
                except Exception:  # noqa: BLE001 - the journal may be half-created at first
                    view = None
                if view is not None and view.overview.run is not None and view.overview.run.state == "running":
                    text = status_cli.render(view, run_dir)
                    if ETA_LINE.search(text) and any(i.state == "running" for i in view.overview.fleet):
                        seen = (view, text)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], cwd=REPO, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True)
    assert proc.returncode == 0, err[-3000:]
    assert seen is not None, "never saw the run running with a plan and a running instance"
    view, text = seen
    mid, low, high, wall = (_seconds(x) for x in ETA_LINE.search(text).groups())
    assert low <= mid <= high, text
    assert abs(wall - mid / 60) <= 1  # the dry run's default time scale
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    makespans = [e["makespan_s"] for e in events if e["event"] == "plan.solved"]
    assert view.figures.planned_makespan_s in makespans
    shown = 1 if high < 3600 else 60  # format_duration shows seconds below an hour, minutes above
    assert abs(high - (view.figures.planned_makespan_s - view.figures.elapsed_s)) <= shown
    for inst in view.overview.fleet:
        if inst.state != "terminated":
            row = next(line for line in text.splitlines() if line.strip().startswith(inst.id))
            assert inst.type_name in row and inst.state in row
    assert re.search(r"^spend  \$\d+\.\d\d committed of \$1\.00 budget", text, re.M)
    # Once it has ended: no ETA, every instance terminated.
    with Journal.open(run_dir, readonly=True) as journal:
        final = status_cli.render(status_cli.snapshot(journal, time.time()), run_dir)
    assert ": finished," in final and "eta " not in final and "pace " not in final
    assert re.search(r"^fleet  0 alive, [1-9]\d* terminated$", final, re.M)
