"""The master-side client against a scripted agent over an in-memory transport pair."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from broker.shells.agent_client import AgentClient, HandshakeError, NodeLost, TaskLost
from broker.shells.transport import Transport, TransportClosed
from workers.protocol import NEED_DATA, Ack, Connection, Hello, Ping, Pong, Result, Run, Started


class MemoryPipe:
    """One end of an in-memory byte stream pair implementing the Transport contract."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[bytes] = queue.Queue()
        self.peer: MemoryPipe | None = None
        self._closed = False

    @classmethod
    def pair(cls) -> tuple[MemoryPipe, MemoryPipe]:
        a, b = cls(), cls()
        a.peer, b.peer = b, a
        return a, b

    def send(self, data: bytes) -> None:
        if self._closed or self.peer is None or self.peer._closed:
            raise TransportClosed("closed")
        self.peer.inbox.put(data)

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None:
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.inbox.put(b"")
            if self.peer is not None:
                self.peer.inbox.put(b"")

    @property
    def closed(self) -> bool:
        return self._closed


class ScriptedAgent:
    """The agent's end, driven by the test: greet, read what the master sent, reply."""

    def __init__(self, pipe: MemoryPipe) -> None:
        self.pipe = pipe
        self.conn = Connection("agent")
        self.seen: list = []

    def greet(self, running=(), results=()) -> None:
        hello = Hello(role="agent", node="fake", slots=2, running=tuple(running), pending_results=len(results))
        self.pipe.send(self.conn.send_all([hello, *results]))

    def send(self, *messages) -> None:
        self.pipe.send(self.conn.send_all(list(messages)))

    def read(self, count: int, timeout_s: float = 2.0) -> list:
        """The next ``count`` messages from the master."""
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < count and time.monotonic() < deadline:
            data = self.pipe.recv(timeout_s=0.05)
            if data:
                self.conn.receive_data(data)
                while (event := self.conn.next_event()) is not NEED_DATA:
                    self.seen.append(event)
        taken, self.seen = self.seen[:count], self.seen[count:]
        return taken


def start(agent_greeting=None, **options) -> tuple[AgentClient, ScriptedAgent]:
    """A client whose handshake the scripted agent answers from a helper thread."""
    master_end, agent_end = MemoryPipe.pair()
    agent = ScriptedAgent(agent_end)

    def answer() -> None:
        assert isinstance(agent.read(1)[0], Hello)
        (agent_greeting or agent.greet)()

    helper = threading.Thread(target=answer)
    helper.start()
    client = AgentClient(master_end, "n1", **options)
    helper.join()
    return client, agent


def events_for(client: AgentClient, seconds: float) -> list:
    """Every event within ``seconds``: for what must NOT happen (a loaded machine can only
    make it miss one, never invent one)."""
    events, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        events += client.poll(0.05)
    return events


def events_until(client: AgentClient, count: int, guard_s: float = 30.0) -> list:
    """The events until ``count`` of them arrived (``guard_s`` is a hang guard, not a speed
    limit), and any more that follow within 0.2 s."""
    events, deadline = [], time.monotonic() + guard_s
    while len(events) < count and time.monotonic() < deadline:
        events += client.poll(0.05)
    return events + events_for(client, 0.2)


def test_the_memory_pipe_meets_the_transport_contract():
    assert isinstance(MemoryPipe(), Transport)


def test_submit_is_one_batched_write_and_results_flow_back():
    client, agent = start()
    assert client.hello.slots == 2
    runs = [Run(f"t{i}", 1, "true") for i in range(5)]
    client.submit(runs)
    assert agent.pipe.inbox.qsize() == 1  # all five Runs in one write
    assert agent.read(5) == runs
    agent.send(Started("t0", 1, 10), Result("t0", 1, 0, 0.1))
    assert events_until(client, 2) == [Started("t0", 1, 10), Result("t0", 1, 0, 0.1)]
    assert sorted(client.outstanding()) == [(f"t{i}", 1) for i in range(1, 5)]
    client.close()


def test_a_client_told_not_to_deliver_started_puts_only_results_on_the_inbox():
    """Issue 20: the daemon's loop has no use for Started; each one woke it and cost a turn's
    drain. A client made with started=False delivers the Result, not the Started."""
    client, agent = start(started=False)
    client.submit([Run("t0", 1, "true")])
    agent.read(1)
    agent.send(Started("t0", 1, 10), Result("t0", 1, 0, 0.1), Started("t1", 1, 11))
    assert events_until(client, 1) == [Result("t0", 1, 0, 0.1)]
    client.close()


def test_a_replayed_result_is_delivered_once_and_re_acked():
    client, agent = start()
    client.submit([Run("t", 1, "true")])
    agent.read(1)
    agent.send(Result("t", 1, 0, 1.0), Result("t", 1, 0, 1.0), Started("t", 1, 5), Started("t", 1, 5))
    assert events_until(client, 2) == [Result("t", 1, 0, 1.0), Started("t", 1, 5)]
    client.ack([("t", 1)])
    assert agent.read(1) == [Ack("t", 1)]
    agent.send(Result("t", 1, 0, 1.0))  # the ack was lost: the agent replays it again
    assert events_for(client, 0.2) == []
    assert agent.read(1) == [Ack("t", 1)]  # acknowledged again, silently
    client.close()


def test_a_silent_agent_is_pinged_then_reported_lost():
    before_hello = time.monotonic()  # the agent's greeting, the last thing it says, comes after
    client, agent = start(ping_interval_s=0.1, dead_after_s=0.5)
    lost = None
    while lost is None and time.monotonic() - before_hello < 30:  # a hang guard, not a speed limit
        lost = next((e for e in client.poll(0.1) if isinstance(e, NodeLost)), None)
    assert lost == NodeLost("n1", "silent for 0.5 s")
    assert time.monotonic() - before_hello >= 0.5
    pings = agent.read(100, timeout_s=0.2)
    assert pings and all(isinstance(p, Ping) for p in pings)
    assert [p.seq for p in pings] == list(range(1, len(pings) + 1))


class StallingPipe(MemoryPipe):
    """Once ``stall_s`` is set, the next read that waits in vain returns only that much later:
    the client's reader thread held up, as on a loaded machine or a laptop woken from sleep.
    What arrives meanwhile is there for the next read."""

    stall_s = 0.0

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None:
        data = super().recv(max_bytes, timeout_s)
        if data is None and self.stall_s:
            stall, self.stall_s = self.stall_s, 0.0
            time.sleep(stall)
        return data


def test_a_master_held_up_past_dead_after_pings_before_it_reports_the_agent_lost():
    """Regression: a reader thread that woke up after more than ``dead_after_s`` (a loaded
    machine) reported a live agent lost without ever asking it."""
    master_end, agent_end = StallingPipe(), MemoryPipe()
    master_end.peer, agent_end.peer = agent_end, master_end
    agent = ScriptedAgent(agent_end)
    helper = threading.Thread(target=lambda: (agent.read(1), agent.greet()))
    helper.start()
    client = AgentClient(master_end, "n1", ping_interval_s=0.1, dead_after_s=1.0)
    helper.join()
    stop = threading.Event()

    def pong() -> None:
        while not stop.is_set():
            for ping in agent.read(1, timeout_s=0.05):
                agent.send(Pong(ping.seq))

    master_end.stall_s = 2.0
    responder = threading.Thread(target=pong)
    responder.start()
    try:
        assert events_for(client, 3.0) == []
    finally:
        stop.set()
        responder.join()
        client.close()


def test_an_agent_answering_pings_stays_alive():
    client, agent = start(ping_interval_s=0.1, dead_after_s=1.0)
    stop = threading.Event()

    def pong() -> None:
        while not stop.is_set():
            for ping in agent.read(1, timeout_s=0.05):
                agent.send(Pong(ping.seq))

    responder = threading.Thread(target=pong)
    responder.start()
    try:
        assert events_for(client, 2.0) == []  # twice dead_after_s: unanswered, it would be lost
    finally:
        stop.set()
        responder.join()
        client.close()


def test_reattach_reports_attempts_the_agent_forgot():
    client, agent = start()
    client.submit([Run("running", 1, "x"), Run("finished", 1, "x"), Run("forgotten", 1, "x")])
    agent.read(3)
    agent.pipe.close()  # the connection drops
    assert [type(e) for e in events_until(client, 1)] == [NodeLost]

    master_end, agent_end = MemoryPipe.pair()
    fresh = ScriptedAgent(agent_end)

    def answer() -> None:
        fresh.read(1)
        fresh.greet(running=[("running", 1)], results=[Result("finished", 1, 0, 2.0)])

    helper = threading.Thread(target=answer)
    helper.start()
    hello = client.reattach(master_end)
    helper.join()
    assert hello.pending_results == 1
    events = events_until(client, 2)
    assert events == [Result("finished", 1, 0, 2.0), TaskLost("forgotten", 1, "the agent on n1 no longer knows this attempt")]
    assert client.outstanding() == [("running", 1)]
    client.close()


def test_an_agent_that_never_says_hello_fails_the_handshake_in_time():
    master_end, _ = MemoryPipe.pair()
    started = time.monotonic()
    with pytest.raises(HandshakeError, match="no Hello from the agent within 0.3 s"):
        AgentClient(master_end, "mute", handshake_timeout_s=0.3)
    assert time.monotonic() - started < 8.0  # a guard: it gave up after 0.3 s, not the default 10 s
    assert master_end.closed


def test_a_shared_inbox_tags_events_with_their_node():
    inbox: queue.Queue = queue.Queue()
    client, agent = start(inbox=inbox)
    agent.send(Started("t", 1, 3))
    assert inbox.get(timeout=30.0) == ("n1", Started("t", 1, 3))
    with pytest.raises(RuntimeError, match="shared inbox"):
        client.poll(0)
    client.close()


def test_work_sent_on_a_broken_link_stays_outstanding_and_is_not_raised():
    client, agent = start()
    agent.pipe.close()
    assert [type(e) for e in events_until(client, 1)] == [NodeLost]
    client.submit([Run("late", 1, "x")])  # no exception into the caller's loop
    client.ack([("other", 1)])
    assert client.outstanding() == [("late", 1)]
    client.close()
    with pytest.raises(TransportClosed):
        client.submit([Run("after-close", 1, "x")])


def test_shutdown_then_close_by_the_agent_is_not_a_loss():
    client, agent = start()
    client.shutdown(drain=True)
    agent.read(1)
    agent.pipe.close()
    assert client.wait_closed(30.0)
    assert events_for(client, 0.2) == []


# -- regression: a reader that dies reports its node lost ---------------------------------
def test_a_recursion_error_line_from_the_agent_reports_the_node_lost():
    client, agent = start()
    agent.pipe.send(b'{"type":"result","task":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    lost = [e for e in events_for(client, 1.0) if isinstance(e, NodeLost)]
    assert len(lost) == 1 and "broke the protocol" in lost[0].reason and "RecursionError" in lost[0].reason


def test_a_reader_thread_that_dies_for_any_reason_reports_the_node_lost(monkeypatch):
    client, agent = start()

    def broken(link, message):
        raise KeyError("a bug in the bookkeeping")

    monkeypatch.setattr(client, "_on_message", broken)
    agent.send(Started("t1", 1, pid=42))
    lost = [e for e in events_for(client, 1.0) if isinstance(e, NodeLost)]
    assert len(lost) == 1 and "KeyError" in lost[0].reason
