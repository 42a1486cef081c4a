"""Transports to an agent on this machine.

The local node and dry-run "instances" use :func:`connect_local_agent`: it does in this
process what ``agent.py attach`` does first (the state dir, the sweep of finished runs'
state, reaching the agent daemon for that directory or starting it) and speaks on the
daemon's socket directly. :func:`attach_local_agent` runs ``agent.py attach`` itself, the
bridge an SSH node runs, over its stdin and stdout pipes (:class:`LocalTransport`): the
same daemon behind one more process. With no bridge a local agent costs one Python process,
not two (16 agents start with half the CPU), and each message skips a process's two copies
and wake-ups (ninth session, ``bench/bench_daemon.py``). :func:`stop_local_agent` is the
matching safety valve.

Thread use: one thread may sit in :meth:`LocalTransport.recv` while others :meth:`send`
and :meth:`close`; ``close`` wakes a waiting ``recv`` (it returns ``b""``) before it
releases the file descriptors, so no thread ever reads a descriptor number reused elsewhere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import workers
from broker.shells.transport import SocketTransport, TransportClosed, wait_readable, write_nowait

AGENT_SCRIPT = Path(workers.__file__).parent / "agent.py"
CLOSE_GRACE_S = 2.0


class LocalTransport:
    """A subprocess we speak to through its pipes; its stderr is left to ours."""

    def __init__(self, process: subprocess.Popen) -> None:
        if process.stdin is None or process.stdout is None:
            raise ValueError("the process needs stdin=PIPE and stdout=PIPE")
        self.process = process
        self._in_fd = process.stdin.fileno()
        self._out_fd = process.stdout.fileno()
        os.set_blocking(self._out_fd, False)  # our end only: a read never waits (recv polls first)
        os.set_blocking(self._in_fd, False)  # and a write never stalls the master (send_nowait)
        self._wake_r, self._wake_w = os.pipe()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._closed = False
        self._eof = False
        self.on_close: Callable[[], None] | None = None  # told before the descriptors go (agent_hub.py)

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> LocalTransport:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env, cwd=cwd
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        """The descriptor readable when the agent has said something (or the stream ended)."""
        return self._out_fd

    def send(self, data: bytes) -> None:
        with self._send_lock:
            if self._closed:
                raise TransportClosed("the local transport is closed")
            view = memoryview(data)
            try:
                while view:
                    try:
                        view = view[os.write(self._in_fd, view) :]
                    except BlockingIOError:
                        wait_readable([self._in_fd], 1.0, write=True)
            except OSError as exc:  # BrokenPipeError: the process is gone
                raise TransportClosed(f"process {self.pid} stopped reading: {exc}") from exc

    def send_nowait(self, data: bytes | bytearray) -> int:
        """Write what the pipe takes now, never waiting: the bytes written (0: it is full)."""
        with self._send_lock:
            if self._closed:
                raise TransportClosed("the local transport is closed")
            return write_nowait(lambda view: os.write(self._in_fd, view), data,
                                f"process {self.pid} stopped reading")

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None:
        with self._recv_lock:
            if self._closed or self._eof:
                return b""
            if timeout_s != 0.0 and not wait_readable([self._out_fd, self._wake_r], timeout_s):
                return None  # (timeout 0, the agent hub's call once epoll said readable: no wait)
            if self._closed:
                return b""
            try:
                data = os.read(self._out_fd, max_bytes)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            self._eof = not data
            return data

    def close(self) -> None:
        """Close stdin (the agent's attach bridge then detaches and exits), reap the process."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        if self.on_close is not None:
            self.on_close()
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.process.wait(CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with self._recv_lock:
            self.process.stdout.close()  # type: ignore[union-attr]
            os.close(self._wake_r)
            os.close(self._wake_w)

    def kill(self) -> None:
        """Drop the connection abruptly (SIGKILL the process), as a network failure would."""
        if self.process.poll() is None:
            self.process.kill()
        self.close()


class AgentSocket(SocketTransport):
    """:class:`~broker.shells.transport.SocketTransport` on the agent daemon's Unix socket."""

    def kill(self) -> None:
        """Drop the connection abruptly, as a network failure would (the agent detaches us)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close()


def _attach_options(state_dir: str | os.PathLike[str], slots: int, options: dict[str, object]) -> list[str]:
    """``agent.py attach``'s arguments for :func:`attach_local_agent`'s options."""
    argv = ["--state-dir", os.fspath(state_dir), "--slots", str(slots)]
    for name, value in options.items():  # node, grace_s, ... spot_metadata (a spot instance: where its notice is read)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def connect_local_agent(state_dir: str | os.PathLike[str], slots: int, **options: object) -> AgentSocket:
    """Reach (or start) the detached agent daemon serving ``state_dir`` and talk to it on its
    socket, with no bridge process; options as :func:`attach_local_agent`'s. Raises
    ``workers.agent.AgentStartError`` (with the agent log's tail) if the daemon fails to start.
    The daemon keeps running after this transport closes, as with :func:`attach_local_agent`."""
    from workers.agent import build_parser, open_connection

    args = build_parser().parse_args(["attach", *_attach_options(state_dir, slots, options)])
    return AgentSocket(open_connection(args))


def attach_local_agent(
    state_dir: str | os.PathLike[str],
    slots: int,
    python: str = sys.executable,
    *,
    node: str | None = None,
    grace_s: float | None = None,
    idle_exit_s: float | None = None,
    progress_poll_s: float | None = None,
    lease_s: float | None = None,
    keep_s: float | None = None,
    spot_metadata: str | None = None,
    spot_poll_s: float | None = None,
) -> LocalTransport:
    """Start (or reach) the detached agent daemon serving ``state_dir``; talk to it over pipes,
    through ``agent.py attach`` (the bridge an SSH node runs).

    The daemon keeps running after this transport closes; stop it with a ``Shutdown``
    message or :func:`stop_local_agent`. The options only matter when the daemon starts.
    """
    # -S: the agent is stdlib-only (site's .pth files would cost as much as the rest of its start-up)
    options = dict(node=node, grace_s=grace_s, idle_exit_s=idle_exit_s, progress_poll_s=progress_poll_s,
                   lease_s=lease_s, keep_s=keep_s, spot_metadata=spot_metadata, spot_poll_s=spot_poll_s)
    return LocalTransport.spawn([python, "-S", str(AGENT_SCRIPT), "attach", *_attach_options(state_dir, slots, options)])


def local_agent_pid(state_dir: str | os.PathLike[str]) -> int | None:
    """The pid of the agent daemon serving ``state_dir``, or None if none is alive.

    The pid file is believed only while the state dir's lock is held, so a stale file left
    by a killed agent never points us at an unrelated process that reused its pid.
    """
    from workers.agent import agent_pid

    return agent_pid(os.fspath(state_dir))


def stop_local_agent(state_dir: str | os.PathLike[str], timeout_s: float = 10.0) -> bool:
    """Stop the daemon serving ``state_dir``: SIGTERM (it cancels its tasks and kills what they
    left), SIGKILL if slow; then kill whatever still carries the state dir in its environment
    (what the tasks of an agent killed or gone had left): ``workers.agent.stop_agent``.

    Returns True if an agent was running. Its unacknowledged results stay in the journal.
    """
    from workers.agent import stop_agent

    return stop_agent(os.fspath(state_dir), timeout_s)[0]
