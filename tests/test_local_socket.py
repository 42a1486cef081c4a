"""A local agent reached on its socket, with no bridge process (``connect_local_agent``): what
``broker run`` does for the local node and every dry-run instance."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest

from broker.shells.agent_client import AgentClient
from broker.shells.local_transport import AgentSocket, connect_local_agent, local_agent_pid, stop_local_agent
from broker.shells.nodes import LocalAgents
from workers.agent import MAX_OUTPUT_ENV, AgentStartError
from workers.protocol import Result, Run


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _result(inbox: queue.Queue, timeout_s: float = 10.0) -> Result:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _node, message = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(message, Result):
            return message
    raise AssertionError("no Result")


def test_a_run_reaches_the_daemon_on_its_socket_with_no_process_of_ours_between(tmp_path):
    # a state dir past the 108 bytes of a socket address: reached through the directory's descriptor
    state_dir = tmp_path / ("d" * 120) / "agent"
    before = set(_children(os.getpid()))
    transport = connect_local_agent(state_dir, 2, node="n1", grace_s=1.0)
    try:
        assert isinstance(transport, AgentSocket)
        daemon = local_agent_pid(state_dir)
        assert daemon is not None and os.getsid(daemon) == daemon  # in a session of its own
        assert set(_children(os.getpid())) - before == {daemon}  # and no bridge process between us
        inbox: queue.Queue = queue.Queue()
        client = AgentClient(transport, "n1", inbox=inbox)
        assert client.hello.slots == 2
        client.submit([Run("t1", 1, "echo hi")])
        result = _result(inbox)
        assert (result.task, result.exit_code, result.stdout_tail) == ("t1", 0, "hi\n")
        client.close()
    finally:
        stop_local_agent(state_dir)


def test_a_dropped_connection_leaves_the_agent_and_its_results_for_the_next(tmp_path):
    state_dir = tmp_path / "agent"
    inbox: queue.Queue = queue.Queue()
    first = AgentClient(connect_local_agent(state_dir, 1, grace_s=1.0), "n", inbox=inbox)
    daemon = local_agent_pid(state_dir)
    try:
        first.submit([Run("t1", 1, "sleep 0.5; echo late")])
        first._link.transport.kill()  # as a network failure would: the task runs on
        again: queue.Queue = queue.Queue()
        second = AgentClient(connect_local_agent(state_dir, 1, grace_s=1.0), "n", inbox=again,
                             expect=[Run("t1", 1, "sleep 0.5; echo late")])
        assert local_agent_pid(state_dir) == daemon  # the same daemon, reached again
        result = _result(again)
        assert (result.task, result.stdout_tail) == ("t1", "late\n")  # replayed to the new connection
        second.close()
        first.close()
    finally:
        stop_local_agent(state_dir)


def test_a_daemon_that_cannot_start_says_why_without_ending_the_master(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_OUTPUT_ENV, "lots")
    try:
        with pytest.raises(AgentStartError, match=f"{MAX_OUTPUT_ENV}='lots'"):
            connect_local_agent(tmp_path / "agent", 1)
    finally:
        stop_local_agent(tmp_path / "agent")
    monkeypatch.delenv(MAX_OUTPUT_ENV)
    monkeypatch.setattr("workers.agent.AGENT_FILE", str(tmp_path / "missing.py"))  # the daemon exits at once
    with pytest.raises(AgentStartError, match=r"(?s)the agent daemon failed \(exit 2\).*missing\.py"):
        connect_local_agent(tmp_path / "bad", 1)


def test_the_run_s_local_nodes_use_the_socket(tmp_path):
    agents = LocalAgents(Path(tmp_path), queue.Queue())
    client = agents.attach("local", 1)
    try:
        assert isinstance(client._link.transport, AgentSocket)
    finally:
        agents.stop("local", client)


def test_a_reattach_that_meets_a_dying_agents_socket_tries_again_and_reaches_a_fresh_agent(tmp_path):
    """An agent killed a moment ago can still accept a connection on its socket and then drop
    it (the daemon reacted 4 ms after a SIGKILL and lost the node: tests/test_daemon_faults.py's
    killed instance agent, now and then): the re-attach tries again and reaches a new agent."""
    import socket
    import threading

    from broker.shells.nodes import agent_dir
    from workers.agent import SOCKET_NAME

    agents = LocalAgents(Path(tmp_path), queue.Queue())
    client = agents.attach("local", 1)
    state_dir = agent_dir(Path(tmp_path), "local")
    first = local_agent_pid(state_dir)
    stop_local_agent(state_dir)  # gone, its socket with it
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(state_dir / SOCKET_NAME))
    dying.listen(1)

    def accept_once_and_go() -> None:  # as a killed agent's socket, still open as the process exits
        conn, _ = dying.accept()
        conn.close()
        dying.close()
        os.unlink(state_dir / SOCKET_NAME)

    threading.Thread(target=accept_once_and_go, daemon=True).start()
    try:
        agents.reattach("local", 1, client)
        fresh = local_agent_pid(state_dir)
        assert fresh is not None and fresh != first
        client.submit([Run("t1", 1, "echo back")])
        result = _result(agents.inbox)
        assert (result.task, result.stdout_tail) == ("t1", "back\n")
    finally:
        agents.stop("local", client)


def test_acks_to_a_closed_client_are_noted_not_raised(tmp_path):
    """A turn acknowledges its results after it commits; a node whose re-attach failed in that
    turn has a closed client by then, and the ack raised TransportClosed out of the daemon's
    loop (a run ended with a traceback). The agent replays those results to a new connection."""
    agents = LocalAgents(Path(tmp_path), queue.Queue())
    client = agents.attach("local", 1)
    try:
        client.close()
        client.ack([("t1", 1)], hold=True)
        client.ack([("t2", 1)])
        assert {("t1", 1), ("t2", 1)} <= client._acked
    finally:
        from broker.shells.nodes import agent_dir

        stop_local_agent(agent_dir(Path(tmp_path), "local"))


def test_stopping_a_node_whose_client_is_closed_stops_its_agent_without_raising(tmp_path):
    """A re-attach that fails closes its client; releasing that node (an instance) or winding
    the run down (a private node) then stopped it with nodes.stop, whose Shutdown raised
    TransportClosed out of the daemon and left the agent running."""
    from broker.shells.nodes import agent_dir

    agents = LocalAgents(Path(tmp_path), queue.Queue())
    client = agents.attach("local", 1)
    state_dir = agent_dir(Path(tmp_path), "local")
    try:
        assert local_agent_pid(state_dir) is not None
        client.close()
        agents.stop("local", client)
        assert local_agent_pid(state_dir) is None
    finally:
        stop_local_agent(state_dir)
