"""The agent expands ``~`` and environment variables in a task's working directory."""

from __future__ import annotations

from pathlib import Path

from tests.test_agent import agent_dir, connect, results_until  # noqa: F401 - agent_dir is a fixture
from workers.agent import expand_path
from workers.protocol import Run


def test_expand_path_uses_the_task_environment() -> None:
    env = {"HOME": "/home/w", "RUN": "r1", "EMPTY": ""}
    assert expand_path("~/work/$RUN/${RUN}x", env) == ("/home/w/work/r1/r1x", [])
    assert expand_path("~", env) == ("/home/w", [])
    assert expand_path("/data/$EMPTY/a", env) == ("/data//a", [])
    assert expand_path("/data/$NOPE/${ALSO_NOPE}/$NOPE", env) == ("/data/$NOPE/${ALSO_NOPE}/$NOPE", ["NOPE", "ALSO_NOPE"])
    assert expand_path("/plain/path~x", env) == ("/plain/path~x", [])
    assert expand_path("cost$5", env) == ("cost$5", [])  # not a variable name


def test_tasks_run_in_the_expanded_working_directory(agent_dir, tmp_path, monkeypatch):  # noqa: F811
    home = tmp_path / "home"
    (home / "work" / "sweep-7").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # the agent's own HOME, as on a node
    client = connect(agent_dir)
    client.submit([
        Run("tilde", 1, "pwd", cwd="~/work"),
        Run("vars", 1, "pwd", cwd="~/work/$SWEEP-${N}", env={"SWEEP": "sweep", "N": "7"}),
        Run("unset", 1, "pwd", cwd="$SCRATCH_DIR/work"),
        Run("missing", 1, "pwd", cwd="~/nowhere"),
    ])
    results, _ = results_until(client, 4)
    assert results[("tilde", 1)].stdout_tail == f"{home / 'work'}\n"
    assert results[("vars", 1)].stdout_tail == f"{home / 'work' / 'sweep-7'}\n"
    unset = results[("unset", 1)]
    assert unset.exit_code is None and unset.error == (
        "cannot enter the working directory $SCRATCH_DIR/work: $SCRATCH_DIR not set on node vm")
    missing = results[("missing", 1)]
    assert missing.exit_code is None
    assert missing.error == f"cannot enter the working directory ~/nowhere ({home / 'nowhere'}): No such file or directory"
    client.close()
