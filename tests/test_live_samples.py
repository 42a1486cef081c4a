"""``broker run --samples FILE``: the samples of ``broker plan --sample`` are not taken again."""

from __future__ import annotations

import json

from broker.cli import main
from tests.test_dryrun import broker, events, query, run_dir  # noqa: F401 - run_dir is a fixture

INVENTORY = """
private:
  - {name: lab, local: true, slots: 8, speed: 2}
aws:
  billing: hourly
  types:
    - {name: small, slots: 1, speed: 1, price: 0.08, limit: 3}
"""


def files(tmp_path):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "tasks.txt").write_text("".join(f"sleep {s}\n" for s in [0.02, 0.04, 0.06] * 20))
    (tmp_path / "bag.yaml").write_text("tasks_file: tasks.txt\ntimeout: 2s\n")
    return str(tmp_path / "inventory.yaml"), str(tmp_path / "bag.yaml")


def test_run_counts_the_planned_samples_done_and_does_not_sample_again(tmp_path, run_dir, capsys):  # noqa: F811
    inventory, bag = files(tmp_path)
    plan_dir = tmp_path / "plan"
    assert main(["plan", bag, "--inventory", inventory, "--run-dir", str(plan_dir), "--sample", "bats",
                 "--eps", "0.5", "--delta", "0.1", "--json"]) == 0
    capsys.readouterr()
    samples = json.loads((plan_dir / "samples.json").read_text())
    sampled_done = {task for task, r in samples["tasks"].items() if r["done"]}
    assert len(sampled_done) >= 30

    done = broker("run", "--dry-run", "--yes", "--json-report", "--inventory", inventory, bag,
                  "--run-dir", str(run_dir), "--samples", str(plan_dir / "samples.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["tasks"] == {"total": 60, "done": 60, "failed": 0, "left": 0}
    started = {e["task"] for e in events(run_dir, "task.start")}
    assert started and not (started & sampled_done)  # no sampled task ran again ...
    assert len(started) == 60 - len(sampled_done)  # ... and every other one ran
    assert not [e for e in events(run_dir, "task.start") if e["cause"] == "sampling"]  # no second sampling phase
    adopted = events(run_dir, "sample.adopted")
    assert len(adopted) == 1 and adopted[0]["tasks_done"] == len(sampled_done)
    assert adopted[0]["mean_ref_s"] == round(samples["estimate"]["mean_ref_s"], 3) and adopted[0]["rule"] == "bats"
    # The journal holds the sampled tasks as done, on the node and in the draw order plan used.
    rows = query(run_dir, "SELECT t.id, t.state, t.sample_order, a.node FROM tasks t JOIN attempts a "
                          "ON a.task_id = t.id WHERE t.sample_order IS NOT NULL ORDER BY t.sample_order")
    assert {r[0] for r in rows} == sampled_done and {r[1] for r in rows} == {"done"} and {r[3] for r in rows} == {"lab"}
    by_draw = sorted(sampled_done, key=lambda t: samples["tasks"][t]["draw"])
    assert [r[0] for r in rows] == by_draw
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state") == [("done", 60)]


def test_samples_from_another_bag_are_refused_before_anything_starts(tmp_path, run_dir):  # noqa: F811
    inventory, bag = files(tmp_path)
    (tmp_path / "samples.json").write_text(json.dumps({"estimate": None, "tasks": {
        "t000001": {"node": "lab", "attempt": 1, "draw": 1, "runtime_s": 0.1, "runtime_ref_s": 0.2,
                    "exit_code": 0, "timed_out": False, "used": True, "done": True},
        "t000099": {"node": "lab", "attempt": 1, "draw": 2, "runtime_s": 0.1, "runtime_ref_s": 0.2,
                    "exit_code": 0, "timed_out": False, "used": True, "done": True}}}))
    done = broker("run", "--dry-run", "--yes", "--inventory", inventory, bag, "--run-dir", str(run_dir),
                  "--samples", str(tmp_path / "samples.json"))
    assert done.returncode == 2
    assert f"--samples {tmp_path / 'samples.json'}: 1 task not in the bag {bag} (t000099): were the samples " \
           "taken from another bag?" in done.stderr
    assert not (run_dir / "journal.sqlite").exists()
    (tmp_path / "samples.json").write_text("{not json")
    done = broker("run", "--dry-run", "--yes", "--inventory", inventory, bag, "--run-dir", str(run_dir),
                  "--samples", str(tmp_path / "samples.json"))
    assert done.returncode == 2 and "not JSON (line 1" in done.stderr
