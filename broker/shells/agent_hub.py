"""One I/O thread for every agent connection: the master's event loop over agent streams.

Before it, each :class:`~broker.shells.agent_client.AgentClient` had a reader thread of its
own (a thousand agents, a thousand threads, each woken for every message). The hub is one
thread around one ``epoll`` set: each transport that has a descriptor to wait on
(``fileno()``: a local agent's socket, the stdout pipe of an ``agent.py attach`` bridge, a
paramiko channel's readiness pipe) is watched there, and the hub calls its :class:`Watcher`
when bytes (or the end of the stream) arrive, and when its timer is due (the client's ping and silence
deadlines). The SSH transport's own thread stays: that one is paramiko's, one per host
connection, and it is what makes the channel's descriptor readable.

Lifetime of a descriptor. A transport that is closed by anyone (its client, a test killing
it, the end of a stream) calls the hook :meth:`AgentHub.watch` gave it (``on_close``)
*before* it releases its descriptors; the hub then serves the watcher once more (its
``recv`` answers ``b""``) and forgets it. The kernel drops a closed descriptor from the
``epoll`` set by itself, and the hub's table is keyed by descriptor *and* watcher, so a
number the kernel reuses for a new connection is never confused with the old one.

Everything a watcher does runs on the hub thread; it must never block: a send to an agent
is a non-blocking write of what the pipe, socket or SSH window takes now, the rest kept in
the client's buffer and retried from the watcher's timer (:meth:`AgentHub.wake_at` brings
it forward), so an agent that stops reading stalls only itself. Anything slow (closing a
local agent's bridge, which waits for its process) is handed to a short-lived thread.
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import threading
import time
from collections import deque
from typing import Any, Protocol

import structlog

log = structlog.get_logger()

READ_BYTES = 1 << 18


class Watcher(Protocol):
    """What the hub calls, always on its own thread."""

    def hub_data(self, data: bytes, now: float) -> str | None:
        """Bytes arrived (``b""``: the stream ended). None to go on, else why the link ended
        (``""`` for an end that was expected)."""

    def hub_timer(self, now: float) -> float | str:
        """The timer fired (maybe early, after data moved it): the next due time (monotonic),
        or why the link ended."""

    def hub_end(self, reason: str) -> None:
        """The link ended (``reason`` as returned above, or the hub's own): called once."""


class _Watch:
    __slots__ = ("transport", "watcher", "fd", "ended", "due")

    def __init__(self, transport: Any, watcher: Watcher, fd: int, due: float) -> None:
        self.transport, self.watcher, self.fd, self.ended = transport, watcher, fd, False
        self.due = due  # the live timer entry; the heap's others for this watch are stale


class AgentHub:
    """One thread serving every watched agent stream; see the module docstring.

    :meth:`shared` is the process's hub (started on first use, a daemon thread). A transport
    without a descriptor cannot be watched (:meth:`can_watch`); its client reads it on a
    thread of its own, as before.
    """

    _shared: AgentHub | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> AgentHub:
        with cls._shared_lock:
            if cls._shared is None or not cls._shared._thread.is_alive():
                cls._shared = cls()
            return cls._shared

    @staticmethod
    def can_watch(transport: Any) -> bool:
        return hasattr(select, "epoll") and callable(getattr(transport, "fileno", None)) and hasattr(
            transport, "on_close")

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._by_fd: dict[int, _Watch] = {}
        self._timers: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._posted: deque[_Watch] = deque()
        self._thread = threading.Thread(target=self._run, name="agent-hub", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def watch(self, transport: Any, watcher: Watcher, first_due: float) -> _Watch:
        """Serve ``transport``'s incoming bytes to ``watcher``, and its timer from ``first_due``;
        the handle is for :meth:`wake_at`."""
        fd = transport.fileno()
        w = _Watch(transport, watcher, fd, first_due)
        transport.on_close = lambda: self._post(w)
        with self._lock:
            # A watch still filed under this number had its descriptor closed (the number was
            # reused): the post its transport's close made still ends it, found by identity.
            self._by_fd[fd] = w
            heapq.heappush(self._timers, (first_due, next(self._seq), w))
            try:
                self._epoll.register(fd, select.EPOLLIN)
            except FileExistsError:
                self._epoll.modify(fd, select.EPOLLIN)
        self._wake()
        if transport.closed:  # closed before the hook was in place
            self._post(w)
        return w

    def wake_at(self, w: _Watch, due: float) -> None:
        """Fire ``w``'s timer by ``due`` (monotonic) if it is not due sooner already."""
        with self._lock:
            if w.ended or due >= w.due:
                return
            w.due = due
            heapq.heappush(self._timers, (due, next(self._seq), w))
        if not self.on_hub_thread():
            self._wake()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def on_hub_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _post(self, w: _Watch) -> None:
        with self._lock:
            self._posted.append(w)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already awake: the pipe is full of wake-ups

    # ------------------------------------------------------------------ the hub thread
    def _run(self) -> None:
        while True:
            try:
                self._once()
            except Exception as exc:  # noqa: BLE001 - the hub must outlive any one bug
                log.error("agent.hub_failed", error=f"{type(exc).__name__}: {exc}")
                time.sleep(0.01)

    def _once(self) -> None:
        with self._lock:
            due = self._timers[0][0] if self._timers else None
        timeout = -1.0 if due is None else max(0.0, due - time.monotonic())
        events = self._epoll.poll(timeout)
        for fd, _mask in events:
            if fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            with self._lock:
                w = self._by_fd.get(fd)
            if w is not None:
                self._serve(w)
        while True:
            with self._lock:
                if not self._posted:
                    break
                w = self._posted.popleft()
            self._serve(w)
        self._fire_timers()

    def _serve(self, w: _Watch) -> None:
        if w.ended:
            return
        try:
            data = w.transport.recv(READ_BYTES, timeout_s=0.0)
        except Exception as exc:  # noqa: BLE001 - TransportClosed, OSError: the link is gone
            self._end(w, f"the transport failed: {exc}")
            return
        if data is None:
            return
        try:
            reason = w.watcher.hub_data(data, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a failed reader loses its node, never the hub
            reason = f"the reader failed: {type(exc).__name__}: {exc}"
            log.error("agent.reader_failed", node=getattr(w.watcher, "node", ""), error=reason)
        if reason is not None:
            self._end(w, reason)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > now:
                    return
                due, _, w = heapq.heappop(self._timers)
                if w.ended or due != w.due:
                    continue  # stale: wake_at moved it, or it ended
                w.due = float("inf")  # a wake_at during the call below files an entry of its own
            try:
                nxt = w.watcher.hub_timer(now)
            except Exception as exc:  # noqa: BLE001 - as in _serve
                nxt = f"the reader failed: {type(exc).__name__}: {exc}"
                log.error("agent.reader_failed", node=getattr(w.watcher, "node", ""), error=nxt)
            if isinstance(nxt, str):
                self._end(w, nxt)
                continue
            nxt = max(nxt, now + 1e-3)
            with self._lock:
                if nxt < w.due:  # else the entry a wake_at filed meanwhile stands
                    w.due = nxt
                    heapq.heappush(self._timers, (nxt, next(self._seq), w))

    def _end(self, w: _Watch, reason: str) -> None:
        """Forget the link (its descriptor out of the set before anyone closes it), close its
        transport off this thread (a local bridge is waited for), and tell its watcher."""
        w.ended = True
        with self._lock:
            if self._by_fd.get(w.fd) is w:
                del self._by_fd[w.fd]
                try:
                    self._epoll.unregister(w.fd)
                except OSError:
                    pass  # closed already: the kernel dropped it
        try:
            w.watcher.hub_end(reason)
        except Exception as exc:  # noqa: BLE001
            log.error("agent.reader_failed", node=getattr(w.watcher, "node", ""),
                      error=f"{type(exc).__name__}: {exc}")
