"""Private nodes attached at start-up in parallel, and retried (issue 18, item 2).

``SshAgents`` tries its nodes on threads of their own: at most ``concurrency`` tries
(connect and ship the agent) are under way at once, however many nodes there are; a try
that failed for want of an answer is retried with backoff for the time given, and the first
retry is told (``on_retry``) so the daemon can say on the console that it waits; a node
that refuses us (host key, our key, no key) is never retried. The SSH side is replaced by a
fake ``_open_once``: these tests check what the class decides, not a network.
"""

from __future__ import annotations

import queue
import threading
import time
import types

import pytest

import broker.shells.nodes as nodes_module
from broker.core.model import PrivateNode
from broker.shells.nodes import SshAgents
from broker.shells.ssh import AuthenticationFailed, HostKeyUnknown, HostUnreachable


def _node(name: str) -> PrivateNode:
    return PrivateNode(name=name, slots=2, host="192.0.2.1", user="u", key="/nonexistent/key")


@pytest.fixture
def no_pauses(monkeypatch):
    """Pauses between tries are recorded, not slept."""
    pauses: list[float] = []
    monkeypatch.setattr(nodes_module, "time", types.SimpleNamespace(monotonic=time.monotonic,
                                                                     sleep=pauses.append))
    return pauses


def test_at_most_concurrency_tries_are_under_way_at_once():
    agents = SshAgents("run-1", queue.Queue(), concurrency=8)
    lock, release = threading.Lock(), threading.Event()
    state = {"now": 0, "most": 0}

    def open_once(node):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        release.wait(60)
        with lock:
            state["now"] -= 1
        return f"stream-{node.name}"

    agents._open_once = open_once
    opened: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=f"n{i}": opened.__setitem__(n, agents._open(_node(n), 120.0)))
               for i in range(20)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while state["now"] < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the other twelve are blocked at the gate, not connecting
    assert state["now"] == 8
    release.set()
    for t in threads:
        t.join(60)
    assert state["most"] == 8
    assert opened == {f"n{i}": f"stream-n{i}" for i in range(20)}  # every node attached in the end


def test_a_node_that_does_not_answer_is_retried_with_backoff_and_the_first_retry_is_told(no_pauses):
    agents = SshAgents("run-1", queue.Queue(), max_delay_s=4.0)
    tries = []

    def open_once(node):
        tries.append(node.name)
        if len(tries) < 5:
            raise HostUnreachable("cannot reach 192.0.2.1:22: no answer within 10 s")
        return "stream"

    agents._open_once = open_once
    told: list[BaseException] = []
    assert agents._open(_node("lab"), 600.0, told.append) == "stream"
    assert len(tries) == 5 and no_pauses == [1.0, 2.0, 4.0, 4.0]
    assert len(told) == 1 and isinstance(told[0], HostUnreachable)


def test_a_node_not_reached_within_its_time_gives_up_saying_how_long_it_tried(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(nodes_module, "time", types.SimpleNamespace(
        monotonic=lambda: clock["t"], sleep=lambda s: clock.__setitem__("t", clock["t"] + s)))
    agents = SshAgents("run-1", queue.Queue(), max_delay_s=30.0)

    def open_once(node):
        clock["t"] += 10.0  # each try waits out its connect timeout
        raise HostUnreachable("cannot reach 192.0.2.1:22: no answer within 10 s")

    agents._open_once = open_once
    with pytest.raises(HostUnreachable, match=r"gave up after \d+ tries in 120 s"):
        agents._open(_node("lab"), 120.0)
    assert clock["t"] >= 120.0


@pytest.mark.parametrize("refusal", [
    HostKeyUnknown("host key for 192.0.2.1:22 is not in known_hosts"),
    AuthenticationFailed("192.0.2.1:22 refused key /k for user 'u'"),
    ValueError("private node 'lab' has no key to log in with"),
])
def test_a_node_that_refuses_us_is_not_retried(no_pauses, refusal):
    agents = SshAgents("run-1", queue.Queue())
    tries = []

    def open_once(node):
        tries.append(node.name)
        raise refusal

    agents._open_once = open_once
    told: list[BaseException] = []
    with pytest.raises(type(refusal)):
        agents._open(_node("lab"), 600.0, told.append)
    assert tries == ["lab"] and no_pauses == [] and told == []


def test_an_attach_that_succeeds_after_stop_stops_the_agent_it_started():
    agents = SshAgents("run-1", queue.Queue())
    stopped = []
    agents._open_once = lambda node: "stream"
    nodes_module_client = types.SimpleNamespace(shutdown=lambda drain: stopped.append("shutdown"),
                                                wait_closed=lambda s: True, close=lambda: stopped.append("close"))
    original = nodes_module.AgentClient
    nodes_module.AgentClient = lambda *a, **k: (agents.abandon("lab"), nodes_module_client)[1]
    try:
        done = threading.Event()
        result = {}

        def finished(client, error):
            result.update(client=client, error=error)
            done.set()

        agents.attach_in_background(_node("lab"), finished, timeout_s=60)
        assert done.wait(30)
    finally:
        nodes_module.AgentClient = original
    assert result["client"] is None and isinstance(result["error"], ConnectionAbortedError)
    assert stopped == ["shutdown", "close"]  # nobody is left to take it: its agent is stopped


def test_a_resume_reaches_its_nodes_agents_at_once():
    """On resume the agents are reached in parallel too, each told what the journal says it
    runs: the fake attach below only succeeds once all three are under way together (one
    after another, the barrier breaks)."""
    from broker.shells.run.resume import _attach_all

    barrier = threading.Barrier(3, timeout=30)
    calls = []

    def attach(node, slots, expect):
        calls.append((node, slots, expect))
        barrier.wait()
        return f"client-{node}"

    ledger = types.SimpleNamespace(nodes={n: types.SimpleNamespace(slots=2) for n in ("h0", "h1", "h2")})
    daemon = types.SimpleNamespace(ledger=ledger, nodes=types.SimpleNamespace(attach=attach), tasks={"t1"},
                                   _run_of=lambda task, attempt: (task, attempt))
    running = {"h1": [types.SimpleNamespace(task_id="t1", attempt=3), types.SimpleNamespace(task_id="gone", attempt=1)]}
    outcome = _attach_all(daemon, ["h0", "h1", "h2"], running)
    assert outcome == {n: (f"client-{n}", None) for n in ("h0", "h1", "h2")}
    assert sorted(calls) == [("h0", 2, ()), ("h1", 2, (("t1", 3),)), ("h2", 2, ())]
