"""The agent's stream over one SSH channel (:meth:`broker.shells.ssh.SshSession.open_stream`)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import paramiko

from broker.shells.transport import TransportClosed, wait_readable

_STDERR_TAIL_BYTES = 64 * 1024



class SshTransport:
    """The Transport contract over one SSH channel: the remote command's stdin and stdout.

    Its stderr is kept as a bounded tail (:meth:`stderr_tail`) for diagnostics, and drained
    as it arrives so it can never stall stdout by exhausting the channel's window. One
    thread may sit in ``recv`` while others ``send`` and ``close``: ``close`` wakes a
    waiting ``recv`` (which returns ``b""``) before the channel, and with it the descriptor
    ``recv`` polls, goes away.
    """

    def __init__(self, channel: paramiko.Channel, address: str) -> None:
        self._channel = channel
        self._address = address
        self._ready_fd = channel.fileno()  # readable when stdout or stderr data, EOF or close
        self._wake_r, self._wake_w = os.pipe()
        self._recv_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._stderr_lock = threading.Lock()
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_bytes = 0
        self.on_close: Callable[[], None] | None = None  # told before the descriptors go (agent_hub.py)

    def fileno(self) -> int:
        """Readable when the channel has stdout or stderr data, or has ended (paramiko's pipe)."""
        return self._ready_fd

    def send(self, data: bytes) -> None:
        if self._closed:
            raise TransportClosed(f"stream to {self._address} was closed")
        view = memoryview(data)
        try:
            while view:
                sent = self._channel.send(view)
                if sent == 0:
                    raise TransportClosed(f"stream to {self._address} stopped accepting data")
                view = view[sent:]
        except TransportClosed:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportClosed(f"stream to {self._address} is gone: {exc}") from exc

    def send_nowait(self, data: bytes | bytearray) -> int:
        """Write what the channel's window takes now, never waiting: the bytes written (0: the
        remote end has not opened its window). One writer at a time (the client's lock)."""
        if self._closed:
            raise TransportClosed(f"stream to {self._address} was closed")
        sent, gone = 0, ""
        with memoryview(data) as view:  # released however this ends: data may grow
            try:
                while sent < len(view) and self._channel.send_ready():
                    n = self._channel.send(view[sent:])
                    if n == 0:
                        gone = "stopped accepting data"
                        break
                    sent += n
            except (OSError, EOFError, paramiko.SSHException) as exc:
                gone = f"is gone: {exc}"
        if gone:
            raise TransportClosed(f"stream to {self._address} {gone}")
        return sent

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None:
        channel = self._channel
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._recv_lock:
            while not self._closed:
                self._drain_stderr()
                if channel.recv_ready():
                    return channel.recv(max_bytes)
                if channel.eof_received or channel.closed:
                    # Data that arrived just before the end is still delivered first.
                    return channel.recv(max_bytes) if channel.recv_ready() else b""
                remaining_s = None if deadline is None else deadline - time.monotonic()
                if remaining_s is not None and remaining_s <= 0:
                    return None
                wait_readable([self._ready_fd, self._wake_r], remaining_s)
            return b""

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        if self.on_close is not None:
            self.on_close()
        with self._recv_lock:  # no recv is polling the descriptors any more
            with contextlib.suppress(Exception):
                self._channel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    @property
    def closed(self) -> bool:
        return self._closed or self._channel.closed

    @property
    def exit_status(self) -> int | None:
        """The remote command's exit code once it has ended (-1 if killed), else ``None``."""
        if not self._channel.exit_status_ready():
            return None
        return self._channel.recv_exit_status()

    def stderr_tail(self) -> bytes:
        """The last bytes (up to 64 KiB) the remote command wrote to stderr."""
        self._drain_stderr()
        with self._stderr_lock:
            return b"".join(self._stderr_tail)

    def _drain_stderr(self) -> None:
        with self._stderr_lock:
            while self._channel.recv_stderr_ready():
                chunk = self._channel.recv_stderr(65536)
                self._stderr_tail.append(chunk)
                self._stderr_bytes += len(chunk)
                while self._stderr_bytes - len(self._stderr_tail[0]) >= _STDERR_TAIL_BYTES:
                    self._stderr_bytes -= len(self._stderr_tail.popleft())


# --------------------------------------------------------------------------- reaching fresh machines
