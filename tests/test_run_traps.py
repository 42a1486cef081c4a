"""Small traps of `broker run`, each refused by name (exit 2, nothing left behind) or fixed:
a --run-dir that is a file, a --metrics-port in use, --budget inf, a run directory another
broker runs, the launch question hidden by `2>log`, short bags that looked infeasible."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.cli import main
from broker.shells.runlock import hold, holder

REPO = Path(__file__).resolve().parent.parent
INVENTORY = str(REPO / "inventory.yaml")
SWEEP = str(REPO / "examples" / "sweep.yaml")


def _run(*extra: str) -> list[str]:
    return ["run", "--dry-run", "--yes", "--inventory", INVENTORY, SWEEP, *extra]


def test_a_run_dir_that_is_a_file_is_refused_by_name(tmp_path, capsys):
    """Regression: a traceback."""
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    assert main(_run("--run-dir", str(target))) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert target.read_text() == "x"


def test_a_metrics_port_in_use_leaves_no_run_directory(tmp_path, capsys):
    """Regression: the run directory (events.jsonl, a moto server) was made before the port
    was found taken, and left behind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run_dir = tmp_path / "run"
        assert main(_run("--run-dir", str(run_dir), "--metrics-port", str(port))) == 2
    assert f"--metrics-port {port}: cannot listen" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize("flag, value", [("--budget", "inf"), ("--budget", "nan"), ("--point", "inf"),
                                         ("--theta", "nan")])
def test_non_finite_goals_are_refused(flag, value, tmp_path, capsys):
    """Regression: `--budget inf` ran and wrote "goal_value": Infinity into events.jsonl."""
    assert main(_run("--run-dir", str(tmp_path / "run"), flag, value)) == 2
    assert f"{flag}: must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_event_log_is_strict_json_even_with_an_infinite_field():
    import io

    import structlog

    from broker.shells.logging import configure_logging

    record = io.StringIO()
    configure_logging(stream=io.StringIO(), extra_files=[record])
    structlog.get_logger().info("instance.release_scheduled", instance_id="i-1", at_s=float("inf"),
                                paid_until_s=3600.0, cause="plan")
    configure_logging()
    text = record.getvalue()
    assert "Infinity" not in text and json.loads(text)["at_s"] is None


def test_a_run_directory_another_broker_runs_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert holder(run_dir) is None
    with hold(run_dir):
        assert holder(run_dir)["pid"] == os.getpid()
        assert main(_run("--run-dir", str(run_dir))) == 2
        assert "is being run by another broker" in capsys.readouterr().err
    assert holder(run_dir) is None
    assert not (run_dir / "journal.sqlite").exists()


def test_a_short_bag_is_planned_in_seconds_and_a_deadline_a_private_node_meets_is_feasible(capsys):
    """Regression: a fixed 300 s packing allowance planned `--tasks 10 --mean-runtime 1s` at
    5m04s and called a 2-minute deadline infeasible."""
    assert main(["plan", "--inventory", INVENTORY, "--tasks", "10", "--mean-runtime", "1s", "--json"]) == 0
    front = json.loads(capsys.readouterr().out)["front"]
    assert max(p["makespan_s"] for p in front) < 60
    assert main(["plan", "--inventory", INVENTORY, "--tasks", "10", "--mean-runtime", "1s", "--deadline", "2m",
                 "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["chosen"]
    assert chosen["makespan_s"] <= 120 and chosen["cost_usd"] == 0.0 and chosen["fleet"] == {}


@pytest.mark.slow
def test_the_launch_question_is_asked_on_the_terminal_not_on_stderr(tmp_path):
    """Regression: the question went to stderr (input()'s prompt), invisible with `2>log`."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed")
        pytest.skip("tmux is not installed")
    err, status = tmp_path / "err.log", tmp_path / "exit"
    command = (f"cd {tmp_path} && PYTHONPATH={REPO} {sys.executable} -m broker run --dry-run --inventory {INVENTORY} "
               f"{SWEEP} --deadline 4m --run-dir {tmp_path / 'run'} 2>{err}; echo $? > {status}; sleep 300")
    session = f"broker-question-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "45", command], check=True)
    try:
        screen = ""
        deadline = time.monotonic() + 240
        while "Launch " not in screen and time.monotonic() < deadline and not status.exists():
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
        assert "Launch " in screen and "[y/N]" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "n", "Enter"], check=True)
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert status.read_text().strip() == "1"  # declined
    assert "Launch " not in err.read_text()
