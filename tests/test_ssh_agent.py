"""The worker agent over real SSH: deployed by SFTP, attached through a channel, surviving a drop.

The "node" is this machine behind a test sshd on 127.0.0.1, so the agent's state directory
is also visible locally: teardown stops its daemon through the pid file (the same way the
local shell does) and fails the test if any task it started is still alive.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from broker.shells.agent_client import AgentClient, NodeLost, TaskLost
from broker.shells.local_transport import local_agent_pid, stop_local_agent
from broker.shells.ssh import SshSession, SshTarget, SshTransport, connect
from tests.sshd import TestSshd
from workers.protocol import Result, Run, Started
from tests.processes import agent_task_processes

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("structlog_defaults")]


def session_for(server: TestSshd) -> SshSession:
    return connect(
        SshTarget(
            host=server.host,
            port=server.port,
            user=server.user,
            key_path=str(server.client_key_path),
            known_hosts_path=str(server.known_hosts_path),
            connect_timeout_s=5.0,
        )
    )


def attach(session: SshSession, agent_dir: str, state_dir: Path, slots: int) -> SshTransport:
    return session.open_stream(
        f"python3 {shlex.quote(agent_dir + '/agent.py')} attach --state-dir {shlex.quote(str(state_dir))} "
        f"--slots {slots} --node ssh-node --grace-s 1 --progress-poll-s 0.05"
    )


def processes_of(state_dir: Path) -> list[int]:
    """Live processes the agent of ``state_dir`` started."""
    return agent_task_processes(state_dir)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "node-state"
    yield directory
    stop_local_agent(directory, timeout_s=5.0)
    leaked = processes_of(directory)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"task processes outlived the test: {leaked}"


def collect(client: AgentClient, until: Any, timeout_s: float, into: list[Any]) -> None:
    """Append events to ``into`` until ``until(into)`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not until(into):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; events: {into}")
        into.extend(client.poll(0.1))


def results_in(events: list[Any]) -> list[Result]:
    return [e for e in events if isinstance(e, Result)]


def test_every_result_arrives_exactly_once_across_a_dropped_ssh_connection(
    sshd: TestSshd, tmp_path: Path, state_dir: Path
) -> None:
    quick = [Run(f"quick-{i}", 1, "echo quick-$BROKER_TASK") for i in range(4)]
    slow = [Run(f"slow-{i}", 1, "sleep 0.8; echo slow-$BROKER_TASK") for i in range(8)]
    session = session_for(sshd)
    agent_dir = session.deploy_agent(str(tmp_path / "home" / ".broker" / "agent"))
    # the worker package's modules, the spot notice watcher among them (workers/imds.py)
    assert sorted(os.listdir(agent_dir)) == ["agent.py", "imds.py", "protocol.py"]

    client = AgentClient(attach(session, agent_dir, state_dir, slots=4), "ssh-node", ping_interval_s=1.0, dead_after_s=5.0)
    assert client.hello is not None and client.hello.slots == 4
    events: list[Any] = []
    client.submit(quick + slow)
    collect(client, lambda ev: {r.task for r in results_in(ev)} >= {r.task for r in quick}, 10.0, events)
    collect(client, lambda ev: any(isinstance(e, Started) and e.task.startswith("slow") for e in ev), 10.0, events)
    daemon_pid = local_agent_pid(state_dir)
    assert daemon_pid is not None

    # The link dies mid-task. The master notices; the daemon and its tasks carry on.
    sshd.drop_connections()
    collect(client, lambda ev: any(isinstance(e, NodeLost) for e in ev), 10.0, events)
    session.close()
    time.sleep(1.0)  # some slow tasks finish while nobody is attached
    assert local_agent_pid(state_dir) == daemon_pid

    # Reconnect with a fresh SSH session and re-attach: what finished meanwhile is replayed.
    session = session_for(sshd)
    hello = client.reattach(attach(session, agent_dir, state_dir, slots=4))
    assert hello.pending_results >= 1
    everything = {r.task for r in quick + slow}
    collect(client, lambda ev: {r.task for r in results_in(ev)} >= everything, 20.0, events)
    events.extend(client.poll(0.3))  # a duplicate would arrive now, if it ever did

    per_key = Counter((r.task, r.attempt) for r in results_in(events))
    assert set(per_key) == {(r.task, 1) for r in quick + slow}
    assert set(per_key.values()) == {1}, f"results delivered more than once: {per_key}"
    assert not [e for e in events if isinstance(e, TaskLost)]
    for result in results_in(events):
        assert result.exit_code == 0 and result.stdout_tail == f"{result.task.split('-')[0]}-{result.task}\n"

    # Acknowledged results are forgotten: a later master is not sent them again.
    client.ack(list(per_key))
    time.sleep(0.2)
    client.close()
    later = AgentClient(attach(session, agent_dir, state_dir, slots=4), "ssh-node")
    assert later.hello is not None and later.hello.pending_results == 0
    later.close()
    session.close()


def test_closing_the_stream_detaches_without_stopping_the_agent(sshd: TestSshd, tmp_path: Path, state_dir: Path) -> None:
    with session_for(sshd) as session:
        agent_dir = session.deploy_agent(str(tmp_path / "agent"))
        transport = attach(session, agent_dir, state_dir, slots=1)
        client = AgentClient(transport, "ssh-node")
        client.submit([Run("outlives", 1, "sleep 0.5; echo still-here")])
        events: list[Any] = []
        collect(client, lambda ev: any(isinstance(e, Started) for e in ev), 10.0, events)
        client.close()
        assert transport.closed
        time.sleep(0.8)
        again = AgentClient(attach(session, agent_dir, state_dir, slots=1), "ssh-node")
        replayed: list[Any] = []
        collect(again, lambda ev: len(results_in(ev)) == 1, 10.0, replayed)
        assert results_in(replayed)[0].stdout_tail == "still-here\n"
        again.close()
