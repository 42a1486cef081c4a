"""In-process fake worker agents that answer at once: for benchmarks and tests of the master.

Each fake agent is the agent's side of the real protocol (:class:`workers.protocol.Connection`,
sans I/O) at one end of a ``socket.socketpair()``; the master's end is a
:class:`~broker.shells.transport.SocketTransport`. All of them are served by ONE thread
around one ``epoll`` set, so a thousand fit on a small machine and the master is measured,
not the agents. A Run is answered at once by its Started and a successful Result (no process
is started); an Ack makes the agent forget the Result, a Ping is answered with a Pong, a
Shutdown ends the stream. :meth:`FakeAgents.drop` cuts one agent's connection (a lost node);
:meth:`FakeAgents.stall` makes one stop reading and answering, its connection left open (a
paused process, a full SSH window).
"""

from __future__ import annotations

import os
import select
import socket
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from broker.shells.agent_client import AgentClient
from broker.shells.transport import SocketTransport
from workers.protocol import (
    NEED_DATA,
    Ack,
    Cancel,
    Connection,
    ConnectionClosed,
    Hello,
    Ping,
    Pong,
    Result,
    Run,
    Shutdown,
    Started,
    key_of,
)


class _Fake:
    __slots__ = ("node", "slots", "sock", "master", "conn", "out", "unacked")

    def __init__(self, node: str, slots: int, sock: socket.socket, master: socket.socket) -> None:
        self.node, self.slots, self.sock, self.master = node, slots, sock, master
        self.conn = Connection("agent")
        self.out = bytearray()
        self.unacked: set = set()


ATTACH_CONCURRENCY = 8


class FakeAgents:
    """Fake agents on one thread; :meth:`connect` gives the master's transport to a new one.

    ``runs`` counts every Run received per ``(task, attempt)`` (a task run twice shows as 2).
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._fakes: dict[int, _Fake] = {}
        self._to_drop: list[str] = []
        self.runs: Counter = Counter()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="fake-agents", daemon=True)
        self._thread.start()

    def connect(self, node: str, slots: int) -> SocketTransport:
        master, agent = socket.socketpair()
        for s in (master, agent):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        agent.setblocking(False)
        fake = _Fake(node, slots, agent, master)
        with self._lock:
            self._fakes[agent.fileno()] = fake
        self._epoll.register(agent.fileno(), select.EPOLLIN)
        return SocketTransport(master)

    def drop(self, node: str) -> None:
        """Cut ``node``'s connection from the agent's side (the master sees the stream end)."""
        with self._lock:
            self._to_drop.append(node)
        os.write(self._wake_w, b"x")

    def stall(self, node: str, buffer_bytes: int | None = None) -> None:
        """``node``'s agent stops reading (and so answering) but keeps its connection open:
        what the master sends it piles up in the socket's buffers until they are full
        (``buffer_bytes``: shrink them to about that, so they are full at once)."""
        with self._lock:
            fds = [fd for fd, f in self._fakes.items() if f.node == node]
            if buffer_bytes is not None:
                for fd in fds:
                    self._fakes[fd].master.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        for fd in fds:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass

    def resume(self, node: str) -> None:
        """``node``'s agent reads (and answers) again after :meth:`stall`."""
        with self._lock:
            fds = [fd for fd, f in self._fakes.items() if f.node == node]
        for fd in fds:
            self._epoll.register(fd, select.EPOLLIN)

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        for fake in self._fakes.values():
            fake.sock.close()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> FakeAgents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the agents' thread
    def _run(self) -> None:
        while not self._stop:
            for fd, _ in self._epoll.poll():
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._drop_asked()
                    continue
                fake = self._fakes.get(fd)
                if fake is not None:
                    self._serve(fd, fake)

    def _drop_asked(self) -> None:
        with self._lock:
            names, self._to_drop = set(self._to_drop), []
            gone = [(fd, f) for fd, f in self._fakes.items() if f.node in names]
        for fd, fake in gone:
            self._forget(fd, fake)

    def _forget(self, fd: int, fake: _Fake) -> None:
        with self._lock:
            self._fakes.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        fake.sock.close()

    def _serve(self, fd: int, fake: _Fake) -> None:
        try:
            data = fake.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        fake.conn.receive_data(data)
        while True:
            event = fake.conn.next_event()
            if event is NEED_DATA:
                break
            if isinstance(event, ConnectionClosed) or isinstance(event, Shutdown):
                self._forget(fd, fake)
                return
            self._answer(fake, event)
        if fake.out:
            fake.sock.setblocking(True)
            try:
                fake.sock.sendall(fake.out)
            except OSError:
                self._forget(fd, fake)
                return
            finally:
                fake.out.clear()
            fake.sock.setblocking(False)

    def _answer(self, fake: _Fake, message: object) -> None:
        conn = fake.conn
        if isinstance(message, Hello):
            fake.out += conn.send(Hello(role="agent", node=fake.node, slots=fake.slots))
        elif isinstance(message, Run):
            key = key_of(message)
            self.runs[key] += 1
            fake.unacked.add(key)
            fake.out += conn.send(Started(message.task, message.attempt, 1))
            fake.out += conn.send(Result(message.task, message.attempt, exit_code=0, runtime_s=0.0))
        elif isinstance(message, Ack):
            fake.unacked.discard(key_of(message))
        elif isinstance(message, Ping):
            fake.out += conn.send(Pong(message.seq))
        elif isinstance(message, Cancel):
            pass  # answered already: a fake task ends before it can be cancelled


class FakeNodes:
    """The daemon's ``nodes`` (:class:`~broker.shells.run.types.Nodes`) for private nodes of
    ``slots`` served by fake agents: attached in the background on at most
    ``ATTACH_CONCURRENCY`` threads, as :class:`~broker.shells.nodes.SshAgents` does; ``first_at``
    and ``last_at`` (``time.perf_counter``) time the attaches."""

    def __init__(self, fakes: FakeAgents, inbox: queue.Queue, slots: int, **client_options: float) -> None:
        self.fakes, self.inbox, self.slots = fakes, inbox, slots
        self.client_options = client_options  # AgentClient's: ping_interval_s, dead_after_s
        self.pool = ThreadPoolExecutor(ATTACH_CONCURRENCY, thread_name_prefix="attach")
        self.first_at: float | None = None
        self.last_at = 0.0

    def _attach(self, node: str, slots: int) -> AgentClient:
        self.first_at = self.first_at or time.perf_counter()
        client = AgentClient(self.fakes.connect(node, slots), node, inbox=self.inbox,
                             **{"started": False, **self.client_options})  # as the daemon's clients (nodes.py)
        self.last_at = time.perf_counter()
        return client

    def attach(self, node: str, slots: int, expect: tuple = ()) -> AgentClient:
        return self._attach(node, slots)

    def attach_in_background(self, node, slots, done) -> bool:  # noqa: ANN001
        return False

    def attach_private_in_background(self, node, done, on_retry, expect=()) -> bool:  # noqa: ANN001
        def work() -> None:
            try:
                client = self._attach(node, self.slots)
            except Exception as exc:  # noqa: BLE001 - handed to the daemon
                done(None, exc)
                return
            done(client, None)

        self.pool.submit(work)
        return True

    def grace_s(self, node: str) -> float | None:
        return None

    def reattach(self, node: str, slots: int, client: AgentClient) -> None:
        client.reattach(self.fakes.connect(node, slots))

    def stop(self, node: str, client: AgentClient | None) -> None:
        if client is not None:
            client.close()

    def fetch(self, *args, **kwargs) -> list:  # noqa: ANN002, ANN003
        return []
