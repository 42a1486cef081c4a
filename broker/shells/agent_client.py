"""The master's side of one worker agent: handshake, batched submits, acks, liveness, re-attach.

Delivery. The agent's bytes are turned into events and ``(node_name, event)`` pairs put on
an *inbox* queue by ONE thread for every client of the process, the agent hub
(:mod:`broker.shells.agent_hub`: one ``epoll`` set over local pipes, SSH channels and
sockets, whose timers also send the pings and notice silence); a transport with no
descriptor to wait on gets a reader thread of its own instead. By default a client owns its inbox
and :meth:`AgentClient.poll` drains it; the live daemon instead hands one shared
``queue.Queue`` to every client and reads the pairs of all nodes from it in one loop.

Events delivered:

- the agent's :class:`~workers.protocol.Started` (unless made with ``started=False``: the
  daemon's loop has no use for it), :class:`~workers.protocol.Progress`,
  :class:`~workers.protocol.Interruption` (a spot notice) and :class:`~workers.protocol.Result`; a Result is delivered once per ``(task, attempt)``
  however often it is replayed (a replay of one already acknowledged is re-acknowledged
  here, so a lost Ack cannot make the agent replay it forever);
- :class:`NodeLost` when the connection fails, the agent breaks the protocol (any bad line:
  nesting, size, encoding), reading fails for any other reason, or nothing at all
  arrives for ``dead_after_s`` (the client pings every ``ping_interval_s`` of
  silence, so a live agent always has something to say);
- :class:`TaskLost` after a re-attach, for each attempt submitted earlier that the agent
  neither runs nor reports (it restarted without it, or the Run never reached it).

Failures never raise into the caller's loop: a ``submit``/``ack``/``cancel`` on a broken
connection keeps its bookkeeping and returns, and the reader reports :class:`NodeLost`;
:meth:`AgentClient.reattach` with a fresh transport then reconciles. Only a handshake
that fails raises (:class:`HandshakeError`), since the caller is waiting for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from broker.shells.agent_hub import AgentHub
from broker.shells.transport import Transport, TransportClosed
from workers.protocol import (
    NEED_DATA,
    Ack,
    Cancel,
    Connection,
    ConnectionClosed,
    Hello,
    Interruption,
    Key,
    Ping,
    Progress,
    RemoteProtocolError,
    Result,
    Run,
    Shutdown,
    Started,
    key_of,
)

log = structlog.get_logger()


@dataclass(frozen=True)
class NodeLost:
    """The connection to ``node`` is gone; its agent may still be running (re-attach to see)."""

    node: str
    reason: str


@dataclass(frozen=True)
class TaskLost:
    """After a re-attach the agent does not know this attempt: it will never report it."""

    task: str
    attempt: int
    reason: str


class HandshakeError(ConnectionError):
    """No agent Hello: wrong version, not an agent, or silence within the handshake timeout.
    ``closed``: the connection ended before the Hello (a dying agent's socket can still
    accept one), which a new connection may not meet."""

    def __init__(self, message: str, *, closed: bool = False) -> None:
        super().__init__(message)
        self.closed = closed


_CLOSED_IN_HANDSHAKE = "the connection closed during the handshake"
_CLOSED_BY_AGENT = "the agent closed the connection"


class _Link:
    """One connection (transport + protocol state); a re-attach makes a new one."""

    def __init__(self, transport: Transport, skip_started: bool = False) -> None:
        self.transport = transport
        self.conn = Connection("master", skip=("started",) if skip_started else ())  # not even decoded
        self.greeted = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None
        self.stopped = False  # closed on purpose: no NodeLost
        self.shutting_down = False  # Shutdown sent: the agent ending the stream is expected
        self.suspects: set[Key] = set()
        self.replay_left = 0
        self.last_heard = self.next_ping = 0.0  # time.monotonic(), set when the link opens
        self.first_ping: float | None = None  # when the first ping of the current silence went out
        # Writes that never wait (a link the hub serves, over a transport with send_nowait):
        # what the agent has not taken yet, in order; since when it took nothing; the hub's
        # handle to bring the retry forward; why the link is lost if the buffer overflowed.
        self.outbuf = bytearray()
        self.stuck_since: float | None = None
        self.wake: Any = None
        self.overflow: str | None = None


# A link whose agent stops reading keeps what it was sent here, retried every RETRY_S, and is
# lost after dead_after_s without taking a byte (as one that stops answering), or at once past
# MAX_UNSENT_BYTES (a few thousand Runs: far beyond what a turn sends a live agent).
RETRY_S = 0.02
MAX_UNSENT_BYTES = 64 << 20


_CLOSER: Any = None
_CLOSER_LOCK = threading.Lock()


def _closer() -> Any:
    """A few threads that close the transports of links that ended (a thousand agents ending
    together take a handful of threads, not a thousand)."""
    global _CLOSER
    with _CLOSER_LOCK:
        if _CLOSER is None:
            from concurrent.futures import ThreadPoolExecutor

            _CLOSER = ThreadPoolExecutor(4, thread_name_prefix="agent-close")
        return _CLOSER


class _HubWatcher:
    """One link as the hub (agent_hub.py) sees it; every call runs on the hub thread."""

    __slots__ = ("client", "link")

    def __init__(self, client: AgentClient, link: _Link) -> None:
        self.client, self.link = client, link

    @property
    def node(self) -> str:
        return self.client.node

    def hub_data(self, data: bytes, now: float) -> str | None:
        return self.client._on_data(self.link, data, now)

    def hub_timer(self, now: float) -> float | str:
        return self.client._on_timer(self.link, now)

    def hub_end(self, reason: str) -> None:
        link = self.link
        if link.transport.closed:
            link.transport.close()
            self.client._on_end(link, reason)
            link.done.set()
            return

        def close() -> None:  # a local bridge is waited for: not on the hub thread
            try:
                link.transport.close()
            except Exception:  # noqa: BLE001 - closing what is already broken
                pass
            link.done.set()

        self.client._on_end(link, reason)
        _closer().submit(close)


class AgentClient:
    """Master side of the protocol with the agent on ``node_name``, over ``transport``.

    The constructor performs the handshake and blocks until the agent's Hello (kept as
    :attr:`hello`) or ``handshake_timeout_s``. Thread-safe: any thread may submit, ack or
    cancel while the hub delivers events. Writes go out in the caller's thread: one write
    per :meth:`submit` (with the acknowledgements :meth:`ack` held for it), never waiting on
    a hub-served link: what the agent does not take at once is buffered, in order, and the
    hub writes it as the agent drains (so one stalled agent stalls neither the caller nor
    the hub; it is lost after ``dead_after_s`` without taking a byte).
    """

    def __init__(
        self,
        transport: Transport,
        node_name: str,
        *,
        inbox: queue.Queue[tuple[str, Any]] | None = None,
        handshake_timeout_s: float = 10.0,
        ping_interval_s: float = 5.0,
        dead_after_s: float = 20.0,
        expect: Iterable[Run] = (),
        started: bool = True,
    ) -> None:
        if dead_after_s <= ping_interval_s:
            raise ValueError("dead_after_s must exceed ping_interval_s, or every pause looks like a death")
        self.node = node_name
        self.deliver_started = started  # False: a master that has no use for Started (the daemon's loop)
        self.inbox: queue.Queue[tuple[str, Any]] = inbox if inbox is not None else queue.Queue()
        self._own_inbox = inbox is None
        self.handshake_timeout_s = handshake_timeout_s
        self.ping_interval_s = ping_interval_s
        self.dead_after_s = dead_after_s
        self.hello: Hello | None = None
        self._lock = threading.Lock()
        # ``expect``: attempts a previous master submitted (a resumed run); the handshake
        # reports each one the agent neither runs nor replays as a TaskLost.
        self._outstanding: dict[Key, Run] = {key_of(run): run for run in expect}
        self._results_seen: set[Key] = set()
        self._started_seen: set[Key] = set()
        self._acked: set[Key] = set()
        self._ping_seq = 0
        self._held: list[Ack] = []  # acknowledgements waiting for the turn's write (ack(hold=True))
        self.heard_at = time.monotonic()  # when the agent last said anything (time.monotonic)
        self._link: _Link
        self._open(transport)

    # ----------------------------------------------------------------- public API

    def submit(self, runs: list[Run]) -> None:
        """Send every Run in one write. They count as outstanding until their Result."""
        if not runs:
            return
        with self._lock:
            for run in runs:
                self._outstanding[key_of(run)] = run
            self._send_locked(runs)

    def cancel(self, keys: Iterable[Key]) -> None:
        with self._lock:
            self._send_locked([Cancel(task, attempt) for task, attempt in keys])

    def ack(self, keys: Iterable[Key], *, hold: bool = False) -> None:
        """Confirm Results recorded by the master; the agent may then forget them. ``hold``:
        send them with the next write to this agent (the turn's new work, :meth:`flush`). On a
        closed client they are only noted: the next connection's replay is acknowledged then
        (a turn's acks to a node whose re-attach failed in that turn ended the daemon)."""
        with self._lock:
            acks = [Ack(task, attempt) for task, attempt in keys]
            self._acked.update(key_of(a) for a in acks)
            if self._link.stopped:
                return
            if hold:
                self._held += acks
            else:
                self._send_locked(acks)

    def flush(self) -> None:
        """Send what :meth:`ack` holds, if nothing carried it yet."""
        with self._lock:
            if self._held and not self._link.stopped:
                self._send_locked([])

    def shutdown(self, drain: bool = True) -> None:
        """Ask the agent to stop (after its tasks if ``drain``); see :meth:`wait_closed`."""
        with self._lock:
            self._link.shutting_down = True
            self._send_locked([Shutdown(drain=drain)])

    def wait_closed(self, timeout_s: float | None = None) -> bool:
        """Wait until the connection has ended (e.g. the agent finished after a shutdown)."""
        return self._link.done.wait(timeout_s)

    def outstanding(self) -> list[Key]:
        """Attempts submitted whose Result has not arrived yet."""
        with self._lock:
            return list(self._outstanding)

    def poll(self, timeout_s: float | None = None) -> list[Any]:
        """Events that arrived, waiting up to ``timeout_s`` for the first (own inbox only)."""
        if not self._own_inbox:
            raise RuntimeError("this client delivers to a shared inbox: read (node, event) pairs from it")
        events = []
        try:
            events.append(self.inbox.get(timeout=timeout_s)[1])
            while True:
                events.append(self.inbox.get_nowait()[1])
        except queue.Empty:
            pass
        return events

    def reattach(self, transport: Transport) -> Hello:
        """Redo the handshake over a new transport (after a :class:`NodeLost`).

        The agent replays its unacknowledged Results (delivered unless already seen); any
        outstanding attempt it neither runs nor reports becomes a :class:`TaskLost`.
        Returns the agent's new Hello. Do not submit from another thread meanwhile.
        """
        self._retire(self._link)
        self._open(transport)
        assert self.hello is not None
        return self.hello

    def close(self) -> None:
        """Drop the connection on purpose (no NodeLost). The agent keeps running."""
        self.flush()
        self._retire(self._link)

    # ----------------------------------------------------------------- connection

    def _open(self, transport: Transport) -> None:
        link = self._link = _Link(transport, skip_started=not self.deliver_started)
        now = time.monotonic()
        link.last_heard, link.next_ping = now, now + self.ping_interval_s
        hub = AgentHub.shared() if AgentHub.can_watch(transport) else None
        try:
            transport.send(link.conn.send(Hello(role="master", node=self.node)))
        except TransportClosed as exc:
            transport.close()
            raise HandshakeError(f"{self.node}: the transport closed before the handshake: {exc}", closed=True) from exc
        if hub is not None:  # one I/O thread for every agent (agent_hub.py)
            watch = hub.watch(transport, _HubWatcher(self, link), link.next_ping)
            if callable(getattr(transport, "send_nowait", None)):
                link.wake = lambda due: hub.wake_at(watch, due)
        else:  # a transport with nothing to wait on: a reader thread of its own
            threading.Thread(target=self._read_loop, args=(link,), name=f"agent-{self.node}", daemon=True).start()
        if not link.greeted.wait(self.handshake_timeout_s):
            self._retire(link)
            raise HandshakeError(f"{self.node}: no Hello from the agent within {self.handshake_timeout_s:g} s")
        if link.error is not None:
            self._retire(link)
            raise HandshakeError(f"{self.node}: {link.error}", closed=link.error in (_CLOSED_IN_HANDSHAKE, _CLOSED_BY_AGENT))
        assert self.hello is not None
        log.info(
            "agent.attached",
            node=self.node,
            slots=self.hello.slots,
            running=len(self.hello.running),
            pending_results=self.hello.pending_results,
        )

    def _retire(self, link: _Link) -> None:
        link.stopped = True
        link.transport.close()
        link.done.wait(5.0)

    def _send_locked(self, messages: list[Any], link: _Link | None = None) -> None:
        """Send on ``link`` (default: the current one). Using a closed client is a caller bug."""
        if link is None:
            link = self._link
            if link.stopped:
                raise TransportClosed(f"the client for {self.node} is closed")
            if self._held:  # acknowledgements and new work in one write
                messages, self._held = [*self._held, *messages], []
        if link.stopped or not messages:
            return
        data = link.conn.send_all(messages)
        if link.wake is None:  # a link with a reader thread of its own: the write may wait
            try:
                link.transport.send(data)
            except TransportClosed:
                pass  # the reader reports NodeLost; a re-attach reconciles what was in flight
            return
        if link.overflow is not None:
            return  # being lost: a re-attach reconciles what was in flight
        self._push_locked(link, time.monotonic(), data)
        if len(link.outbuf) > MAX_UNSENT_BYTES:
            link.overflow = f"not reading: over {MAX_UNSENT_BYTES >> 20} MiB unsent"
            link.outbuf = bytearray()
            link.wake(0.0)
        elif link.outbuf:
            link.wake(time.monotonic() + RETRY_S)

    def _push_locked(self, link: _Link, now: float, data: bytes = b"") -> None:
        """Write what the agent takes now of ``link.outbuf`` then ``data``, never waiting; keep
        the rest, in order, in ``link.outbuf``."""
        if link.outbuf:
            link.outbuf += data
            pending: bytes | bytearray = link.outbuf
        elif data:
            pending = data
        else:
            return
        try:
            sent = link.transport.send_nowait(pending)
        except TransportClosed:
            link.outbuf = bytearray()  # the reader reports NodeLost
            link.stuck_since = None
            return
        if pending is link.outbuf:
            del link.outbuf[:sent]
        elif sent < len(data):
            link.outbuf += data[sent:]
        if not link.outbuf:
            link.stuck_since = None
        elif sent or link.stuck_since is None:
            link.stuck_since = now

    def _read_loop(self, link: _Link) -> None:
        """The reader thread of a transport the hub cannot watch: the same steps as the hub's
        (:meth:`_on_data`, :meth:`_on_timer`, :meth:`_on_end`), waiting in ``recv``."""
        reason: str | None = None
        try:
            while reason is None and not link.stopped:
                due = self._on_timer(link, time.monotonic())
                if isinstance(due, str):
                    reason = due
                    break
                data = link.transport.recv(1 << 18, timeout_s=max(0.0, due - time.monotonic()))
                if data is not None:
                    reason = self._on_data(link, data, time.monotonic())
        except (TransportClosed, OSError) as exc:
            reason = f"the transport failed: {exc}"
        except BaseException as exc:  # noqa: BLE001 - reported as the node lost, below
            reason = f"the reader failed: {type(exc).__name__}: {exc}"
            log.error("agent.reader_failed", node=self.node, error=reason)
        try:
            link.transport.close()
        except Exception:  # noqa: BLE001 - closing what is already broken
            pass
        self._on_end(link, reason or "")
        link.done.set()

    def _on_timer(self, link: _Link, now: float) -> float | str:
        """Write what is buffered; then as :meth:`_liveness`, or the link is lost because its
        agent took nothing for ``dead_after_s`` (or overflowed its buffer)."""
        if link.wake is None:
            return self._liveness(link, now)
        with self._lock:
            self._push_locked(link, now)
        if link.overflow is not None:
            return link.overflow
        due = self._liveness(link, now)
        with self._lock:
            unsent, stuck_since = len(link.outbuf), link.stuck_since
        if isinstance(due, str) or not unsent or stuck_since is None:
            return due
        if now >= stuck_since + self.dead_after_s:
            return f"not reading: {unsent} bytes unsent for {self.dead_after_s:g} s"
        return min(due, now + RETRY_S, stuck_since + self.dead_after_s)

    def _liveness(self, link: _Link, now: float) -> float | str:
        """Ping after ``ping_interval_s`` of silence; the next due time, or why the link is lost.

        Silence is a loss only once a ping has gone unanswered for ``dead_after_s -
        ping_interval_s`` too: if the reader itself was held up past ``dead_after_s`` (a
        loaded machine, a suspended laptop), the agent is asked before it is blamed. Bytes
        that arrived meanwhile were read first (the hub serves readable links before timers).
        """
        if link.stopped:
            return ""
        lost_at = link.last_heard + self.dead_after_s
        if link.first_ping is not None:
            lost_at = max(lost_at, link.first_ping + self.dead_after_s - self.ping_interval_s)
            if now >= lost_at:
                return f"silent for {self.dead_after_s:g} s"
        if now >= link.next_ping or now >= lost_at:
            with self._lock:
                self._ping_seq += 1
                self._send_locked([Ping(self._ping_seq)], link)
            link.first_ping = now if link.first_ping is None else link.first_ping
            link.next_ping = now + self.ping_interval_s
            lost_at = max(link.last_heard + self.dead_after_s, link.first_ping + self.dead_after_s - self.ping_interval_s)
        return min(link.next_ping, lost_at)

    def _on_data(self, link: _Link, data: bytes, now: float) -> str | None:
        """Feed bytes to the protocol; None to go on, else why the link ended ("" if expected)."""
        if not data:
            link.conn.receive_data(b"")
        else:
            link.last_heard, link.first_ping = now, None
            self.heard_at = now
            link.next_ping = now + self.ping_interval_s
            link.conn.receive_data(data)
        while True:
            try:
                event = link.conn.next_event()
            except RemoteProtocolError as exc:
                return f"the agent broke the protocol: {exc}"
            if event is NEED_DATA:
                return None
            if isinstance(event, ConnectionClosed):
                return "" if link.stopped or link.shutting_down else _CLOSED_BY_AGENT
            self._on_message(link, event)

    def _on_end(self, link: _Link, reason: str) -> None:
        """However a link ends (the stream closed, a protocol error, or any exception at all in
        reading or bookkeeping), its node is reported lost unless the end was expected: a dead
        reader must never leave a node's attempts hanging."""
        if not link.greeted.is_set():
            link.error = reason or _CLOSED_IN_HANDSHAKE
            link.greeted.set()
        elif reason and not link.stopped and link is self._link:
            log.warning("agent.lost", node=self.node, reason=reason)
            self.inbox.put((self.node, NodeLost(self.node, reason)))

    # ----------------------------------------------------------------- bookkeeping

    def _on_message(self, link: _Link, message: Any) -> None:
        with self._lock:
            deliver: list[Any] = []
            if isinstance(message, Hello):
                self.hello = message
                link.suspects = set(self._outstanding) - set(message.running)
                link.replay_left = message.pending_results
                if link.replay_left == 0:
                    deliver += self._declare_lost(link)
                link.greeted.set()
            elif isinstance(message, Result):
                key = key_of(message)
                if key in self._results_seen:
                    if key in self._acked:
                        self._send_locked([Ack(*key)], link)
                else:
                    self._results_seen.add(key)
                    self._outstanding.pop(key, None)
                    deliver.append(message)
                if link.replay_left > 0:
                    link.suspects.discard(key)
                    link.replay_left -= 1
                    if link.replay_left == 0:
                        deliver += self._declare_lost(link)
            elif isinstance(message, Started):
                if self.deliver_started and key_of(message) not in self._started_seen:
                    self._started_seen.add(key_of(message))
                    deliver.append(message)
            elif isinstance(message, (Progress, Interruption)):  # Interruption: the spot notice
                deliver.append(message)
            for event in deliver:
                self.inbox.put((self.node, event))

    def _declare_lost(self, link: _Link) -> list[TaskLost]:
        lost = []
        for key in sorted(link.suspects):
            if self._outstanding.pop(key, None) is not None:
                lost.append(TaskLost(key[0], key[1], f"the agent on {self.node} no longer knows this attempt"))
        link.suspects = set()
        if lost:
            log.warning("agent.tasks_lost", node=self.node, count=len(lost))
        return lost
