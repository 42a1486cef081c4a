"""One I/O thread serves every agent connection (broker/shells/agent_hub.py).

Hundreds of in-process fake agents (broker/shells/fake_agents.py, over socketpairs) are
attached to the master: the number of threads does not grow with them, each task is
completed exactly once, and a connection that drops or falls silent is still reported as
the node lost.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter

from structlog.testing import capture_logs

from broker.shells.agent_client import AgentClient, NodeLost
from broker.shells.agent_hub import AgentHub
from broker.shells.fake_agents import FakeAgents
from workers.protocol import Progress, Result, Run

AGENTS = 300


def _attach(fakes: FakeAgents, count: int, inbox: queue.Queue, **options) -> dict[str, AgentClient]:
    return {f"n{i}": AgentClient(fakes.connect(f"n{i}", 2), f"n{i}", inbox=inbox, **options) for i in range(count)}


def test_hundreds_of_agents_are_served_by_one_thread_and_each_task_completes_once():
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        before = threading.active_count()
        clients = _attach(fakes, AGENTS, inbox)
        during = threading.active_count()
        # The threads do not grow with the agents: the hub (started once per process) at most.
        assert during - before <= 1, (before, during)
        assert not [t for t in threading.enumerate() if t.name.startswith("agent-n")]
        hub_threads = [t for t in threading.enumerate() if t.name == "agent-hub"]
        assert len(hub_threads) == 1
        tasks = {name: [Run(f"{name}-t{k}", 1, ":") for k in range(5)] for name in clients}
        for name, client in clients.items():
            client.submit(tasks[name])
        results: Counter = Counter()
        deadline = time.monotonic() + 120
        while sum(results.values()) < AGENTS * 5 and time.monotonic() < deadline:
            node, event = inbox.get(timeout=30)
            assert not isinstance(event, NodeLost), event
            if isinstance(event, Result):
                assert event.ok
                assert event.task.startswith(node + "-")
                results[event.task] += 1
                clients[node].ack([(event.task, event.attempt)])
        assert len(results) == AGENTS * 5
        assert set(results.values()) == {1}
        assert set(fakes.runs.values()) == {1}
        assert all(not c.outstanding() for c in clients.values())
        assert threading.active_count() - before <= 1
        for client in clients.values():
            client.close()


def test_a_dropped_connection_among_hundreds_is_reported_as_that_node_lost():
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        clients = _attach(fakes, 100, inbox)
        fakes.drop("n37")
        node, event = inbox.get(timeout=10)
        assert (node, type(event)) == ("n37", NodeLost)
        assert "closed the connection" in event.reason
        time.sleep(0.2)
        assert inbox.empty()  # nobody else was lost
        for client in clients.values():
            client.close()
        assert inbox.empty()  # closing on purpose loses nothing


def test_a_silent_agent_on_the_hub_is_lost_after_dead_after_s(monkeypatch):
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes, capture_logs() as logs:
        clients = _attach(fakes, 3, inbox, ping_interval_s=0.1, dead_after_s=0.4)
        # n1 goes mute: it still reads, but never answers a Ping again.
        fake = next(f for f in fakes._fakes.values() if f.node == "n1")
        monkeypatch.setattr(fake.conn, "send", lambda message: b"")
        node, event = inbox.get(timeout=10)
        assert (node, type(event)) == ("n1", NodeLost)
        assert "silent" in event.reason
        time.sleep(0.5)  # the others keep answering their pings
        assert inbox.empty()
        for client in clients.values():
            client.close()
    assert [e["node"] for e in logs if e["event"] == "agent.lost"] == ["n1"]
    assert not [e for e in logs if e["event"] == "agent.reader_failed"]  # pings are no failure


def test_the_hub_is_one_per_process():
    assert AgentHub.shared() is AgentHub.shared()


def _daemon_on_fakes(tmp_path, fakes: FakeAgents, agents: int, tasks: int, on_progress=None, command=":",
                     **client_options):
    from broker.core.control.controller import ControllerConfig
    from broker.core.goal import Goal
    from broker.core.model import Bag, Inventory, PrivateNode, Task
    from broker.shells.clock import RunClock
    from broker.shells.fake_agents import FakeNodes
    from broker.shells.journal import Journal
    from broker.shells.run import Daemon, DaemonOptions

    inventory = Inventory(private=tuple(PrivateNode(f"n{i:03d}", 2, host="fake") for i in range(agents)))
    bag = Bag(tasks=tuple(Task(f"t{i:05d}", command) for i in range(tasks)), timeout_s=600.0)
    inbox: queue.Queue = queue.Queue()
    clock = RunClock(1.0)
    with Journal.open(tmp_path, clock=clock.now_s, anchor_s=clock.epoch_anchor_s) as journal:
        journal.create_run("hub", goal_kind="theta", goal_value=1.0, retries=bag.retries, tasks=bag.tasks)
        nodes = FakeNodes(fakes, inbox, 2, **client_options)
        daemon = Daemon(inventory, bag, Goal(), DaemonOptions(run_dir=tmp_path, run_id="hub", tick_s=60.0),
                        journal=journal, clock=clock, fleet=None, nodes=nodes, inbox=inbox,
                        config=ControllerConfig(tick_s=60.0, margin_s=120.0), on_progress=on_progress)
        report = daemon.run()
        nodes.pool.shutdown()
        return report, journal.events()


def test_the_daemon_runs_each_task_once_on_hundreds_of_fake_agents_without_a_thread_each(tmp_path):
    threads: list[int] = []
    with FakeAgents() as fakes:
        report, events = _daemon_on_fakes(tmp_path, fakes, 200, 1000,
                                          on_progress=lambda *_: threads.append(threading.active_count()))
    assert report.tasks_done == 1000 and report.tasks_failed == 0
    done = Counter(fields["task"] for _, name, fields in events if name == "task.done")
    assert len(done) == 1000 and set(done.values()) == {1}
    assert set(fakes.runs.values()) == {1}  # no task was sent twice
    assert max(threads) < 40  # 200 agents, and no thread for any of them


def test_started_messages_between_results_do_not_cut_a_turns_results_into_one_result_batches(tmp_path, monkeypatch):
    """Started (and Progress) change nothing the ledger keeps, so they do not flush the turn's
    results held for one journal batch: with every Started delivered to the loop (a client made
    with started=True; the fake agents send one before each Result) the results used to go one by
    one (six statements each), and bench_scale's master cost 0.121 ms a task instead of 0.085."""
    from broker.shells.journal import Journal

    sizes: list[int] = []
    batch = Journal.tasks_finished
    monkeypatch.setattr(Journal, "tasks_finished", lambda self, results: (sizes.append(len(results)),
                                                                           batch(self, results))[1])
    with FakeAgents() as fakes:
        report, events = _daemon_on_fakes(tmp_path, fakes, 8, 400, started=True)
    assert report.tasks_done == 400 and sum(sizes) == 400
    assert max(sizes) >= 8 and len(sizes) <= 100, sizes  # a turn's results together, not 400 batches of one
    done = Counter(fields["task"] for _, name, fields in events if name == "task.done")
    assert len(done) == 400 and set(done.values()) == {1}


def test_the_daemon_detects_a_dropped_fake_agent_and_still_runs_each_task_once(tmp_path):
    dropped: list[str] = []

    with FakeAgents() as fakes:
        def drop_one(done, *_):
            if done >= 200 and not dropped:
                dropped.append("n007")
                fakes.drop("n007")

        report, events = _daemon_on_fakes(tmp_path, fakes, 50, 1000, on_progress=drop_one)
    assert dropped
    assert report.tasks_done == 1000 and report.tasks_failed == 0
    done = Counter(fields["task"] for _, name, fields in events if name == "task.done")
    assert len(done) == 1000 and set(done.values()) == {1}
    reattached = [fields for _, name, fields in events if name == "agent.reattached"]
    assert [f["node"] for f in reattached] == ["n007"]


def test_the_daemon_goes_on_past_a_fake_agent_that_stops_reading_and_reruns_its_tasks(tmp_path):
    """Regression: the daemon hung for good once one agent's socket was full (the write
    blocked, holding that client's lock, and the hub blocked on the lock at its next ping)."""
    stalled: list[str] = []
    outcome: dict = {}
    with FakeAgents() as fakes:
        def stall_one(done, *_):
            if done >= 100 and not stalled:
                stalled.append("n007")
                fakes.stall("n007", buffer_bytes=4096)  # full at once: a Run here is 16 KiB

        def run() -> None:
            outcome["out"] = _daemon_on_fakes(tmp_path, fakes, 20, 400, on_progress=stall_one,
                                              command=": " + "x" * (16 << 10),
                                              ping_interval_s=0.2, dead_after_s=1.0)

        daemon = threading.Thread(target=run, name="test-daemon", daemon=True)
        daemon.start()
        daemon.join(90)
        assert not daemon.is_alive(), "the daemon hung on an agent that stopped reading"
    assert stalled
    report, events = outcome["out"]
    assert report.tasks_done == 400 and report.tasks_failed == 0
    done = Counter(fields["task"] for _, name, fields in events if name == "task.done")
    assert len(done) == 400 and set(done.values()) == {1}
    assert set(fakes.runs.values()) == {1}  # what the stalled agent was sent it never ran
    requeued = [f for _, name, f in events if name == "task.failed"]  # lost with n007, run again
    assert requeued and all(f["lost"] and not f["final"] and f["node"] == "n007" for f in requeued), requeued
    assert [f["node"] for _, name, f in events if name == "agent.reattached"] == ["n007"]


def test_a_failure_in_one_links_bookkeeping_loses_that_node_only_and_the_hub_goes_on(monkeypatch):
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        clients = _attach(fakes, 3, inbox)

        def broken(link, message):
            raise RuntimeError("bookkeeping bug")

        monkeypatch.setattr(clients["n1"], "_on_message", broken)
        for name, client in clients.items():
            client.submit([Run(f"{name}-t", 1, ":")])
        seen = {}
        while len(seen) < 3:
            node, event = inbox.get(timeout=10)
            if isinstance(event, (NodeLost, Result)):
                seen[node] = event
        assert isinstance(seen["n1"], NodeLost) and "bookkeeping bug" in seen["n1"].reason
        assert isinstance(seen["n0"], Result) and isinstance(seen["n2"], Result)
        clients["n0"].submit([Run("n0-again", 1, ":")])  # the hub still serves the others
        node, event = inbox.get(timeout=10)
        while not isinstance(event, Result):
            node, event = inbox.get(timeout=10)
        assert (node, event.task) == ("n0", "n0-again")
        for client in clients.values():
            client.close()


class _Recorder:
    def __init__(self):
        self.data: list[bytes] = []
        self.ended = threading.Event()
        self.reason = None

    def hub_data(self, data, now):
        self.data.append(data)
        return "" if data == b"" else None

    def hub_timer(self, now):
        return now + 60.0

    def hub_end(self, reason):
        self.reason = reason
        self.ended.set()


def test_a_link_closed_while_its_descriptor_number_is_reused_still_ends(monkeypatch):
    """Regression: a transport closed from outside, whose descriptor number a new link took
    before the hub handled the close, was never ended (its node never reported lost)."""
    import socket

    from broker.shells.transport import SocketTransport

    hub = AgentHub()
    a_master, a_peer = socket.socketpair()
    old, old_watcher = SocketTransport(a_master), _Recorder()
    hub.watch(old, old_watcher, time.monotonic() + 60)
    held = []
    real_post = hub._post
    monkeypatch.setattr(hub, "_post", held.append)  # the hub sees the close only later
    old_fd = old.fileno()
    old.close()
    b_master, b_peer = socket.socketpair()
    new, new_watcher = SocketTransport(b_master), _Recorder()
    assert new.fileno() == old_fd  # the number was reused
    monkeypatch.setattr(hub, "_post", real_post)
    hub.watch(new, new_watcher, time.monotonic() + 60)
    for w in held:
        real_post(w)
    assert old_watcher.ended.wait(5), "the old link was never ended"
    b_peer.sendall(b"hello")
    deadline = time.monotonic() + 5
    while not new_watcher.data and time.monotonic() < deadline:
        time.sleep(0.01)
    assert new_watcher.data == [b"hello"] and not new_watcher.ended.is_set()
    new.close()
    assert new_watcher.ended.wait(5)
    a_peer.close()
    b_peer.close()


def test_an_agent_whose_descriptors_are_past_1024_is_served(tmp_path):
    """Regression: the transports waited with select(), which refuses descriptors past 1,023:
    a master with a thousand agents (two or more descriptors each) lost every later one."""
    import os
    import resource

    from broker.shells.local_transport import attach_local_agent, stop_local_agent
    from broker.shells.transport import wait_readable

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        transport = attach_local_agent(tmp_path / "agent", 1)
        assert transport.fileno() > 1024
        r, w = os.pipe()  # a wait on a high descriptor (a transport read by a thread of its own)
        filler += [r, w]
        assert wait_readable([r], 0.05) == []
        os.write(w, b"x")
        assert wait_readable([r], 5.0) == [r]
        client = AgentClient(transport, "high")
        client.submit([Run("t", 1, "true")])
        events = client.poll(timeout_s=30)
        while not any(isinstance(e, Result) for e in events):
            events += client.poll(timeout_s=30)
        assert [e.ok for e in events if isinstance(e, Result)] == [True]
        client.shutdown()
        client.wait_closed(10)
        client.close()
    finally:
        for fd in filler:
            os.close(fd)
        stop_local_agent(tmp_path / "agent")


def test_an_agent_that_stops_reading_stalls_neither_the_loop_nor_the_hub_and_is_lost():
    """Regression: a submit to an agent that stopped reading blocked in the write while
    holding that client's lock, and the hub blocked on the lock at the agent's next ping: no
    other agent was served, and nobody was ever declared lost."""
    inbox: queue.Queue = queue.Queue()
    others = ["n1", "n2", "n3"]
    with FakeAgents() as fakes:
        clients = _attach(fakes, 4, inbox, ping_interval_s=0.2, dead_after_s=1.0)
        before = threading.active_count()
        fakes.stall("n0")  # a paused process: never reads its socket again, never answers
        pad = "x" * (100 << 10)
        stalled = [Run(f"n0-t{k}", 1, f": {pad}") for k in range(60)]  # 6 MiB: past the socket's buffers
        looped = threading.Event()

        def control_loop() -> None:
            clients["n0"].submit(stalled)
            for turn in range(8):  # 2.4 s of turns: well past n0's dead_after_s
                for name in others:
                    clients[name].submit([Run(f"{name}-r{turn}", 1, ":")])
                time.sleep(0.3)
            looped.set()

        threading.Thread(target=control_loop, name="test-loop", daemon=True).start()
        results: set[str] = set()
        lost: list[tuple[str, str]] = []
        deadline = time.monotonic() + 15
        while (len(results) < 24 or not lost or not looped.is_set()) and time.monotonic() < deadline:
            try:
                node, event = inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(event, NodeLost):
                lost.append((node, event.reason))
            elif isinstance(event, Result):
                results.add(event.task)
                clients[node].ack([(event.task, event.attempt)])
        assert looped.is_set(), "the control loop was stuck in a submit to the stalled agent"
        assert clients["n0"]._link.outbuf or lost, "the stall never filled the agent's buffers"
        assert results == {f"{name}-r{turn}" for name in others for turn in range(8)}
        assert [node for node, _ in lost] == ["n0"], lost
        assert "not reading" in lost[0][1] or "silent" in lost[0][1], lost
        # What the daemon re-queues on NodeLost: every attempt the stalled agent was sent.
        assert set(clients["n0"].outstanding()) == {(r.task, r.attempt) for r in stalled}
        assert not any(fakes.runs[(r.task, r.attempt)] for r in stalled)
        assert threading.active_count() - before <= 1
        time.sleep(1.2)  # past everyone's dead_after_s: the others still answer their pings
        assert inbox.empty()
        for name in others:
            clients[name].close()
        clients["n0"].close()


def _stalled_runs(node: str, count: int = 60) -> list[Run]:
    pad = "x" * (100 << 10)
    return [Run(f"{node}-t{k}", 1, f": {pad}") for k in range(count)]  # 6 MiB: past the socket's buffers


def test_an_agent_that_talks_but_never_reads_is_lost_once_it_took_nothing_for_dead_after_s():
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        clients = _attach(fakes, 2, inbox, ping_interval_s=0.2, dead_after_s=1.0)
        fake = next(f for f in fakes._fakes.values() if f.node == "n0")
        fakes.stall("n0")
        clients["n0"].submit(_stalled_runs("n0"))
        assert clients["n0"]._link.outbuf  # the agent's buffers are full: the rest waits here
        talking = threading.Event()
        talking.set()

        def talk() -> None:  # the agent still says something every 0.1 s: never silent
            while talking.is_set():
                try:
                    fake.sock.send(fake.conn.send(Progress("n0-t0", 1, 0.5, 1.0)))
                except OSError:
                    return
                time.sleep(0.1)

        threading.Thread(target=talk, daemon=True).start()
        try:
            lost = None
            deadline = time.monotonic() + 10
            while lost is None and time.monotonic() < deadline:
                try:
                    node, event = inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                if isinstance(event, NodeLost):
                    lost = (node, event.reason)
        finally:
            talking.clear()
        assert lost is not None and lost[0] == "n0", lost
        assert "not reading" in lost[1] and "unsent for 1 s" in lost[1], lost
        for client in clients.values():
            client.close()


def test_an_agent_that_overflows_its_unsent_buffer_is_lost_at_once(monkeypatch):
    import broker.shells.agent_client as agent_client

    monkeypatch.setattr(agent_client, "MAX_UNSENT_BYTES", 1 << 20)
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        clients = _attach(fakes, 2, inbox, ping_interval_s=5.0, dead_after_s=60.0)
        fakes.stall("n0")
        started = time.monotonic()
        for run in _stalled_runs("n0", 120):  # 12 MiB, one submit each: the buffer passes 1 MiB
            clients["n0"].submit([run])
        node, event = inbox.get(timeout=10)
        assert (node, type(event)) == ("n0", NodeLost)
        assert "over 1 MiB unsent" in event.reason
        assert time.monotonic() - started < 30  # long before dead_after_s: 60 s
        clients["n1"].submit([Run("n1-after", 1, ":")])
        node, event = inbox.get(timeout=10)
        assert node == "n1" and not isinstance(event, NodeLost)
        for client in clients.values():
            client.close()


def test_an_agent_that_reads_again_gets_every_message_in_order_once():
    inbox: queue.Queue = queue.Queue()
    with FakeAgents() as fakes:
        clients = _attach(fakes, 1, inbox, ping_interval_s=0.2, dead_after_s=30.0)
        fakes.stall("n0")
        runs = _stalled_runs("n0")
        for k in range(0, len(runs), 6):  # several writes: their bytes wait in one buffer, in order
            clients["n0"].submit(runs[k:k + 6])
        clients["n0"].submit([Run("n0-last", 1, ":")])
        assert clients["n0"]._link.outbuf
        time.sleep(0.5)  # pings pile up behind the runs meanwhile
        fakes.resume("n0")
        order: list[str] = []
        deadline = time.monotonic() + 30
        while len(order) < len(runs) + 1 and time.monotonic() < deadline:
            node, event = inbox.get(timeout=10)
            assert not isinstance(event, NodeLost), event
            if isinstance(event, Result):
                order.append(event.task)
        assert order == [r.task for r in runs] + ["n0-last"]
        assert set(fakes.runs.values()) == {1}
        assert not clients["n0"]._link.outbuf
        clients["n0"].close()


def test_the_daemon_collects_young_garbage_in_batches_while_it_runs_and_restores_the_setting(tmp_path):
    """A third of a 1,000-agent decision was the collector running every 700 allocations
    (``broker/shells/gctune.py``): the daemon raises the youngest generation's threshold for
    its run, and gives the process its own setting back when the run ends."""
    import gc

    from broker.shells.gctune import YOUNG

    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])
    try:
        seen: list[int] = []
        with FakeAgents() as fakes:
            report, _ = _daemon_on_fakes(tmp_path, fakes, 4, 40, on_progress=lambda *_: seen.append(gc.get_threshold()[0]))
        assert report.tasks_done == 40
        assert seen and set(seen) == {YOUNG}
        assert gc.get_threshold()[0] == 700
    finally:
        gc.set_threshold(*before)
