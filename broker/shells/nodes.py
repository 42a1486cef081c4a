"""How the live shell reaches a node's worker agent: local pipes or an SSH stream.

- the private ``local: true`` node, and every dry-run "instance", get a detached agent on
  this machine serving ``run_dir/agents/<node>`` (:func:`attach_local_agent`); the addresses
  moto reports are never contacted;
- a private node with a host is reached over SSH: connect (host key checked against
  known_hosts), ship the agent's files, and open a stream to ``agent.py attach``, whose
  daemon survives a dropped connection.

``attach`` returns a :class:`~broker.shells.agent_client.AgentClient` after its handshake;
``stop`` ends the agent (cancelling what it runs) and is safe to call twice.
"""

from __future__ import annotations

import queue
import shlex
from pathlib import Path
from typing import Any

from broker.core.model import PrivateNode
from broker.shells.agent_client import AgentClient
from broker.shells.local_transport import attach_local_agent, stop_local_agent

AGENTS_DIR = "agents"
REMOTE_AGENT_ROOT = "~/.broker"


def agent_dir(run_dir: Path, node: str) -> Path:
    return Path(run_dir) / AGENTS_DIR / node


class LocalAgents:
    """Agents on this machine, one state directory per node under ``run_dir/agents``."""

    def __init__(self, run_dir: Path, inbox: queue.Queue, handshake_timeout_s: float = 15.0) -> None:
        self.run_dir = Path(run_dir)
        self.inbox = inbox
        self.handshake_timeout_s = handshake_timeout_s

    def attach(self, node: str, slots: int, expect: tuple = ()) -> AgentClient:
        """``expect``: Runs a previous daemon submitted there (see AgentClient)."""
        state_dir = agent_dir(self.run_dir, node)
        state_dir.mkdir(parents=True, exist_ok=True)
        transport = attach_local_agent(state_dir, slots, node=node, grace_s=1.0)
        try:
            return AgentClient(transport, node, inbox=self.inbox, handshake_timeout_s=self.handshake_timeout_s,
                               expect=expect)
        except Exception:
            transport.close()
            stop_local_agent(state_dir)
            raise

    def stop(self, node: str, client: AgentClient | None) -> None:
        _close_client(client, wait_s=2.0)
        stop_local_agent(agent_dir(self.run_dir, node))


class SshAgents:
    """Agents on private nodes reached over SSH (one connection per node, kept open)."""

    def __init__(self, run_id: str, inbox: queue.Queue, handshake_timeout_s: float = 30.0) -> None:
        self.run_id = run_id
        self.inbox = inbox
        self.handshake_timeout_s = handshake_timeout_s
        self._sessions: dict[str, Any] = {}

    def attach(self, node: PrivateNode, expect: tuple = ()) -> AgentClient:
        from broker.shells.ssh import SshTarget, connect

        session = connect(SshTarget.for_node(node))
        self._sessions[node.name] = session
        remote_dir = session.deploy_agent(f"{REMOTE_AGENT_ROOT}/agent")
        q = shlex.quote
        # The state directory keeps its leading ~ unquoted so that the remote shell expands it.
        command = (
            f"python3 {q(remote_dir + '/agent.py')} attach"
            f" --state-dir {REMOTE_AGENT_ROOT}/runs/{q(self.run_id + '/' + node.name)}"
            f" --slots {int(node.slots)} --node {q(node.name)}"
        )
        transport = session.open_stream(command)
        return AgentClient(transport, node.name, inbox=self.inbox, handshake_timeout_s=self.handshake_timeout_s,
                           expect=expect)

    def stop(self, node: str, client: AgentClient | None) -> None:
        _close_client(client, wait_s=5.0)
        session = self._sessions.pop(node, None)
        if session is not None:
            session.close()


def _close_client(client: AgentClient | None, wait_s: float) -> None:
    """Ask the agent to stop its tasks, wait a little for it to hang up, and close."""
    if client is None:
        return
    try:
        client.shutdown(drain=False)
        client.wait_closed(wait_s)
    finally:
        client.close()
