"""A bag's ``outputs``: fetched from the node into ``RUN_DIR/outputs/<task>/`` after success."""

from __future__ import annotations

import json

import pytest

from broker.config.bag import output_path, parse_bag
from broker.config.errors import ConfigError
from tests.test_dryrun import broker, events, run_dir  # noqa: F401 - run_dir is a fixture

LOCAL_ONLY = "private:\n  - {name: local, local: true, slots: 2}\n"

BAG = """\
command: "test {i} = 3 || (mkdir -p res-{i}/sub && echo a{i} > res-{i}/a.txt && echo b > res-{i}/sub/b.txt)"
sweep:
  i: [1, 2, 3, 4]
timeout: 10s
workdir: WORKDIR
outputs: "res-{i}"
"""


def test_outputs_are_copied_into_the_run_directory_and_a_missing_one_is_reported(tmp_path, run_dir):  # noqa: F811
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "inv.yaml").write_text(LOCAL_ONLY)
    (tmp_path / "bag.yaml").write_text(BAG.replace("WORKDIR", str(work)))
    done = broker("run", "--dry-run", "--yes", "--json-report", "--inventory", str(tmp_path / "inv.yaml"),
                  str(tmp_path / "bag.yaml"), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["tasks"]["done"] == 4  # a missing output does not fail its task
    for task, i in (("t000001", 1), ("t000002", 2), ("t000004", 4)):
        out = run_dir / "outputs" / task / f"res-{i}"
        assert (out / "a.txt").read_text() == f"a{i}\n" and (out / "sub" / "b.txt").read_text() == "b\n"
    fetched = {e["task"]: e for e in events(run_dir, "task.outputs")}
    assert set(fetched) == {"t000001", "t000002", "t000004"}
    assert fetched["t000001"]["files"] == 2 and fetched["t000001"]["bytes"] == len("a1\nb\n")
    failed = events(run_dir, "task.outputs_failed")
    assert [e["task"] for e in failed] == ["t000003"]
    assert failed[0]["path"] == "res-3" and f"{work / 'res-3'} does not exist" in failed[0]["error"]
    assert not (run_dir / "outputs" / "t000003").exists()


def test_outputs_template_is_checked_against_the_sweep() -> None:
    bag = parse_bag("command: 'echo {x}'\nsweep: {x: [1, 2]}\ntimeout: 1s\noutputs: 'out/{task}-{x}.txt'\n")
    assert [output_path(bag, t) for t in bag.tasks] == ["out/t000001-1.txt", "out/t000002-2.txt"]
    with pytest.raises(ConfigError) as exc:
        parse_bag("command: 'echo {x}'\nsweep: {x: [1]}\ntimeout: 1s\noutputs: '$OUT/{y}'\n", "bag.yaml")
    assert [p.render() for p in exc.value.problems] == [
        "bag.yaml:4: outputs: placeholder {y} is neither {task} nor a sweep parameter (expected one of: task, x)",
        "bag.yaml:4: outputs: environment variables are not expanded in outputs (they are in workdir): use a "
        "path relative to workdir, an absolute one, or ~/",
    ]
