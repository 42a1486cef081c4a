"""The console as a person meets it: `broker run` on a real terminal (tmux), and the event log
that keeps every event whatever the console shows."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog

from broker.shells.logging import configure_logging

REPO = Path(__file__).resolve().parents[1]
BAR = re.compile("[━╸╺]")
# A console log line (`02:18:59 info    instance.launch ...`), a summary line, the plan line.
LOG = re.compile(r"\b\d\d:\d\d:\d\d (debug|info|warning|error|critical|sampling|running)\b|\bplan: makespan")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
@pytest.mark.parametrize("tty", [True, False])
def test_the_event_file_gets_every_event_at_every_console_level(level, tty):
    """Regression: `--log-level warning` left events.jsonl empty (the level filtered the file too)."""
    console, record = (_Terminal() if tty else io.StringIO()), io.StringIO()
    configure_logging(level=level, stream=console, extra_files=[record], bind={"run_id": "r-1"})
    log = structlog.get_logger()
    log.debug("task.start", task="t1", attempt=1, node="n", slot=0, cause="dispatch")
    log.info("task.done", task="t1", attempt=1, node="n", runtime_s=1.0, exit_code=0, runtime_ref_s=1.0)
    log.info("instance.launch", instance_id="i-1", type="m5.large", cause="plan", launched_at_s=0.0, boot_s=5.0)
    log.warning("task.failed", task="t2", attempt=1, node="n", error="exit code 1", stderr_tail="", final=False,
                retries_left=1)
    configure_logging(level="info")
    assert [json.loads(line)["event"] for line in record.getvalue().splitlines()] == [
        "task.start", "task.done", "instance.launch", "task.failed"]
    shown = console.getvalue()
    assert ("task.failed" in shown) is (level in ("debug", "info", "warning"))
    assert ("instance.launch" in shown) is (level in ("debug", "info"))
    # Per-task lines reach a terminal only at debug; off a terminal, every line at the level.
    assert ("task.done" in shown) is (level == "debug" or (level == "info" and not tty))
    assert ("task.start" in shown) is (level == "debug")


def test_a_real_run_at_log_level_warning_keeps_every_event_in_its_file(tmp_path):
    bag = tmp_path / "bag.yaml"
    bag.write_text("command: 'true {i}'\nsweep:\n  i: {range: [0, 6]}\ntimeout: 30s\n")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("private:\n  - {name: here, local: true, slots: 2}\n")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "broker", "--log-level", "warning", "run", "--dry-run", "--yes",
                           "--inventory", str(inventory), str(bag), "--run-dir", str(run_dir)],
                          env=_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names.count("task.done") == 6 and names.count("task.start") >= 6
    assert {"run.start", "run.done", "run.report"} <= set(names)
    assert "task.done" not in done.stderr  # the console kept to warnings


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_a_10000_task_run_on_a_terminal_keeps_bars_and_log_lines_apart(tmp_path):
    """`broker run` on a terminal: log lines above the bars, never through them (regression:
    `...1/40 done, $0.00 committed2026-11-24T00:09:59Z [info] task.start...`), and a
    10,000-task run prints fewer than 200 lines at the default level (it printed 3 a task)."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed")
        pytest.skip("tmux is not installed")
    bag = tmp_path / "bag.yaml"
    bag.write_text("command: 'true {i}'\nsweep:\n  i: {range: [0, 10000]}\ntimeout: 30s\nretries: 1\n")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("private:\n  - {name: here, local: true, slots: 32}\n")
    run_dir, status = tmp_path / "run", tmp_path / "exit"
    command = (f"cd {tmp_path} && PYTHONPATH={REPO} {sys.executable} -m broker run --dry-run --yes "
               f"--inventory {inventory} {bag} --run-dir {run_dir} --time-scale 600; echo $? > {status}; sleep 300")
    session = f"broker-console-{os.getpid()}"
    _tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "45", command)
    try:
        deadline = time.monotonic() + 600
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(1)
        screen = _tmux("capture-pane", "-p", "-t", session, "-S", "-", "-E", "-")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert status.exists(), f"the run did not end in time:\n{screen[-3000:]}"
    assert status.read_text().strip() == "0", screen[-3000:]
    lines = [line for line in screen.splitlines() if line.strip()]
    mixed = [line for line in lines if BAR.search(line) and LOG.search(line)]
    assert mixed == [], mixed
    assert any(BAR.search(line) for line in lines), "no progress bar was drawn"
    assert any(LOG.search(line) for line in lines), "no log line reached the terminal"
    print(f"\n{len(lines)} non-blank lines on the terminal for 10,000 tasks; "
          f"{sum(bool(BAR.search(line)) for line in lines)} hold a bar, none with a log line")
    assert len(lines) < 200, f"{len(lines)} lines:\n" + "\n".join(lines[:60])
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events.count("task.done") == 10000  # the record keeps every task


def test_write_event_masks_and_encodes_once_for_the_file_the_console_and_the_journal(monkeypatch):
    """Issue 20: a per-task event was rendered three times and masked twice. write_event masks
    it once and encodes it once: the same line goes to events.jsonl and (off a terminal) the
    console, and the same fields JSON is what the journal stores."""
    from broker.shells import logging as blog
    from broker.shells.logging import register_secret, write_event

    calls = []
    for masker in ("mask_secrets", "_mask_flat"):  # the structlog chain's and write_event's pass
        real = getattr(blog, masker)
        monkeypatch.setattr(blog, masker,  # count the passes over a whole event (not the recursion)
                            lambda value, real=real: (isinstance(value, dict) and "task" in value and calls.append(1))
                            or real(value))
    register_secret("tok-0123456789-write-once")
    console, record = io.StringIO(), io.StringIO()
    configure_logging(level="info", stream=console, json=True, extra_files=[record], bind={"run_id": "r-1"})
    try:
        stored = write_event("task.failed", {"task": "t1", "attempt": 1, "node": "n", "error": "exit code 1",
                                             "stderr_tail": "token tok-0123456789-write-once leaked",
                                             "final": False, "retries_left": 1, "lost": False, "api_token": "x"},
                             level="warning", context={"run_id": "r-1"})
        quiet = write_event("task.start", {"task": "t1", "attempt": 1, "node": "n", "slot": 0, "cause": "dispatch"},
                            level="debug", context={"run_id": "r-1"})
    finally:
        configure_logging(level="info")
    assert len(calls) == 2  # one masking pass per event (the structlog chain was not run as well)
    lines = record.getvalue().splitlines()
    assert console.getvalue().splitlines() == lines[:1]  # debug: in the file only; the same line
    line = json.loads(lines[0])
    assert line["stderr_tail"] == "token *** leaked" and line["api_token"] == "***"
    assert {line[k] for k in ("event", "level", "run_id")} == {"task.failed", "warning", "r-1"}
    assert "timestamp" in line
    assert json.loads(stored) == {k: v for k, v in line.items() if k not in ("event", "level", "run_id", "timestamp")}
    assert json.loads(quiet)["cause"] == "dispatch" and json.loads(lines[1])["event"] == "task.start"


def test_write_event_goes_through_structlog_when_another_set_up_is_in_force():
    """capture_logs (tests) or a tool's own set-up: write_event must not bypass it."""
    from structlog.testing import capture_logs

    from broker.shells.logging import write_event

    configure_logging(level="info", stream=io.StringIO(), json=True)
    try:
        with capture_logs() as logs:
            stored = write_event("task.done", {"task": "t9", "password": "hunter2hunter2"}, context={"run_id": "r"})
    finally:
        configure_logging(level="info")
    assert [(e["event"], e["task"], e["password"], e["run_id"]) for e in logs] == [("task.done", "t9", "***", "r")]
    assert json.loads(stored) == {"password": "***", "task": "t9"}


def test_held_events_write_a_turns_lines_after_it_in_order_and_a_structlog_line_keeps_its_place():
    """Issue 20: the daemon's loop holds a turn's per-task lines until its acks and new work
    are sent. Nothing may be lost or reordered: the held lines are written, in order, when the
    block ends, and a line logged through structlog meanwhile first writes what is held."""
    import structlog

    from broker.shells.logging import held_events, write_event

    console, record = io.StringIO(), io.StringIO()
    configure_logging(level="info", stream=console, json=True, extra_files=[record], bind={"run_id": "r-2"})
    try:
        with held_events():
            write_event("task.start", {"task": "t1", "attempt": 1, "node": "n", "slot": 0, "cause": "dispatch"})
            assert record.getvalue() == "" and console.getvalue() == ""  # held
            structlog.get_logger().warning("dispatch.refused", task="t2", node="n", slot=1, reason="busy")
            assert [json.loads(x)["event"] for x in record.getvalue().splitlines()] == ["task.start", "dispatch.refused"]
            with held_events():  # nested: the outer block writes
                write_event("task.done", {"task": "t1", "attempt": 1, "node": "n", "runtime_s": 0.1, "exit_code": 0,
                                          "runtime_ref_s": 0.1})
            write_event("task.start", {"task": "t3", "attempt": 1, "node": "n", "slot": 0, "cause": "dispatch"},
                        level="debug")
            assert len(record.getvalue().splitlines()) == 2
    finally:
        configure_logging(level="info")
    lines = [json.loads(x) for x in record.getvalue().splitlines()]
    assert [(x["event"], x.get("task")) for x in lines] == [
        ("task.start", "t1"), ("dispatch.refused", "t2"), ("task.done", "t1"), ("task.start", "t3")]
    assert all(x["run_id"] == "r-2" and x["timestamp"].endswith("Z") for x in lines)
    assert [json.loads(x) for x in console.getvalue().splitlines()] == lines[:3]  # debug: the file only
    assert lines == sorted(lines, key=lambda x: x["timestamp"])  # each keeps the time it was logged at
