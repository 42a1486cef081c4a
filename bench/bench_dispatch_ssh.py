"""Dispatch throughput through worker agents over SSH on loopback, against local pipes.

    python3 bench/bench_dispatch_ssh.py [--tasks 3000] [--agents 1,4,16] [--slots 4]

For each agent count k: k agents (one SSH connection each to a test sshd on 127.0.0.1,
the agent shipped by SFTP and attached through a channel), fed like the live daemon feeds
them: every agent keeps ``2 * slots`` attempts in flight, each Result is answered with the
next batch of Runs and acknowledged in bulk. Tasks are ``true``, so the figure is the
broker's dispatch ceiling (protocol, transport, and the agent's fork/exec of ``/bin/sh``),
not work. The same run over local pipes gives the ratio SSH costs. Goal: >= 300 tasks/s.
No asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import structlog  # noqa: E402

from bench.bench_dispatch import ORPHAN_LEASE_S  # noqa: E402  (a killed bench's agents stop by themselves)
from broker.shells.agent_client import AgentClient, NodeLost  # noqa: E402
from broker.shells.local_transport import connect_local_agent, stop_local_agent  # noqa: E402
from broker.shells.ssh import SshSession, SshTarget, connect  # noqa: E402
from broker.shells.transport import Transport  # noqa: E402
from tests.sshd import TestSshd, running_sshd  # noqa: E402
from workers.protocol import Result, Run  # noqa: E402



def dispatch(clients: list[AgentClient], inbox: queue.Queue[tuple[str, Any]], tasks: int, in_flight: int) -> float:
    """Run ``tasks`` trivial tasks across ``clients``; return tasks per second."""
    by_node = {c.node: c for c in clients}
    next_id = 0
    done = 0

    def feed(client: AgentClient, count: int) -> None:
        nonlocal next_id
        count = min(count, tasks - next_id)
        if count > 0:
            client.submit([Run(f"t{next_id + i}", 1, "true") for i in range(count)])
            next_id += count

    started = time.perf_counter()
    for client in clients:
        feed(client, in_flight)
    while done < tasks:
        finished: dict[str, list[tuple[str, int]]] = {}
        node, event = inbox.get(timeout=60)
        batch = [(node, event)]
        while True:  # take everything that is already there: one submit per agent per pass
            try:
                batch.append(inbox.get_nowait())
            except queue.Empty:
                break
        for node, event in batch:
            if isinstance(event, NodeLost):
                raise RuntimeError(f"{node} lost: {event.reason}")
            if isinstance(event, Result):
                if event.exit_code != 0:
                    raise RuntimeError(f"task {event.task} failed: {event}")
                finished.setdefault(node, []).append((event.task, event.attempt))
        for node, keys in finished.items():
            done += len(keys)
            by_node[node].ack(keys)
            feed(by_node[node], len(keys))
    return tasks / (time.perf_counter() - started)


def run_once(attach: Callable[[int], Transport], agents: int, tasks: int, slots: int) -> float:
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
    clients = [AgentClient(attach(i), f"node-{i}", inbox=inbox) for i in range(agents)]
    try:
        return dispatch(clients, inbox, tasks, in_flight=2 * slots)
    finally:
        for client in clients:
            client.close()


def ssh_attacher(
    server: TestSshd, base: Path, round_name: str, slots: int
) -> tuple[Callable[[int], Transport], list[SshSession]]:
    target = SshTarget(
        host=server.host,
        port=server.port,
        user=server.user,
        key_path=str(server.client_key_path),
        known_hosts_path=str(server.known_hosts_path),
    )
    sessions: list[SshSession] = []
    agent_dir = ""

    def attach(index: int) -> Transport:
        nonlocal agent_dir
        session = connect(target)
        sessions.append(session)
        if not agent_dir:
            agent_dir = session.deploy_agent(str(base / "agent"))
        state_dir = base / "ssh" / f"{round_name}-node-{index}"
        return session.open_stream(
            f"python3 {shlex.quote(agent_dir + '/agent.py')} attach "
            f"--state-dir {shlex.quote(str(state_dir))} --slots {slots} --node node-{index}"
        )

    return attach, sessions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--agents", default="1,4,16")
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args()
    counts = [int(k) for k in args.agents.split(",")]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only

    rows = []
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        try:
            with running_sshd(base / "sshd") as server:
                for agents in counts:
                    attach_ssh, sessions = ssh_attacher(server, base, f"k{agents}", args.slots)
                    ssh_rate = run_once(attach_ssh, agents, args.tasks, args.slots)
                    for session in sessions:
                        session.close()

                    def attach_local(index: int) -> Transport:
                        return connect_local_agent(base / "local" / f"k{agents}-node-{index}", args.slots,
                                                   lease_s=ORPHAN_LEASE_S)

                    local_rate = run_once(attach_local, agents, args.tasks, args.slots)
                    rows.append((agents, ssh_rate, local_rate))
        finally:
            for transport in ("ssh", "local"):
                for state_dir in (base / transport).glob("*-node-*"):
                    stop_local_agent(state_dir, timeout_s=5.0)

    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"# python3 bench/bench_dispatch_ssh.py --tasks {args.tasks} --agents {args.agents} --slots {args.slots}")
    print(f"# {args.tasks} tasks of `true`, {args.slots} slots and {2 * args.slots} in flight per agent; goal >= 300 tasks/s")
    print(f"{'agents':>6} {'ssh tasks/s':>12} {'local tasks/s':>14} {'ssh/local':>10}")
    for agents, ssh_rate, local_rate in rows:
        print(f"{agents:>6} {ssh_rate:>12.0f} {local_rate:>14.0f} {ssh_rate / local_rate:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
