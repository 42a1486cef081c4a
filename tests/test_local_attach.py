"""Local agents (the local node, a dry run's instances) attach off the loop, several at once,
and a stop meanwhile leaves no agent behind (LocalAgents.attach_in_background)."""

from __future__ import annotations

import queue
import threading
import time

from broker.shells.local_transport import local_agent_pid
from broker.shells.nodes import LocalAgents, agent_dir


def test_local_agents_attach_in_the_background_and_a_stop_meanwhile_leaves_no_agent(tmp_path, monkeypatch):
    agents = LocalAgents(tmp_path, queue.Queue())
    results: dict = {}
    threads: set = set()
    finished = threading.Event()
    gate = threading.Event()
    attach = agents.attach

    def attach_i2_once_stopped(node, slots, expect=(), spot=False):
        if node == "i2":
            gate.wait(30)  # its agent starts only after the stop below
        return attach(node, slots, expect, spot=spot)

    monkeypatch.setattr(agents, "attach", attach_i2_once_stopped)

    def done_for(node):
        def done(client, error):
            threads.add(threading.current_thread())
            results[node] = (client, error)
            if len(results) == 4:
                finished.set()
        return done

    for i in range(4):
        agents.attach_in_background(f"i{i}", 1, done_for(f"i{i}"))
    agents.stop("i2", None)  # released before its agent answered
    gate.set()
    assert finished.wait(60)
    try:
        assert threading.current_thread() not in threads  # attached off the caller's thread
        for node in ("i0", "i1", "i3"):
            client, error = results[node]
            assert error is None and client.hello.slots == 1
        client, error = results["i2"]
        assert client is None and isinstance(error, ConnectionAbortedError)
        deadline = time.monotonic() + 10
        while local_agent_pid(agent_dir(tmp_path, "i2")) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert local_agent_pid(agent_dir(tmp_path, "i2")) is None
    finally:
        for node in ("i0", "i1", "i3"):
            agents.stop(node, results.get(node, (None, None))[0])
