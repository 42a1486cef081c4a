"""A real OpenSSH server on 127.0.0.1 for integration tests.

:func:`running_sshd` generates an Ed25519 host key and an Ed25519 user key in a fresh
directory, writes an ``sshd_config`` that listens on 127.0.0.1 and a free high port, accepts
only that user key (``AuthorizedKeysFile`` points into the directory, so the real
``~/.ssh`` is never touched), and runs ``sshd -D -e -f CONFIG`` in its own process group
until the ``with`` block ends. It also writes a ``known_hosts`` file that pins the host key
as ``[127.0.0.1]:PORT ssh-ed25519 ...``, the way OpenSSH records a non-default port.

:meth:`TestSshd.drop_connections` simulates a network drop: it SIGKILLs every
per-connection sshd process, so each client sees its TCP stream end, while the commands
those connections started keep running as orphans (as they would on a real node after its
link died). Teardown kills those orphans too; detached agent daemons are the tests' own
business (they are not sshd's descendants).

Stdlib only, so the module can also be used outside pytest (e.g. by ``bench/``).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SSHD_BINARY = "/usr/sbin/sshd"
INSTALL_HINT = "install OpenSSH's server: apt-get install -y openssh-server (provides /usr/sbin/sshd)"
_PRIVSEP_DIR = Path("/run/sshd")
_READY_TIMEOUT_S = 10.0


class SshdUnavailable(RuntimeError):
    """sshd (or ssh-keygen) is not installed, or cannot run as this user."""


@contextlib.contextmanager
def connects_to(host: str, port: int) -> Iterator[list[tuple[str, int]]]:
    """Record every TCP connect this process makes to ``host:port`` inside the block.

    What a client did, seen from the client: the server's process table also shows what
    other processes (and exiting or unreaped connection processes) do, and cannot tell them
    apart from this client.
    """
    seen: list[tuple[str, int]] = []
    original = socket.socket.connect

    def connect(sock: socket.socket, address: object) -> None:
        if isinstance(address, tuple) and tuple(address[:2]) == (host, port):
            seen.append((host, port))
        return original(sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        socket.socket.connect = original  # type: ignore[method-assign]


def sshd_missing_reason() -> str | None:
    """Why a real sshd cannot be started here, or ``None`` if it can."""
    if not os.access(SSHD_BINARY, os.X_OK):
        return f"{SSHD_BINARY} not found; {INSTALL_HINT}"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not found; install openssh-client"
    return None


@dataclass
class TestSshd:
    """A running test sshd and everything a client needs to reach it."""

    __test__ = False  # not a pytest test class despite the name

    host: str
    port: int
    user: str
    client_key_path: Path
    known_hosts_path: Path
    host_public_key: str  # "ssh-ed25519 AAAA..." (no comment)
    directory: Path
    process: subprocess.Popen[bytes]
    # Commands orphaned by drop_connections, as (pid, start time) so a reused pid is spared.
    _orphans: set[tuple[int, str]] = field(default_factory=set)

    def connection_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes (monitor and session children)."""
        return [pid for pid in _descendants(self.process.pid) if _is_sshd(pid)]

    def drop_connections(self) -> int:
        """Cut every open connection, as a network drop would; returns how many processes died.

        The listening daemon stays up, so clients can reconnect on the same port.
        """
        descendants = _descendants(self.process.pid)
        sshd_pids = [pid for pid in descendants if _is_sshd(pid)]
        self._orphans.update((pid, _start_time(pid)) for pid in descendants if pid not in sshd_pids)
        for pid in sshd_pids:
            _kill(pid, signal.SIGKILL)
        _wait_gone(sshd_pids, timeout_s=5.0)
        return len(sshd_pids)

    def stop(self) -> None:
        """Stop the daemon, every connection, and what the connections started. Idempotent."""
        orphans = [pid for pid, started in self._orphans if _start_time(pid) == started]
        _stop_process_tree(self.process)
        for pid in orphans:
            _kill(pid, signal.SIGKILL)
        _wait_gone(orphans, timeout_s=5.0)


@contextlib.contextmanager
def running_sshd(directory: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 prefix: tuple[str, ...] = ()) -> Iterator[TestSshd]:
    """Start a test sshd with its keys and config under ``directory``; stop it on exit.

    ``host``/``port``: where it listens (default 127.0.0.1 and a free port); ``prefix``: a
    command that runs sshd elsewhere, e.g. ``("ip", "netns", "exec", NAME)`` (see
    ``tests/netns_hosts.py``), where ``port`` must be given.
    """
    reason = sshd_missing_reason()
    if reason is not None:
        raise SshdUnavailable(reason)
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # As root, sshd refuses to start without its privilege-separation directory.
        _PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)

    host_key = _keygen(directory / "ssh_host_ed25519_key", "test-sshd-host")
    client_key = _keygen(directory / "client_ed25519", "test-sshd-client")
    authorized = directory / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    host_public_key = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])

    started = _start(directory, host_key, authorized, host=host, port=port, prefix=prefix)
    known_hosts = directory / "known_hosts"
    name = host if started.port == 22 else f"[{host}]:{started.port}"
    known_hosts.write_text(f"{name} {host_public_key}\n")
    server = TestSshd(
        host=host,
        port=started.port,
        user=getpass.getuser(),
        client_key_path=client_key,
        known_hosts_path=known_hosts,
        host_public_key=host_public_key,
        directory=directory,
        process=started.process,
    )
    try:
        yield server
    finally:
        server.stop()


@dataclass
class _Started:
    port: int
    process: subprocess.Popen[bytes]


def _start(directory: Path, host_key: Path, authorized: Path, *, host: str = "127.0.0.1",
           port: int | None = None, prefix: tuple[str, ...] = ()) -> _Started:
    """Start sshd on ``port`` or a free one (retrying on the rare race where a free port is
    taken meanwhile), through ``prefix`` when given."""
    last_error = ""
    home = directory / "home"
    home.mkdir(exist_ok=True)
    for _attempt in range(1 if port is not None else 5):
        listen_port = port if port is not None else _free_port()
        config = directory / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {host}",
                    f"Port {listen_port}",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin yes",
                    f"PidFile {directory / 'sshd.pid'}",
                    "Subsystem sftp internal-sftp",
                    # Sessions get their own HOME and PATH: the machine's dotfiles (a
                    # pyenv init in ~/.bashrc can stall a login for a minute on a stale
                    # lock) stay out of the tests, and `python3` is the tests' interpreter.
                    f"SetEnv HOME={home} PATH={Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                    "LogLevel ERROR",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "",
                ]
            )
        )
        log = open(directory / "sshd.log", "ab")
        process = subprocess.Popen(
            [*prefix, SSHD_BINARY, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        if _wait_listening(host, listen_port, process):
            # Let the readiness probe's connection process exit, so a test starts with none.
            _wait_gone(_descendants(process.pid), timeout_s=2.0)
            return _Started(listen_port, process)
        _stop_process_tree(process)
        last_error = (directory / "sshd.log").read_text(errors="replace")[-2000:]
    raise SshdUnavailable(f"sshd did not start; its log ends with:\n{last_error}")


def _keygen(path: Path, comment: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    path.chmod(0o600)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(host: str, port: int, process: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                s.settimeout(2.0)
                # Ready means it speaks SSH, not merely that something holds the port.
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            time.sleep(0.01)
    return False


def _stop_process_tree(process: subprocess.Popen[bytes]) -> None:
    leftovers = _descendants(process.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in leftovers:
        _kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)
    _wait_gone(leftovers, timeout_s=5.0)


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(root_pid: int) -> list[int]:
    children = _children_by_parent()
    found: list[int] = []
    stack = list(children.get(root_pid, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd")
    except OSError:
        return False


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            try:
                # Reap our own children; others are reaped by their parent or init.
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not _is_alive(pid):
                break
            time.sleep(0.005)


def _is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
