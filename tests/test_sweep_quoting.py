"""Sweep values reach the command as text: quoted for the shell context of their placeholder.

Before, ``command: "echo {x}"`` with ``x: ["; touch PWNED"]`` ran ``touch PWNED``. Now a bare
placeholder gets one shell word, one inside ``'...'`` or ``"..."`` gets its quotes escaped for
that context, and only a parameter listed under ``unquoted`` is filled in as shell syntax.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from broker.config.bag import parse_bag
from broker.config.errors import ConfigError
from tests.test_dryrun import broker, run_dir  # noqa: F401 - run_dir is a fixture

HOSTILE = ["; touch PWNED", "x' y", "$(touch SUBST)", "`touch BACKTICK`", 'a"b\\c', "", "-n"]


def _words(command: str, cwd) -> list[str]:
    """The arguments ``command``'s ``printf`` got, one per line, as /bin/sh runs it."""
    done = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.split("\0")[:-1]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_is_one_argument_in_every_quoting_context(value, tmp_path):
    bag = parse_bag(json.dumps({"command": "printf '%s\\0' {x} '{x}' \"{x}\" pre{x}post", "sweep": {"x": [value]},
                                "timeout": "1s"}))
    (task,) = bag.tasks
    assert _words(task.command, tmp_path) == [value, value, value, f"pre{value}post"]
    assert list(tmp_path.iterdir()) == []  # nothing touched: no ;, no $(...), no backquote ran
    assert task.params == {"x": value}  # the parameters stay as written (outputs paths, ids)


def test_an_unquoted_parameter_is_shell_syntax_and_validate_says_so(tmp_path):
    warnings = []
    bag = parse_bag("command: 'printf %s {x} {y}'\nsweep: {x: ['a b'], y: ['&& touch OPTED_IN']}\n"
                    "unquoted: [y]\ntimeout: 1s\n", warnings=warnings)
    subprocess.run(["/bin/sh", "-c", bag.tasks[0].command], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "OPTED_IN").exists()
    assert [w.field for w in warnings] == ["sweep.y"]
    assert "filled in unquoted (unquoted: [y]): the node's shell runs them as shell syntax" in warnings[0].message


def test_values_with_metacharacters_are_warned_about_and_plain_ones_are_not():
    warnings = []
    parse_bag("command: 'run {x} {n} {s}'\nsweep: {x: ['; touch PWNED', '$(id)', ok], n: {range: [0, 3]}, "
              "s: [plain-1.5, 'a b']}\ntimeout: 1s\n", "bag.yaml", warnings=warnings)
    (warning,) = warnings
    assert warning.render() == ("bag.yaml:2: sweep.x: 2 value(s) hold shell metacharacters ('; touch PWNED', "
                                "'$(id)'): each is passed quoted, as text; list x under unquoted if they are "
                                "meant as shell syntax")


def test_unquoted_must_name_sweep_parameters_and_a_placeholder_after_a_backslash_is_refused():
    with pytest.raises(ConfigError) as unknown:
        parse_bag("command: 'run {x}'\nsweep: {x: [1]}\nunquoted: [y]\ntimeout: 1s\n")
    assert "unquoted[0]: 'y' is not a sweep parameter" in unknown.value.render()
    with pytest.raises(ConfigError) as escaped:
        parse_bag("command: 'run \\{x}'\nsweep: {x: [1]}\ntimeout: 1s\n")
    assert "follows a backslash" in escaped.value.render()
    with pytest.raises(ConfigError) as elsewhere:
        parse_bag("tasks_file: t.txt\nunquoted: [x]\ntimeout: 1s\n")
    assert "unquoted fills a command template; it does not apply to tasks_file" in elsewhere.value.render()


def test_validate_prints_the_warning_and_still_exits_0(tmp_path, capsys):
    from broker.cli import main

    (tmp_path / "inv.yaml").write_text("private:\n  - {name: here, local: true, slots: 1}\n")
    (tmp_path / "bag.yaml").write_text("command: 'echo {x}'\nsweep: {x: ['; touch PWNED']}\ntimeout: 1s\n")
    assert main(["validate", str(tmp_path / "inv.yaml"), str(tmp_path / "bag.yaml")]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"warning: {tmp_path / 'bag.yaml'}:2: sweep.x: 1 value(s) hold shell metacharacters")
    assert out.splitlines()[-1].startswith("valid")


def test_a_dry_run_of_hostile_sweep_values_touches_nothing(tmp_path, run_dir):  # noqa: F811
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "inv.yaml").write_text("private:\n  - {name: local, local: true, slots: 2}\n")
    (tmp_path / "bag.yaml").write_text(json.dumps({
        "command": "printf '%s\\0' {x} > \"out-$BROKER_TASK\"", "sweep": {"x": HOSTILE[:5]},
        "timeout": "10s", "retries": 0, "workdir": str(work)}))
    done = broker("run", "--dry-run", "--yes", "--json-report", "--inventory", str(tmp_path / "inv.yaml"),
                  str(tmp_path / "bag.yaml"), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["tasks"]["done"] == 5
    assert sorted(p.name for p in work.iterdir()) == [f"out-t00000{i}" for i in range(1, 6)]  # no PWNED, no SUBST
    for i, value in enumerate(HOSTILE[:5], 1):  # each task's printf got its value as one argument
        assert (work / f"out-t00000{i}").read_text().split("\0")[:-1] == [value]
