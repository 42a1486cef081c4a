"""Bag loading: the example bags, sweep expansion, task files, CSV estimates."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config.bag import load_bag, parse_bag
from broker.config.errors import ConfigError
from broker.core.model import Task

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def rendered(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [p.render() for p in exc.value.problems]


# -- the shipped examples -----------------------------------------------------------------
def test_sweep_example_is_forty_quick_tasks_with_their_parameters():
    bag = load_bag(EXAMPLES / "sweep.yaml")
    assert (bag.name, len(bag), bag.timeout_s, bag.retries) == ("sweep", 40, 30.0, 2)
    assert bag.env == {"OMP_NUM_THREADS": "1"} and bag.outputs is None  # its tasks only print
    assert [t.id for t in bag.tasks] == [f"t{i:06d}" for i in range(1, 41)]
    assert all(0.05 <= t.params["t"] <= 0.5 for t in bag.tasks)
    assert {t.params["seed"] for t in bag.tasks} == {1, 2, 3, 4, 5}
    first = bag.tasks[0]
    assert f"time.sleep({first.params['t']})" in first.command and f"{first.params['seed']})" in first.command
    assert len({t.command for t in bag.tasks}) == 40


def test_commands_example_skips_comments_and_blank_lines():
    bag = load_bag(EXAMPLES / "commands.yaml")
    lines = (EXAMPLES / "commands.txt").read_text().splitlines()
    expected = [line for line in lines if line.strip() and not line.startswith("#")]
    assert [t.command for t in bag.tasks] == expected
    assert [t.id for t in bag.tasks] == [f"t{i:06d}" for i in range(1, len(expected) + 1)]
    assert bag.setup == "python3 --version" and bag.retries == 1


def test_csv_example_carries_ids_and_two_tools_estimates():
    bag = load_bag(EXAMPLES / "csv.yaml")
    assert bag.name == "csv-with-estimates" and bag.workdir == "~/broker-work"
    by_id = {t.id: t for t in bag.tasks}
    assert by_id["short-1"].estimates_s == {"model": 0.12, "user": 0.1}
    assert by_id["medium-2"].estimates_s == {"model": 0.22}  # empty cell: no guess from that tool
    assert by_id["echo"].command == 'echo "quotes are doubled inside a quoted CSV field"'
    assert len(bag) == 8


# -- sweeps -------------------------------------------------------------------------------
def test_sweep_order_first_parameter_slowest_and_value_forms():
    bag = parse_bag(
        "command: 'run {a} {b} {c:.2f}'\n"
        "sweep:\n  a: [x, y]\n  b: {range: [10, 0, -5]}\n  c: {linspace: [0, 1, 3]}\n"
        "timeout: 5m\n"
    )
    assert [t.command for t in bag.tasks] == [
        f"run {a} {b} {c:.2f}" for a, b, c in itertools.product("xy", (10, 5), (0.0, 0.5, 1.0))
    ]
    assert bag.tasks[0].params == {"a": "x", "b": 10, "c": 0.0}
    assert bag.timeout_s == 300.0 and bag.name == "bag" and bag.retries == 2


def test_linspace_values_are_exact_at_the_ends_and_free_of_float_noise():
    bag = parse_bag("command: 'x {v}'\nsweep: {v: {linspace: [0, 0.3, 4]}}\ntimeout: 1s\n")
    assert [t.command for t in bag.tasks] == ["x 0.0", "x 0.1", "x 0.2", "x 0.3"]


def test_placeholders_may_use_attributes_indices_and_nested_specs():
    bag = parse_bag("command: '{w} {x.real} {y:>{w}}'\nsweep: {x: [3], y: [ab], w: [4]}\ntimeout: 1\n")
    assert bag.tasks[0].command == "4 3 '  ab'"  # the padded value is one shell word


_values = st.one_of(st.integers(-50, 50), st.text("abcxyz", min_size=1, max_size=4))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "seed"]), st.lists(_values, min_size=1, max_size=4), min_size=1))
def test_a_sweep_makes_one_task_per_combination(sweep):
    template = " ".join(f"--{name}={{{name}}}" for name in sweep)
    bag = parse_bag(f"command: {json.dumps(template)}\nsweep: {json.dumps(sweep)}\ntimeout: 1m\n")
    combos = list(itertools.product(*sweep.values()))
    assert len(bag) == len(combos)
    for task, combo in zip(bag.tasks, combos):
        params = dict(zip(sweep, combo))
        assert task.params == params and task.command == template.format(**params)


# -- task files and CSV -------------------------------------------------------------------
def test_task_files_are_found_next_to_the_bag_not_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "list.txt").write_text("echo one\n  echo two  \n")
    (tmp_path / "sub" / "bag.yaml").write_text("tasks_file: list.txt\ntimeout: 10s\n")
    monkeypatch.chdir(ROOT)
    bag = load_bag(tmp_path / "sub" / "bag.yaml")
    assert bag.tasks == (Task("t000001", "echo one"), Task("t000002", "echo two"))
    assert bag.name == "bag" and bag.source == str(tmp_path / "sub" / "bag.yaml")
    # parse_bag looks in base_dir when given
    assert parse_bag("tasks_file: list.txt\ntimeout: 1\n", "<bag>", tmp_path / "sub").tasks == bag.tasks


def test_csv_without_id_numbers_rows_by_position_and_keeps_a_byte_order_mark_out(tmp_path):
    (tmp_path / "t.csv").write_bytes("\ufeffcommand,estimate_a\necho 1,2.5\n\necho 2,1e1\n".encode())
    bag = parse_bag("csv: t.csv\ntimeout: 1h\n", str(tmp_path / "b.yaml"))
    assert bag.tasks == (
        Task("t000001", "echo 1", estimates_s={"a": 2.5}),
        Task("t000002", "echo 2", estimates_s={"a": 10.0}),
    )


def test_csv_problems_cite_the_physical_line_after_a_multi_line_field(tmp_path):
    (tmp_path / "t.csv").write_text('id,command\na,"echo one\necho two"\na,echo three\n')
    with pytest.raises(ConfigError) as exc:
        parse_bag("csv: t.csv\ntimeout: 1h\n", str(tmp_path / "b.yaml"))
    assert rendered(exc) == [f"{tmp_path / 't.csv'}:4: id: duplicate task id 'a' (first on line 2)"]


def test_bag_and_csv_problems_are_reported_together(tmp_path):
    (tmp_path / "t.csv").write_text("command,estimate_m\necho,soon\n")
    with pytest.raises(ConfigError) as exc:
        parse_bag("csv: t.csv\ntimeout: 0s\nretries: many\n", str(tmp_path / "b.yaml"))
    assert rendered(exc) == [
        f"{tmp_path / 'b.yaml'}:2: timeout: must be longer than 0 seconds, got the string '0s'",
        f"{tmp_path / 'b.yaml'}:3: retries: expected an integer >= 0, got the string 'many'",
        f"{tmp_path / 't.csv'}:2: estimate_m: expected an estimate in seconds (a number >= 0), got 'soon'",
    ]


def test_missing_bag_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_bag(tmp_path / "nope.yaml")
    assert rendered(exc) == [f"{tmp_path / 'nope.yaml'}: bag file not found"]
