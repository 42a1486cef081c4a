"""One :class:`~broker.shells.run.types.Nodes` for a run: each node's agent reached the way
its kind needs (the local node and a dry run's instances as local agents, private nodes over
SSH, a live run's instances over SSH at EC2's address)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from broker.core.model import Inventory, PrivateNode
from broker.shells.agent_client import AgentClient
from workers.protocol import Run


class RunNodes:
    """``local``: :class:`~broker.shells.nodes.LocalAgents`; ``remote``:
    :class:`~broker.shells.nodes.SshAgents`; ``instances``: what realizes an EC2 instance
    (``LocalAgents`` in a dry run, :class:`~broker.shells.nodes.InstanceAgents` live, None
    when the inventory has no types)."""

    def __init__(self, inventory: Inventory, *, local: Any = None, remote: Any = None, instances: Any = None) -> None:
        self.private: dict[str, PrivateNode] = {p.name: p for p in inventory.private}
        self.local, self.remote, self.instances = local, remote, instances
        # Whether an instance is a spot one (its agent then watches for the notice): the
        # daemon sets it from its ledger.
        self.is_spot: Callable[[str], bool] = lambda node: False

    def _spot(self, node: str) -> dict[str, bool]:
        return {"spot": True} if self.is_spot(node) else {}

    def _private_agents(self, node: PrivateNode) -> Any:
        return self.local if node.local else self.remote

    def attach(self, node: str, slots: int, expect: tuple[Run, ...] = ()) -> AgentClient:
        private = self.private.get(node)
        if private is None:
            return self.instances.attach(node, slots, expect, **self._spot(node))
        if private.local:
            return self.local.attach(node, slots, expect)
        return self.remote.attach(private, expect)

    def attach_in_background(self, node: str, slots: int,
                             done: Callable[[AgentClient | None, BaseException | None], None]) -> bool:
        background = getattr(self.instances, "attach_in_background", None)
        if node in self.private or background is None:
            return False
        background(node, slots, done, **self._spot(node))
        return True

    def attach_private_in_background(self, node: str, done: Callable[[AgentClient | None, BaseException | None], None],
                                     on_retry: Callable[[BaseException], None], expect: tuple[Run, ...] = ()) -> bool:
        """Attach a private node reached over SSH on a thread of its own, retried for its grace
        (:meth:`~broker.shells.nodes.SshAgents.attach_in_background`: bounded concurrency
        across nodes); False for a node attached in the caller's thread (``local``)."""
        private = self.private.get(node)
        if private is None or private.local or self.remote is None:
            return False
        self.remote.attach_in_background(private, done, expect=expect, on_retry=on_retry)
        return True

    def attach_local_in_background(self, node: str, done: Callable[[AgentClient | None, BaseException | None], None]
                                   ) -> bool:
        """Start a ``local`` private node's agent off the caller's thread, tried once (at most 8
        at once: :meth:`~broker.shells.nodes.LocalAgents.attach_in_background`); False if it
        is not such a node."""
        private = self.private.get(node)
        background = getattr(self.local, "attach_in_background", None)
        if private is None or not private.local or background is None:
            return False
        background(node, private.slots, done)
        return True

    def grace_s(self, node: str) -> float | None:
        """How long a private node reached over SSH that stops answering is waited for (its
        ``grace``); None for nodes re-attached at once (local agents, instances)."""
        private = self.private.get(node)
        return None if private is None or private.local or self.remote is None else private.grace_s

    def reconnect_in_background(self, node: str, done: Callable[[Any, BaseException | None], None]) -> None:
        """Reconnect a private node's link for its grace, off the caller's thread (see
        :meth:`~broker.shells.nodes.SshAgents.reconnect_in_background`)."""
        self.remote.reconnect_in_background(self.private[node], done)

    def reattach(self, node: str, slots: int, client: AgentClient) -> None:
        private = self.private.get(node)
        if private is None:
            self.instances.reattach(node, slots, client, **self._spot(node))
        elif private.local:
            self.local.reattach(node, slots, client)
        else:
            self.remote.reattach(private, client)

    def stop(self, node: str, client: AgentClient | None) -> None:
        private = self.private.get(node)
        agents = self.instances if private is None else self._private_agents(private)
        if agents is not None:
            agents.stop(node, client)

    def fetch(self, node: str, workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]:
        private = self.private.get(node)
        agents = self.instances if private is None else self._private_agents(private)
        return agents.fetch(node, workdir, path, dest, env)
