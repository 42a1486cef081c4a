"""The byte-stream contract between the master and one worker agent.

A transport moves the agent protocol's bytes and nothing else; framing and meaning live in
``workers/protocol.py``. Implementations: local pipes (``local_transport.py``) and an SSH
channel (``ssh.py``). Both behave the same:

- ``send`` writes all of ``data`` or raises :class:`TransportClosed`;
- ``recv`` returns the next bytes available (at most ``max_bytes``), waiting up to
  ``timeout_s`` (``None`` = forever); it returns ``None`` on timeout and ``b""`` once the
  peer has closed the stream (end of file);
- ``close`` is idempotent and never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable


class TransportClosed(ConnectionError):
    """The stream is gone: the peer closed it, the process died, or the network dropped."""


@runtime_checkable
class Transport(Protocol):
    def send(self, data: bytes) -> None: ...

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    # Optional, for the agent hub: ``send_nowait(data) -> int`` writes what the stream takes
    # now and never waits (the bytes written); a transport without it is written with ``send``.


class SocketTransport:
    """The contract over a connected stream socket (one end of ``socket.socketpair()``): what
    the benchmarks and tests use for in-process fake agents (:mod:`broker.shells.fake_agents`).
    Watched by the agent hub like a pipe (``fileno``, ``on_close``)."""

    def __init__(self, sock) -> None:  # noqa: ANN001 - a socket.socket
        import threading

        self._sock = sock
        self._sock.setblocking(False)
        self._lock = threading.Lock()
        self._closed = False
        self.on_close = None  # told before the descriptor goes (agent_hub.py)

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        with self._lock:
            while view:
                if self._closed:
                    raise TransportClosed("the socket transport is closed")
                try:
                    view = view[self._sock.send(view):]
                except BlockingIOError:
                    wait_readable([self._sock.fileno()], 1.0, write=True)
                except OSError as exc:
                    raise TransportClosed(f"the peer is gone: {exc}") from exc

    def send_nowait(self, data: bytes | bytearray) -> int:
        """Write what the socket takes now, never waiting: the bytes written (0: it is full)."""
        with self._lock:
            if self._closed:
                raise TransportClosed("the socket transport is closed")
            return write_nowait(self._sock.send, data, "the peer is gone")

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None:
        if self._closed:
            return b""
        if timeout_s != 0.0 and not wait_readable([self._sock.fileno()], timeout_s):
            return None
        try:
            return self._sock.recv(max_bytes)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.on_close is not None:
            self.on_close()
        try:
            self._sock.close()
        except OSError:
            pass


def write_nowait(write: Callable[[memoryview], int], data: bytes | bytearray, gone: str) -> int:
    """Call ``write`` (a non-blocking ``send`` or ``os.write``) until ``data`` is written or it
    would block: the bytes written. A failed write raises :class:`TransportClosed` (``gone``:
    ...). The view of ``data`` is released however this ends (a bytearray may grow again)."""
    sent = 0
    with memoryview(data) as view:
        try:
            while sent < len(view):
                sent += write(view[sent:])
        except BlockingIOError:
            pass
        except OSError as exc:
            raise TransportClosed(f"{gone}: {exc}") from None
    return sent


def wait_readable(fds: list[int], timeout_s: float | None, write: bool = False) -> list[int]:
    """The descriptors of ``fds`` ready to read (``write``: to write) within ``timeout_s``
    (``None``: forever). ``poll``, not ``select``: a master with a thousand agents holds
    descriptors past select's limit of 1024."""
    import select

    poller = select.poll()
    mask = select.POLLOUT if write else select.POLLIN | select.POLLPRI
    for fd in fds:
        poller.register(fd, mask)
    ms = None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999))
    return [fd for fd, _ in poller.poll(ms)]
