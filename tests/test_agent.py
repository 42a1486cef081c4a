"""The worker agent end to end: real daemons, real tasks, over local pipes.

Every test gets its own state dir; the ``agent_dir`` fixture stops the daemon afterwards
and fails the test if any process carrying that dir's marker (the agent exports
BROKER_AGENT_DIR to its tasks) is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.shells.agent_client import AgentClient, HandshakeError, NodeLost
from broker.shells.local_transport import (
    AGENT_SCRIPT,
    LocalTransport,
    attach_local_agent,
    local_agent_pid,
    stop_local_agent,
)
from workers.agent import TAIL_BYTES, output_stem
from workers.protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    Connection,
    ConnectionClosed,
    Hello,
    Progress,
    Result,
    Run,
    Started,
    encode,
)
from tests.processes import agent_task_processes


def marked_processes(state_dir: Path) -> list[int]:
    """Live processes started by the agent of ``state_dir``."""
    return agent_task_processes(state_dir)


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    """Whether ``predicate`` came true within ``timeout_s`` (a hang guard, not a speed limit)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def journaled(state_dir: Path, kind: str, task: str) -> bool:
    """Whether the agent's journal holds a ``kind`` line (result, ack) for ``task``."""
    path = state_dir / "journal"
    return path.exists() and f'{{"type":"{kind}","task":"{task}"' in path.read_text()


@pytest.fixture
def agent_dir(tmp_path):
    state_dir = tmp_path / "agent"
    yield state_dir
    stop_local_agent(state_dir, timeout_s=5.0)
    leaked = marked_processes(state_dir)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"task processes outlived the test: {leaked}"


def connect(state_dir: Path, slots: int = 4, **options) -> AgentClient:
    options.setdefault("grace_s", 1.0)
    options.setdefault("progress_poll_s", 0.05)
    return AgentClient(attach_local_agent(state_dir, slots, **options), "local")


def results_until(client: AgentClient, count: int, timeout_s: float = 30.0) -> tuple[dict, list]:
    """Collect events until ``count`` Results arrived; return them by key, plus every event."""
    results, events = {}, []
    deadline = time.monotonic() + timeout_s
    while len(results) < count and time.monotonic() < deadline:
        for event in client.poll(0.1):
            events.append(event)
            if isinstance(event, Result):
                results[(event.task, event.attempt)] = event
    assert len(results) == count, f"only {len(results)} of {count} results arrived: {events}"
    return results, events


def wait_for(client: AgentClient, kind: type, timeout_s: float = 5.0):
    """The first event of type ``kind`` (earlier events are dropped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in client.poll(0.1):
            if isinstance(event, kind):
                return event
    raise AssertionError(f"no {kind.__name__} within {timeout_s} s")


def test_exit_codes_tails_and_output_files(agent_dir):
    client = connect(agent_dir)
    client.submit(
        [
            Run("mixed", 1, "echo out; echo err >&2; exit 3"),
            Run("quiet", 1, "true"),
            Run("loud", 1, "head -c 10000 /dev/zero | tr '\\0' a; echo tail-end"),
        ]
    )
    results, _ = results_until(client, 3)
    mixed = results[("mixed", 1)]
    assert (mixed.exit_code, mixed.stdout_tail, mixed.stderr_tail) == (3, "out\n", "err\n")
    assert Path(mixed.stdout_path).read_text() == "out\n"
    assert Path(mixed.stderr_path).read_text() == "err\n"
    assert Path(mixed.stdout_path).name == "mixed.1.stdout"
    quiet = results[("quiet", 1)]
    assert quiet.ok and quiet.stdout_path is None and quiet.stderr_path is None
    loud = results[("loud", 1)]
    assert len(loud.stdout_tail) == TAIL_BYTES and loud.stdout_tail.endswith("aaatail-end\n")
    assert Path(loud.stdout_path).stat().st_size == 10000 + len("tail-end\n")
    client.close()


def test_environment_working_directory_and_runtime(agent_dir, tmp_path):
    client = connect(agent_dir)
    client.submit(
        [
            Run("env", 2, 'echo "$GREETING $BROKER_TASK $BROKER_ATTEMPT"; pwd; sleep 0.3', env={"GREETING": "hi"}, cwd=str(tmp_path)),
            Run("nowhere", 1, "true", cwd=str(tmp_path / "missing")),
        ]
    )
    results, _ = results_until(client, 2)
    env = results[("env", 2)]
    assert env.stdout_tail == f"hi env 2\n{tmp_path}\n"
    assert env.runtime_s >= 0.3  # measured around the whole task (no upper bound: a loaded machine is slow)
    nowhere = results[("nowhere", 1)]
    assert nowhere.exit_code is None and "cannot enter the working directory" in nowhere.error
    client.close()


def test_timeout_kills_the_whole_process_tree(agent_dir, tmp_path):
    client = connect(agent_dir, grace_s=1.0)
    pid_file = tmp_path / "child.pid"
    client.submit([Run("tree", 1, f"sleep 30 & echo $! > {pid_file}; sleep 30", timeout_s=0.5)])
    started = time.monotonic()
    results, _ = results_until(client, 1)
    result = results[("tree", 1)]
    assert result.timed_out and not result.cancelled
    assert result.exit_code == -signal.SIGTERM
    # Killed at its timeout, not left to its 30 s sleeps (the bound is a guard, far from both).
    assert 0.5 <= result.runtime_s < 15.0
    assert time.monotonic() - started < 15.0
    child = int(pid_file.read_text())
    assert wait_until(lambda: not Path(f"/proc/{child}").exists() or _is_zombie(child))
    client.close()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_task_ignoring_sigterm_is_killed_after_the_grace(agent_dir):
    client = connect(agent_dir, grace_s=0.5)
    client.submit([Run("stubborn", 1, "trap '' TERM; sleep 30", timeout_s=0.3)])
    results, _ = results_until(client, 1)
    result = results[("stubborn", 1)]
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    assert 0.8 <= result.runtime_s < 15.0  # the timeout plus the grace, then SIGKILL: not its 30 s sleep
    client.close()


def test_cancel_running_and_queued_tasks(agent_dir):
    client = connect(agent_dir, slots=1)
    client.submit([Run("long", 1, "sleep 30"), Run("waiting", 1, "sleep 30")])
    wait_for(client, Started)
    client.cancel([("waiting", 1), ("long", 1)])
    results, _ = results_until(client, 2)
    assert results[("waiting", 1)].cancelled and results[("waiting", 1)].exit_code is None
    assert results[("long", 1)].cancelled and results[("long", 1)].exit_code == -signal.SIGTERM
    client.close()


def test_progress_lines_are_reported_with_elapsed_time(agent_dir):
    client = connect(agent_dir, progress_poll_s=0.05)
    command = "echo BROKER_PROGRESS 0.25; sleep 0.4; echo BROKER_PROGRESS 0.75; echo BROKER_PROGRESS 2; sleep 0.4"
    client.submit([Run("steps", 1, command)])
    results, events = results_until(client, 1)
    progress = [e for e in events if isinstance(e, Progress)]
    assert [p.fraction for p in progress] == [0.25, 0.75]  # 2 is not a fraction
    # Each is stamped when a poll noticed it, while the task ran (how soon after it was
    # printed depends on how loaded the machine is): the second came after the first sleep.
    assert progress[0].elapsed_s <= progress[1].elapsed_s <= results[("steps", 1)].runtime_s
    assert progress[1].elapsed_s >= 0.4
    client.close()


def test_duplicate_runs_start_one_process(agent_dir, tmp_path):
    counter = tmp_path / "counter"
    run = Run("once", 1, f"echo ran >> {counter}; sleep 0.5")
    client = connect(agent_dir)
    client.submit([run, run])
    client.submit([run])
    results, events = results_until(client, 1)
    client.submit([run])  # after it finished: answered with the stored Result, not run again
    time.sleep(0.3)
    events += client.poll(0.1)
    assert counter.read_text() == "ran\n"
    assert len([e for e in events if isinstance(e, Started)]) == 1
    assert len([e for e in events if isinstance(e, Result)]) == 1
    client.close()


def test_a_result_finished_while_detached_is_replayed_until_acked(agent_dir):
    client = connect(agent_dir)
    client.submit([Run("survivor", 1, "sleep 0.5; echo made-it")])
    wait_for(client, Started)
    client._link.transport.kill()  # the connection drops mid-task (like an SSH session dying)
    assert any(isinstance(e, NodeLost) for e in client.poll(2.0))
    assert wait_until(lambda: journaled(agent_dir, "result", "survivor"))  # it finished with nobody attached
    hello = client.reattach(attach_local_agent(agent_dir, 4))
    assert hello.pending_results == 1 and hello.running == ()
    results, _ = results_until(client, 1)
    assert results[("survivor", 1)].stdout_tail == "made-it\n"

    # A second client (a restarted master) sees the replay again: not acked yet.
    client.close()
    again = connect(agent_dir)
    assert again.hello.pending_results == 1
    results, _ = results_until(again, 1)
    again.ack([("survivor", 1)])
    assert wait_until(lambda: journaled(agent_dir, "ack", "survivor"))
    again.close()

    after_ack = connect(agent_dir)
    assert after_ack.hello.pending_results == 0
    assert after_ack.poll(0.3) == []
    after_ack.close()


def test_results_survive_an_agent_restart(agent_dir):
    client = connect(agent_dir)
    client.submit([Run("kept", 1, "echo journaled")])
    results_until(client, 1)
    client.close()
    assert stop_local_agent(agent_dir)
    assert local_agent_pid(agent_dir) is None

    fresh = connect(agent_dir)  # a new daemon, reading the journal
    assert fresh.hello.pending_results == 1
    results, _ = results_until(fresh, 1)
    assert results[("kept", 1)].stdout_tail == "journaled\n"
    fresh.close()


def test_a_task_running_when_the_agent_died_is_reported_and_killed(agent_dir):
    client = connect(agent_dir)
    client.submit([Run("orphan", 1, "sleep 30")])
    started = wait_for(client, Started)
    os.kill(local_agent_pid(agent_dir), signal.SIGKILL)  # the agent crashes; the task lives on
    assert wait_until(lambda: local_agent_pid(agent_dir) is None)
    assert Path(f"/proc/{started.pid}").exists()
    client.close()

    fresh = connect(agent_dir)
    results, _ = results_until(fresh, 1)
    result = results[("orphan", 1)]
    assert result.exit_code is None and "the agent stopped while this attempt ran" in result.error
    assert "killed" in result.error
    assert wait_until(lambda: not marked_processes(agent_dir))
    fresh.close()


def test_shutdown_drain_waits_and_shutdown_cancel_does_not(agent_dir, tmp_path):
    client = connect(agent_dir, slots=1)
    client.submit([Run("a", 1, "sleep 0.3; echo a"), Run("b", 1, "echo b")])
    client.shutdown(drain=True)
    results, _ = results_until(client, 2)
    assert results[("a", 1)].ok and results[("b", 1)].ok
    assert client.wait_closed(5.0)
    assert wait_until(lambda: local_agent_pid(agent_dir) is None)

    client = connect(agent_dir, slots=1)
    assert client.hello.pending_results == 2  # a and b, never acknowledged: replayed below
    client.submit([Run("c", 1, "sleep 30"), Run("d", 1, "sleep 30")])
    client.shutdown(drain=False)
    results, _ = results_until(client, 4)
    assert results[("a", 1)].ok and results[("c", 1)].cancelled and results[("d", 1)].cancelled
    assert client.wait_closed(5.0)
    assert wait_until(lambda: local_agent_pid(agent_dir) is None)
    assert not (agent_dir / "agent.sock").exists()


def test_stdio_mode_dies_with_its_pipe(agent_dir):
    transport = LocalTransport.spawn(
        [sys.executable, str(AGENT_SCRIPT), "serve", "--stdio", "--state-dir", str(agent_dir), "--slots", "2"]
    )
    client = AgentClient(transport, "stdio")
    client.submit([Run("quick", 1, "echo hi"), Run("slow", 1, "sleep 30")])
    results, _ = results_until(client, 1)
    assert results[("quick", 1)].stdout_tail == "hi\n"
    client.close()
    assert transport.process.wait(5.0) == 0
    assert wait_until(lambda: not marked_processes(agent_dir))


def test_a_master_of_another_version_gets_the_agents_hello_then_the_door(agent_dir):
    transport = attach_local_agent(agent_dir, 1)
    transport.send(encode(Hello(role="master", protocol=PROTOCOL_VERSION + 1)))
    master = Connection("master")
    events: list = []
    while not events or not isinstance(events[-1], ConnectionClosed):
        chunk = transport.recv(timeout_s=5.0)
        assert chunk is not None, f"the agent neither answered nor hung up: {events}"
        master.receive_data(chunk)
        while (event := master.next_event()) is not NEED_DATA:
            events.append(event)
            if isinstance(event, ConnectionClosed):
                break
    transport.close()
    assert [type(e) for e in events] == [Hello, ConnectionClosed]
    assert events[0].protocol == PROTOCOL_VERSION  # what a newer master needs to name the mismatch
    log = (agent_dir / "agent.log").read_text()
    assert f"speaks protocol {PROTOCOL_VERSION + 1}" in log


def test_garbage_instead_of_a_hello_fails_the_handshake(agent_dir):
    transport = LocalTransport.spawn(["/bin/sh", "-c", "echo 'this is not an agent'; read line"])
    with pytest.raises(HandshakeError, match="not a JSON line"):
        AgentClient(transport, "impostor", handshake_timeout_s=5.0)
    assert transport.closed


def test_idle_agent_exits_on_its_own(agent_dir):
    client = connect(agent_dir, idle_exit_s=0.3)
    client.submit([Run("t", 1, "true")])
    results_until(client, 1)
    assert local_agent_pid(agent_dir) is not None
    client.close()
    assert wait_until(lambda: local_agent_pid(agent_dir) is None)


def test_a_state_dir_longer_than_the_socket_path_limit_works(tmp_path):
    deep = tmp_path / ("d" * 100) / ("e" * 60)
    try:
        client = connect(deep)
        client.submit([Run("t", 1, "echo deep")])
        results, _ = results_until(client, 1)
        assert results[("t", 1)].stdout_tail == "deep\n"
        client.close()
    finally:
        stop_local_agent(deep)
    assert len(str(deep / "agent.sock")) > 108


def test_two_attaches_racing_start_one_daemon(agent_dir):
    transports = [attach_local_agent(agent_dir, 2) for _ in range(3)]
    assert wait_until(lambda: local_agent_pid(agent_dir) is not None)
    pid = local_agent_pid(agent_dir)
    for t in transports:  # each attach reached that daemon (a newer connection replaces an older)
        t.close()

    def daemons() -> list[str]:
        pattern = f"agent.py serve --state-dir {agent_dir} "
        return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()

    assert wait_until(lambda: daemons() == [str(pid)]), daemons()  # the losers of the lock race left


@pytest.mark.parametrize(
    "task, stem",
    [("plain-1", "plain-1.0"), ("../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd.0"), ("a b/c", "a%20b%2Fc.0")],
)
def test_output_file_names_cannot_escape_the_out_dir(task, stem):
    assert output_stem(task, 0) == stem
    assert "/" not in output_stem(task, 0)


def test_a_rejected_attempt_after_ack_is_not_run_again(agent_dir, tmp_path):
    counter = tmp_path / "counter"
    run = Run("acked", 1, f"echo ran >> {counter}")
    client = connect(agent_dir)
    client.submit([run])
    results_until(client, 1)
    client.ack([("acked", 1)])
    client.close()
    raw = attach_local_agent(agent_dir, 1)
    master = Connection("master")
    raw.send(master.send(Hello(role="master")) + master.send(run))
    events: list = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        chunk = raw.recv(timeout_s=0.2)
        if chunk:
            master.receive_data(chunk)
            while (event := master.next_event()) is not NEED_DATA:
                events.append(event)
    raw.close()
    assert isinstance(events[1], Result) and "acknowledged" in events[1].error
    assert counter.read_text() == "ran\n"


def test_a_new_master_connection_replaces_the_old_one(agent_dir):
    old = connect(agent_dir)
    new = connect(agent_dir)
    assert isinstance(wait_for(old, NodeLost), NodeLost)
    new.submit([Run("t", 1, "echo still-served")])
    results, _ = results_until(new, 1)
    assert results[("t", 1)].stdout_tail == "still-served\n"
    old.close()
    new.close()


def test_what_a_task_leaves_behind_in_its_group_is_killed_when_it_exits(agent_dir, tmp_path):
    pid_file = tmp_path / "background.pid"
    client = connect(agent_dir)
    client.submit([Run("leaver", 1, f"sleep 30 & echo $! > {pid_file}; exit 0")])
    results, _ = results_until(client, 1)
    assert results[("leaver", 1)].ok
    background = int(pid_file.read_text())
    assert wait_until(lambda: _is_zombie(background))
    client.close()


def test_a_recursion_error_line_to_the_agent_is_survived_and_its_task_keeps_running(agent_dir):
    """A line nested too deep for the JSON parser used to kill the agent with a traceback
    (RecursionError is not a ValueError); now it is a protocol error: the agent drops that
    connection and goes on, and the master re-attaches and gets the task's result."""
    client = connect(agent_dir)
    pid = local_agent_pid(agent_dir)
    client.submit([Run("steady", 1, "sleep 0.8; echo still-here")])
    wait_for(client, Started)
    client._link.transport.send(b'{"type":"ack","task":' + b"[" * 100_000 + b"]" * 100_000 + b',"attempt":1}\n')
    assert any(isinstance(e, NodeLost) for e in client.poll(3.0))  # it hung up on the bad master
    assert local_agent_pid(agent_dir) == pid  # ... and is alive
    hello = client.reattach(attach_local_agent(agent_dir, 4))
    assert hello.running == (("steady", 1),) or hello.pending_results == 1
    results, _ = results_until(client, 1)
    assert results[("steady", 1)].stdout_tail == "still-here\n"
    client.close()
