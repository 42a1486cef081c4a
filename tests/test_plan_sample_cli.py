"""``broker plan BAG --sample RULE``: runs sampled tasks on the local node, then plans the rest."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from broker.cli import main
from broker.cli.plan import SamplingProgressView, expectation_lines
from broker.shells.local_transport import local_agent_pid
from broker.shells.sampling_runner import SampleProgress

INVENTORY = """
private:
  - {name: lab, local: true, slots: 8, speed: 2}
aws:
  billing: hourly
  types:
    - {name: small, slots: 1, speed: 1, price: 0.08, limit: 3}
"""


@pytest.fixture
def files(tmp_path):
    """An inventory, a 60-task bag of short sleeps, and a run dir that must end with no agent."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    sleeps = [0.02, 0.04, 0.06] * 20
    (tmp_path / "tasks.txt").write_text("".join(f"sleep {s}\n" for s in sleeps))
    bag = tmp_path / "bag.yaml"
    bag.write_text("tasks_file: tasks.txt\ntimeout: 2s\n")
    run_dir = tmp_path / "run"
    yield {"inventory": str(inventory), "bag": str(bag), "run_dir": run_dir, "tmp": tmp_path}
    assert local_agent_pid(run_dir / "agents" / "lab") is None, "the local agent outlived the command"


def plan(files, *extra: str) -> int:
    return main(["plan", files["bag"], "--inventory", files["inventory"], "--run-dir", str(files["run_dir"]),
                 *extra])


def test_json_is_one_object_with_the_sample_and_the_remaining_tasks(files, capsys):
    rc = plan(files, "--sample", "bats", "--eps", "0.5", "--delta", "0.1", "--theta", "0.5", "--json")
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    document = json.loads(captured.out)  # fails unless stdout is exactly one JSON document
    assert set(document) == {"work", "front", "cheapest", "chosen", "promise", "solve_ms", "sample"}
    sample = document["sample"]
    assert set(sample) == {"rule", "samples", "mean_ref_s", "eps", "delta", "capped", "exact"}
    assert sample["rule"] == "bats" and sample["samples"] == 30
    assert (sample["eps"], sample["delta"], sample["capped"]) == (0.5, 0.1, 0)
    # sleeps average 0.04 s on a speed-2 node: 0.08 reference seconds, plus process start-up
    assert 0.06 <= sample["mean_ref_s"] <= 0.2

    record = json.loads((files["run_dir"] / "samples.json").read_text())
    done = [task for task, r in record["tasks"].items() if r["done"]]
    assert len(done) >= 30 and sum(r["used"] for r in record["tasks"].values()) == 30
    assert document["work"]["tasks"] == 60 - len(done)
    assert document["work"]["mean_ref_s"] == sample["mean_ref_s"]
    assert record["estimate"]["mean_ref_s"] == sample["mean_ref_s"]
    assert "samples:" in captured.err and "planning the other" in captured.err


def test_table_says_what_sampling_costs_and_did_before_the_front(files, capsys):
    rc = plan(files, "--sample", "bats", "--eps", "0.5", "--delta", "0.1")
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("sampling with bats (eps 0.5, delta 0.1)")
    assert lines[1].strip() == "samples: 30 of 60 tasks (fixed by BaTS's formula)"
    summary = next(i for i, line in enumerate(lines) if line.startswith("sampled: mean"))
    work = next(i for i, line in enumerate(lines) if line.startswith("work:"))
    assert summary < work
    assert "tasks done while sampling" in out and "small (hourly)" in out


def test_a_failing_bag_stops_with_the_task_and_its_stderr(files, capsys):
    (files["tmp"] / "tasks.txt").write_text("echo 'model.bin: not found' >&2; exit 4\n" * 20)
    rc = plan(files, "--sample", "ebstop", "--eps", "0.3", "--json")
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.out == ""
    assert "sampled tasks failed" in captured.err and "model.bin: not found" in captured.err
    assert "exit code 4" in captured.err and "task t0000" in captured.err
    record = json.loads((files["run_dir"] / "samples.json").read_text())
    assert record["estimate"] is None and len(record["failures"]) == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--eps", "1.5"], "--eps: must lie strictly between 0 and 1"),
        (["--tasks", "10"], "drop --tasks"),
    ],
)
def test_bad_sampling_flags_exit_2_before_anything_runs(files, capsys, flags, message):
    rc = plan(files, "--sample", "ebstop", *flags)
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not files["run_dir"].exists()


def test_an_inventory_without_private_nodes_cannot_sample(files, capsys):
    Path(files["inventory"]).write_text("aws:" + INVENTORY.split("aws:")[1])
    rc = plan(files, "--sample", "ebstop")
    assert rc == 2
    assert "declares no private node" in capsys.readouterr().err


def test_an_unusable_ssh_node_is_named_before_any_task_runs(files, capsys):
    missing_key = files["tmp"] / "no-such-key"
    Path(files["inventory"]).write_text(INVENTORY.replace("local: true", f"host: 127.0.0.1, key: {missing_key}"))
    rc = plan(files, "--sample", "ebstop")
    err = capsys.readouterr().err
    assert rc == 1
    assert "cannot start the agent on lab" in err and "no-such-key" in err


def test_a_default_run_dir_is_new_under_runs(files, capsys, monkeypatch):
    monkeypatch.chdir(files["tmp"])
    rc = main(["plan", files["bag"], "--inventory", files["inventory"], "--sample", "bats", "--eps", "0.5",
               "--delta", "0.1", "--json"])
    assert rc == 0
    made = list((files["tmp"] / "runs").glob("plan-*"))
    assert len(made) == 1 and (made[0] / "samples.json").exists()
    assert local_agent_pid(made[0] / "agents" / "lab") is None
    json.loads(capsys.readouterr().out)


def test_a_loose_timeout_is_pointed_out_with_the_samples_a_tighter_one_saves():
    loose = expectation_lines("aa", 0.1, 0.05, 3600.0, 10_000, 60.0, 10.0)
    assert "the timeout is loose: with timeout 2m00s" in loose
    now = int(loose.split("expected samples: ~")[1].split()[0])
    tighter = int(loose.split("sampling would take ~")[1].split()[0])
    assert tighter < now / 10  # AA's count scales with R_max / mean: 30x looser here
    tight = expectation_lines("aa", 0.1, 0.05, 150.0, 10_000, 60.0, 10.0)
    assert "loose" not in tight
    unknown = expectation_lines("ebstop-geo", 0.1, 0.05, 3600.0, 10_000, None, None)
    assert "if tasks take about half the timeout" in unknown and "give --mean-runtime" in unknown


def test_no_agent_process_is_left_behind(files, capsys):
    plan(files, "--sample", "bats", "--eps", "0.5", "--delta", "0.1", "--json")
    capsys.readouterr()
    mark = os.fsencode(f"BROKER_AGENT_DIR={files['run_dir'] / 'agents' / 'lab'}")
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                alive.append(entry.name)
        except OSError:
            continue
    assert not alive


def test_a_run_dir_that_already_holds_agents_is_refused(files, capsys):
    assert plan(files, "--sample", "bats", "--eps", "0.5", "--delta", "0.1", "--json") == 0
    capsys.readouterr()
    assert plan(files, "--sample", "bats", "--eps", "0.5", "--delta", "0.1", "--json") == 2
    assert "holds the agents of an earlier run" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_rewritten_on_a_terminal_and_events_otherwise(monkeypatch):
    reports = [SampleProgress(completed=k, running=3, mean_ref_s=1.0 + k / 100, sd_ref_s=0.5, failures=0)
               for k in range(1, 26)] + [SampleProgress(25, 0, 1.25, 0.5, 0, finished=True)]

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    view = SamplingProgressView("ebstop", 0.1, 0.05, 10.0, 1000)
    for report in reports:
        view(report)
    text = terminal.getvalue()
    last = text.rsplit("\r", 1)[-1]
    assert "sampling" in last and "━" in last and "25 " in last and "0 running, mean so far 1.25s" in last
    assert view.expected is not None and view.expected > 25  # what the bar showed as its total while it ran

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with capture_logs() as events:
        view = SamplingProgressView("ebstop", 0.1, 0.05, 10.0, 1000)
        for report in reports:
            view(report)
    progress = [e for e in events if e["event"] == "sample.progress"]
    assert [e["completed"] for e in progress] == [10, 20]
    assert all(e["expected_samples"] > e["completed"] for e in progress)
