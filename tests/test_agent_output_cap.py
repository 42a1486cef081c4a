"""The agent's output cap, in process: the count of bytes a task wrote, when the task writes
while the agent cuts its file (the interleaving a loaded machine produces now and then)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import workers.agent as agent_module
from workers.agent import Agent, _Task
from workers.protocol import Run

CAP = 1000


@pytest.fixture
def flood(tmp_path: Path):
    """An agent with a cap of 1,000 bytes, a task whose stdout already holds 5,000, and the
    task's own write descriptor on that file (as ``> /dev/stdout`` opens it: not O_APPEND)."""
    agent = Agent(str(tmp_path / "state"), slots=1, node="n", max_output_bytes=CAP)
    out_path, err_path = str(tmp_path / "t.stdout"), str(tmp_path / "t.stderr")
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for p in (out_path, err_path)]
    writer = os.open(out_path, os.O_WRONLY)
    os.write(writer, b"a" * 5000)
    task = _Task(Run("flood", 1, "head -c 8000"), 0, time.monotonic(), fds[0], fds[1], out_path, err_path)
    yield agent, task, writer
    os.close(writer)


def _cut_while_the_task_writes(agent: Agent, task: _Task, writer: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One poll's cut, with the task's last 3,000 bytes landing after the agent read the size."""
    real = agent_module._recent_bytes

    def task_writes_meanwhile(fd, size, cut, cap):
        if fd == task.out_fd:
            os.write(writer, b"b" * 3000)  # then the task is done writing
        return real(fd, size, cut, cap)

    monkeypatch.setattr(agent_module, "_recent_bytes", task_writes_meanwhile)
    agent._cap_outputs(task)
    monkeypatch.undo()


def test_bytes_written_during_a_cut_are_counted_in_the_truncation_note(flood, monkeypatch):
    """Regression: under load the 200 MB flood's note said the task wrote 196 MB: its last
    writes fell between the agent's fstat and its ftruncate, which threw their size away."""
    agent, task, writer = flood
    _cut_while_the_task_writes(agent, task, writer, monkeypatch)
    assert os.fstat(task.out_fd).st_blocks * 512 < 5000 + 4096  # the blocks past the cap are freed

    tail, path = agent._close_output(task, task.out_fd, task.out_path, "stdout")
    assert "stdout truncated: the task wrote 8,000 bytes, the file keeps the first 1,000" in tail
    assert tail.split("\n")[0].endswith("a" * 1096 + "b" * 3000)  # the tail is the task's last bytes
    kept = Path(path).read_bytes()
    assert kept[:CAP] == b"a" * CAP and b"wrote 8,000 bytes" in kept[CAP:]


def test_where_holes_cannot_be_punched_the_file_is_still_cut_to_the_cap(flood, monkeypatch):
    agent, task, writer = flood
    monkeypatch.setattr(agent_module, "_punch_hole", lambda fd, start, end: False)
    agent._cap_outputs(task)
    assert os.fstat(task.out_fd).st_size == CAP
    tail, path = agent._close_output(task, task.out_fd, task.out_path, "stdout")
    assert "stdout truncated: the task wrote 5,000 bytes" in tail
    assert Path(path).read_bytes()[:CAP] == b"a" * CAP
