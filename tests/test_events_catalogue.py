"""The event catalogue (broker/shells/events.py) against a real dry run's events.jsonl and the README,
and the console/JSON rendering of the log."""

from __future__ import annotations

import io
import json
from pathlib import Path

import structlog

from broker.shells.events import CATALOGUE, markdown_table, problems
from broker.shells.logging import configure_logging

REPO = Path(__file__).resolve().parent.parent

# What a dry run that samples, rents an instance, retries a failing task and ends must write.
EXPECTED_IN_RUN = {
    "run.start", "agent.attached", "node.ready", "task.start", "task.done", "task.failed", "sample.done",
    "plan.solved", "aws.run_instances", "instance.launch", "instance.ready", "instance.release_scheduled",
    "aws.terminate_instances", "instance.terminated", "run.done", "metrics.serving",
}


def test_every_line_is_catalogued_with_its_fields_and_the_run_id(observed_dry_run):
    lines = observed_dry_run.events()
    assert len(lines) > 50
    run_id = lines[0]["run_id"]
    found = [(e["event"], p) for e in lines for p in problems(e, in_run=True)]
    assert found == []
    assert {e["run_id"] for e in lines} == {run_id}
    assert observed_dry_run.run_dir.name != run_id  # the id is the run's, not the directory's name


def test_every_event_the_run_should_produce_appears(observed_dry_run):
    assert EXPECTED_IN_RUN <= set(CATALOGUE)
    seen = {e["event"] for e in observed_dry_run.events()}
    assert EXPECTED_IN_RUN - seen == set()


def test_events_carry_the_instance_or_task_they_are_about(observed_dry_run):
    lines = observed_dry_run.events()
    launched = {e["instance_id"] for e in lines if e["event"] == "instance.launch"}
    assert launched
    for e in lines:
        if e["event"].startswith("instance."):
            assert e["instance_id"] in launched, e
        if e["event"].startswith("task."):
            assert e["task"].startswith("t0"), e
    failed = [e for e in lines if e["event"] == "task.failed"]
    assert [e["attempt"] for e in failed] == [1, 2] and [e["final"] for e in failed] == [False, True]
    assert {e["error"] for e in failed} == {"exit code 3"} and "boom" in failed[-1]["stderr_tail"]


def test_the_checker_flags_unknown_events_missing_and_undocumented_fields():
    good = {"event": "run.stop", "level": "info", "timestamp": "t", "run_id": "r", "reason": "user_stop"}
    assert problems(good, in_run=True) == []
    assert problems({**good, "event": "run.exploded"}, in_run=True) == [
        "event 'run.exploded' is not in the catalogue (broker/shells/events.py)"]
    missing = dict(good)
    del missing["run_id"], missing["reason"]
    assert problems(missing, in_run=True) == ["event 'run.stop' lacks run_id, reason"]
    assert problems({**good, "colour": "red"}, in_run=True) == ["event 'run.stop' has undocumented fields colour"]
    assert problems(good, in_run=False) == ["event 'run.stop' is not documented as written outside a run"]


def test_readme_holds_exactly_the_catalogue_table():
    readme = (REPO / "README.md").read_text()
    assert markdown_table() in readme, "regenerate the README table: python3 -m broker.shells.events"
    for name in CATALOGUE:
        assert f"| `{name}` |" in readme


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_lines_on_a_terminal_json_lines_otherwise_and_the_file_always_json():
    tty, pipe, file = _Terminal(), io.StringIO(), io.StringIO()
    configure_logging(stream=tty, extra_files=[file], bind={"run_id": "r-1"})
    structlog.get_logger().info("run.stop", reason="user_stop", api_token="hunter2")
    configure_logging(stream=pipe, bind={"run_id": "r-1"})
    structlog.get_logger().info("run.stop", reason="user_stop")
    console = tty.getvalue()
    assert "run.stop" in console and "reason" in console and "user_stop" in console
    assert not console.lstrip().startswith("{")
    assert "hunter2" not in console and "hunter2" not in file.getvalue()
    for text in (file.getvalue(), pipe.getvalue()):
        line = json.loads(text.strip())
        assert line["event"] == "run.stop" and line["run_id"] == "r-1" and line["reason"] == "user_stop"


def test_a_bound_run_id_does_not_override_an_events_own():
    pipe = io.StringIO()
    configure_logging(stream=pipe, bind={"run_id": "r-1"})
    structlog.get_logger().info("run.stop", reason="x", run_id="r-2")
    assert json.loads(pipe.getvalue())["run_id"] == "r-2"
