"""SSH to private nodes and EC2 instances: connect, set up, ship the agent, stream to it.

One :class:`SshSession` per node, over paramiko with a socket we open ourselves so that
``TCP_NODELAY`` is set: the handshake is many small messages each waiting on the last, and
Nagle holds them back for ACKs (``bench/bench_ssh_connect.py``: connect+auth ~80 ms ->
~30 ms on loopback). A connection's first channel still takes ~43 ms either way, later
ones under 1 ms, so a node keeps one connection and opens its streams on it. A session runs set-up commands (:meth:`SshSession.run`), uploads files over SFTP
(:meth:`SshSession.put`, :meth:`SshSession.deploy_agent`), and opens long-lived streams
(:meth:`SshSession.open_stream`) that carry the agent protocol as a
:class:`~broker.shells.transport.Transport`.

Host keys are verified against ``known_hosts`` (the target's file, or the user's
``~/.ssh/known_hosts``); an unknown key is refused unless the target explicitly opts into
trust-on-first-use, which is logged as ``ssh.host_key_trusted`` with the key's SHA-256
fingerprint and recorded in the target's ``known_hosts`` file. A *changed* key is always
refused. Private keys readable by group or others are refused, as OpenSSH does. Key
material and passphrases never reach a log line or an error message.

Events: ``ssh.connect`` (host, port, user, ms), ``ssh.disconnect``, ``ssh.error`` (host,
port, user, error, message), ``ssh.host_key_trusted`` (host, port, key_type, fingerprint).
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import os
import posixpath
import shlex
import socket
import stat
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Sequence

import paramiko
import structlog

from broker.core.model import PrivateNode
from broker.shells.transport import wait_readable
from broker.shells.ssh_errors import (  # noqa: F401 - re-exported
    AuthenticationFailed,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    KeyFileRejected,
    RemoteCommandTimeout,
    SshError,
)
from broker.shells.ssh_hostkeys import (  # noqa: F401 - re-exported
    UnknownHostKeyPolicy,
    host_keys_from_console,
    known_hosts_entry_name,
    load_known_hosts,
    unknown_host_key_message,
    write_known_hosts,
)
from broker.shells.ssh_stream import SshTransport  # noqa: F401 - re-exported

log = structlog.get_logger()

DEFAULT_AGENT_DIR = "~/.broker/agent"


# Errors, the stream and host keys live in ssh_errors, ssh_stream and ssh_hostkeys (re-exported here).

# --------------------------------------------------------------------------- target


@dataclass(frozen=True, slots=True)
class SshTarget:
    """Where and as whom to log in.

    ``known_hosts_path=None`` checks host keys against ``~/.ssh/known_hosts``.
    ``trust_on_first_use`` accepts a host key that is *absent* from known_hosts (never one
    that differs) and appends it to ``known_hosts_path``, which it therefore requires.
    ``keepalive_s`` is the SSH keepalive interval; the socket also gives up on data left
    unacknowledged for three intervals, so a silent network drop is noticed in about
    ``3 * keepalive_s`` rather than TCP's default quarter of an hour.
    """

    host: str
    user: str
    key_path: str
    port: int = 22
    known_hosts_path: str | None = None
    trust_on_first_use: bool = False
    connect_timeout_s: float = 10.0
    keepalive_s: float = 15.0
    # The inventory entry this target comes from ("private node lab-a"), for messages.
    label: str | None = None

    def __post_init__(self) -> None:
        if self.trust_on_first_use and not self.known_hosts_path:
            raise ValueError(
                "trust_on_first_use needs a known_hosts_path to record the trusted key in"
            )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def for_node(
        cls,
        node: PrivateNode,
        known_hosts_path: str | None = None,
        trust_on_first_use: bool = False,
    ) -> SshTarget:
        """The target of an inventory's private node (which must not be ``local``); its host
        keys are checked against ``known_hosts_path``, else the node's ``known_hosts``."""
        if node.local or not node.host:
            raise ValueError(f"private node {node.name!r} has no host to reach over SSH")
        if not node.key:
            raise ValueError(f"private node {node.name!r} has no key to log in with")
        return cls(
            host=node.host,
            port=node.port,
            user=node.user or getpass.getuser(),
            key_path=node.key,
            known_hosts_path=known_hosts_path or node.known_hosts,
            trust_on_first_use=trust_on_first_use,
            label=f"private node {node.name}",
        )


# --------------------------------------------------------------------------- connect


def connect(target: SshTarget, *, tcp_nodelay: bool = True) -> SshSession:
    """Open an authenticated session to ``target`` or raise an :class:`SshError` subclass.

    ``tcp_nodelay=False`` exists only so the benchmark can show what Nagle costs.
    """
    started = time.perf_counter()
    bound = log.bind(host=target.host, port=target.port, user=target.user)
    client = paramiko.SSHClient()
    sock: socket.socket | None = None
    try:
        key = load_private_key(target.key_path)
        load_known_hosts(client, target)
        client.set_missing_host_key_policy(UnknownHostKeyPolicy(target))
        sock = _open_socket(target, tcp_nodelay)
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            pkey=key,
            sock=sock,
            timeout=target.connect_timeout_s,
            banner_timeout=target.connect_timeout_s,
            auth_timeout=target.connect_timeout_s,
            allow_agent=False,
            look_for_keys=False,
        )
    except Exception as exc:
        client.close()
        if sock is not None:
            sock.close()
        error = _explain(exc, target)
        bound.warning("ssh.error", error=type(error).__name__, message=str(error))
        if error is exc:
            raise
        raise error from exc
    transport = client.get_transport()
    assert transport is not None  # connect() returned, so it is set
    transport.set_keepalive(max(1, int(target.keepalive_s)))
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    bound.info("ssh.connect", ms=round(elapsed_ms, 1))
    return SshSession(target, client)


def load_private_key(key_path: str) -> paramiko.PKey:
    """Read a private key, refusing (like OpenSSH) one that group or others can read."""
    path = Path(key_path).expanduser()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise KeyFileRejected(f"private key {path} does not exist") from None
    except OSError as exc:
        raise KeyFileRejected(f"cannot read private key {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise KeyFileRejected(
            f"permissions {stat.S_IMODE(mode):04o} for private key {path} are too open: "
            f"other users could read it. Run: chmod 600 {path}"
        )
    passphrase_protected = KeyFileRejected(
        f"private key {path} is passphrase-protected; the broker logs in unattended, "
        "so give it a dedicated key without a passphrase (readable only by you)"
    )
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise passphrase_protected from None
    except (paramiko.SSHException, ValueError, TypeError, OSError) as exc:
        if _is_encrypted_key_file(path):  # paramiko says TypeError for an encrypted OpenSSH key
            raise passphrase_protected from None
        # The exception text may quote file contents: name its type only.
        raise KeyFileRejected(
            f"{path} is not a private key the broker can read ({type(exc).__name__}); "
            "expected an OpenSSH or PEM Ed25519, ECDSA or RSA key"
        ) from None


def _is_encrypted_key_file(path: Path) -> bool:
    """Whether a key file is encrypted: a PEM ``ENCRYPTED`` header, or an OpenSSH key whose
    cipher (the string after the ``openssh-key-v1`` magic) is not ``none``."""
    try:
        text = path.read_text("ascii", errors="replace")
    except OSError:
        return False
    if "ENCRYPTED" in text:
        return True
    begin, end = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"
    if begin not in text or end not in text:
        return False
    try:
        blob = base64.b64decode("".join(text.split(begin, 1)[1].split(end, 1)[0].split()))
    except ValueError:
        return False
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return False
    length = int.from_bytes(blob[len(magic) : len(magic) + 4], "big")
    return blob[len(magic) + 4 : len(magic) + 4 + length] != b"none"


def _open_socket(target: SshTarget, tcp_nodelay: bool) -> socket.socket:
    sock = socket.create_connection((target.host, target.port), timeout=target.connect_timeout_s)
    try:
        if tcp_nodelay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            unacked_limit_ms = int(3 * target.keepalive_s * 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, unacked_limit_ms)
    except OSError:
        sock.close()
        raise
    return sock


def _explain(exc: BaseException, target: SshTarget) -> BaseException:
    """Turn a socket or paramiko failure into an :class:`SshError` a user can act on."""
    where = target.address
    if isinstance(exc, SshError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyChanged(
            f"host key for {where} does not match known_hosts: it offered "
            f"{exc.key.get_name()} {exc.key.fingerprint}, known_hosts has "
            f"{exc.expected_key.get_name()} {exc.expected_key.fingerprint}. The machine was "
            "rebuilt or someone is intercepting the connection; check it, then fix the "
            "known_hosts entry"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return AuthenticationFailed(
            f"{where} refused key {target.key_path} for user {target.user!r}: is its public "
            f"half in ~{target.user}/.ssh/authorized_keys on that machine?"
        )
    if isinstance(exc, ConnectionRefusedError):
        return HostUnreachable(f"cannot reach {where}: connection refused (is sshd running on that port?)")
    if isinstance(exc, socket.gaierror):
        return HostUnreachable(f"cannot reach {where}: unknown host name ({exc.strerror})")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostUnreachable(
            f"cannot reach {where}: no answer within {target.connect_timeout_s:g} s"
        )
    if isinstance(exc, OSError):
        return HostUnreachable(f"cannot reach {where}: {exc.strerror or exc}")
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        return HostUnreachable(f"SSH handshake with {where} failed: {exc}")
    return exc


# --------------------------------------------------------------------------- session


class CommandResult(NamedTuple):
    exit_code: int  # -1 when the command died without an exit status (killed by a signal)
    stdout: str
    stderr: str


class SshSession:
    """An authenticated connection to one node.

    Thread-safe: commands and streams use independent channels; SFTP transfers take turns.
    """

    def __init__(self, target: SshTarget, client: paramiko.SSHClient) -> None:
        self.target = target
        self._client = client
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> SshSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """True while the SSH connection is up (false after a drop or :meth:`close`)."""
        transport = self._client.get_transport()
        return not self._closed and transport is not None and transport.is_active()

    def run(self, command: str, timeout_s: float = 300.0) -> CommandResult:
        """Run a set-up command to completion; on overrun kill it and raise :class:`RemoteCommandTimeout`.

        Not for tasks: each call costs a remote login shell (~150 ms); tasks go to the agent.
        The command runs under ``sh -c``, itself under coreutils ``timeout`` where the node
        has it: closing a channel does not stop a command that neither reads stdin nor
        writes stdout, and the SSH ``signal`` request is refused for root logins, so the
        node enforces the limit on the whole process group itself.
        """
        channel = self._open_channel()
        try:
            channel.exec_command(_under_remote_timeout(command, timeout_s))
            stdout, stderr = bytearray(), bytearray()
            deadline = time.monotonic() + timeout_s
            ready_fd = channel.fileno()
            while True:
                while channel.recv_ready():
                    stdout += channel.recv(65536)
                while channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(65536)
                if channel.eof_received or channel.closed:
                    break
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise RemoteCommandTimeout(
                        f"command on {self.target.address} did not finish within {timeout_s:g} s"
                    )
                wait_readable([ready_fd], remaining_s)  # poll: past 1,024 descriptors too
            # Whatever arrived just before end-of-file is still buffered.
            while channel.recv_ready():
                stdout += channel.recv(65536)
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
            # The exit status follows end-of-file in the same burst from the server.
            got_status = channel.status_event.wait(max(0.0, deadline - time.monotonic()))
            exit_code = channel.recv_exit_status() if got_status else -1
            if exit_code in _TIMED_OUT and time.monotonic() >= deadline:
                # The node's `timeout` stopped it first (its limit and ours are the same): a
                # loaded machine saw end-of-file before its own deadline passed.
                raise RemoteCommandTimeout(
                    f"command on {self.target.address} did not finish within {timeout_s:g} s"
                )
            return CommandResult(
                exit_code, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
            )
        finally:
            channel.close()

    def put(self, local_path: str | os.PathLike[str], remote_path: str, mode: int = 0o600) -> str:
        """Upload a file atomically (temporary name, then rename), creating its directory (0700).

        ``remote_path`` may start with ``~/`` (the login's home). Returns the absolute remote path.
        """
        path = _sftp_path(remote_path)
        staging = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
        with self._sftp_lock:  # one SFTP conversation at a time on this connection
            sftp = self._sftp_client()
            try:
                directory = posixpath.dirname(path)
                if directory:
                    self._makedirs(sftp, directory)
                sftp.put(os.fspath(local_path), staging)
                sftp.chmod(staging, mode)
                sftp.posix_rename(staging, path)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    sftp.remove(staging)
                if isinstance(exc, OSError):
                    raise SshError(
                        f"cannot upload {local_path} to {self.target.address}:{remote_path}: {exc}"
                    ) from exc
                raise
            return sftp.normalize(path)

    def deploy_agent(
        self,
        remote_dir: str = DEFAULT_AGENT_DIR,
        files: Sequence[str | os.PathLike[str]] | None = None,
    ) -> str:
        """Ship the worker agent's files into ``remote_dir``; return that directory's absolute path.

        ``files`` defaults to every module of the stdlib-only ``workers`` package, so that
        ``python3 <dir>/agent.py`` runs with its siblings next to it.
        """
        for local in files if files is not None else agent_files():
            self.put(local, posixpath.join(remote_dir, Path(local).name), mode=0o600)
        with self._sftp_lock:
            return self._sftp_client().normalize(_sftp_path(remote_dir))

    def fetch(self, remote_path: str, local_dir: str | os.PathLike[str]) -> list[Path]:
        """Download a file, or a directory with everything under it, into ``local_dir``
        (keeping its name); returns the files written. ``remote_path`` may start with ``~/``.

        Raises :class:`FileNotFoundError` when there is nothing at ``remote_path``.
        """
        path = _sftp_path(remote_path)
        target = Path(local_dir) / posixpath.basename(path.rstrip("/") or ".")
        written: list[Path] = []
        with self._sftp_lock:
            sftp = self._sftp_client()
            try:
                attrs = sftp.stat(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.target.address}:{remote_path} does not exist") from None
            try:
                self._fetch_into(sftp, path, attrs, target, written)
            except OSError as exc:
                raise SshError(f"cannot fetch {self.target.address}:{remote_path}: {exc}") from exc
        return written

    @classmethod
    def _fetch_into(cls, sftp: paramiko.SFTPClient, path: str, attrs: paramiko.SFTPAttributes, target: Path,
                    written: list[Path]) -> None:
        if stat.S_ISDIR(attrs.st_mode or 0):
            target.mkdir(parents=True, exist_ok=True)
            for entry in sftp.listdir_attr(path):
                cls._fetch_into(sftp, posixpath.join(path, entry.filename), entry, target / entry.filename, written)
        elif stat.S_ISREG(attrs.st_mode or 0):
            target.parent.mkdir(parents=True, exist_ok=True)
            sftp.get(path, os.fspath(target))
            written.append(target)
        # anything else (a socket, a dangling link listed in a directory) is skipped

    def open_stream(self, command: str) -> SshTransport:
        """Start ``command`` on a new channel and return its stdin/stdout as a Transport.

        Closing the stream (or losing the connection) ends the remote command: whatever must
        survive, like the agent's daemon, has to detach from it.
        """
        channel = self._open_channel()
        try:
            channel.exec_command(command)
        except BaseException:
            channel.close()
            raise
        return SshTransport(channel, self.target.address)

    def close(self) -> None:
        """Close the connection (and every stream on it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
        self._client.close()
        log.info("ssh.disconnect", host=self.target.host, port=self.target.port, user=self.target.user)

    # ---------------------------------------------------------------- internals

    def _open_channel(self) -> paramiko.Channel:
        transport = self._client.get_transport()
        if self._closed or transport is None or not transport.is_active():
            raise SshError(f"SSH connection to {self.target.address} is closed")
        try:
            return transport.open_session(timeout=self.target.connect_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SshError(f"cannot open a channel to {self.target.address}: {exc}") from exc

    def _sftp_client(self) -> paramiko.SFTPClient:
        """The connection's SFTP client, opened on first use; call with ``_sftp_lock`` held."""
        if self._sftp is None:
            transport = self._client.get_transport()
            if self._closed or transport is None or not transport.is_active():
                raise SshError(f"SSH connection to {self.target.address} is closed")
            self._sftp = paramiko.SFTPClient.from_transport(transport)
            if self._sftp is None:
                raise SshError(f"{self.target.address} refused the SFTP subsystem")
        return self._sftp

    @staticmethod
    def _makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
        """``mkdir -p`` over SFTP; the directories it creates are private (0700)."""
        missing: list[str] = []
        current = directory
        while current not in ("", "/", "."):
            try:
                sftp.stat(current)
                break
            except FileNotFoundError:
                missing.append(current)
                current = posixpath.dirname(current)
        for path in reversed(missing):
            try:
                sftp.mkdir(path, mode=0o700)
            except OSError:
                # Another session may have created it meanwhile; anything else shows on put.
                sftp.stat(path)


# coreutils timeout's exit status when it stopped the command: TERM (124), or KILL (128 + 9).
_TIMED_OUT = (124, 137)


def _under_remote_timeout(command: str, timeout_s: float) -> str:
    """``command`` wrapped so the node stops its process group after ``timeout_s``.

    ``timeout`` sends TERM to the group, then KILL a second later; without coreutils the
    command runs unwrapped (only the local deadline applies).
    """
    quoted = shlex.quote(command)
    return (
        f"if command -v timeout >/dev/null 2>&1; "
        f"then exec timeout -k 1 {timeout_s:g} sh -c {quoted}; "
        f"else exec sh -c {quoted}; fi"
    )


def agent_files() -> list[Path]:
    """The worker agent's modules, found next to the installed ``workers`` package."""
    import workers

    package_dir = Path(workers.__file__).parent
    return sorted(p for p in package_dir.glob("*.py") if p.name != "__init__.py")


def _sftp_path(remote_path: str) -> str:
    """SFTP paths are relative to the login's home: map ``~`` and ``~/x`` onto that."""
    if remote_path == "~":
        return "."
    if remote_path.startswith("~/"):
        return remote_path[2:]
    return remote_path


# Failures worth waiting out while a machine boots: sshd not listening yet, or cloud-init
# not done installing the login's authorized key. A host key that is unknown or changed,
# or an unusable key file, never gets better by waiting.
_TRANSIENT = (HostUnreachable, AuthenticationFailed)


def connect_when_up(
    target: SshTarget,
    timeout_s: float,
    *,
    first_delay_s: float = 1.0,
    max_delay_s: float = 15.0,
    clock=time.monotonic,
    sleep=time.sleep,
    cancelled=lambda: False,
) -> SshSession:
    """Connect to a machine that is still booting: retry transient failures with doubling delays.

    Waits ``first_delay_s``, ``2 x`` that, ... (at most ``max_delay_s``) between attempts,
    each attempt bounded by what is left of ``timeout_s``. Raises the last error, its message
    extended with the attempts made and the time waited, once ``timeout_s`` is spent or
    ``cancelled()`` turns true; a non-transient error (host key, key file) at once.
    """
    deadline = clock() + timeout_s
    delay = first_delay_s
    attempts = 0
    while True:
        attempts += 1
        left = deadline - clock()
        bounded = replace(target, connect_timeout_s=max(1.0, min(target.connect_timeout_s, left)))
        try:
            return connect(bounded)
        except _TRANSIENT as exc:
            left = deadline - clock()
            if left <= 0 or cancelled():
                raise type(exc)(
                    f"{exc} (gave up after {attempts} attempt{'s' if attempts != 1 else ''} "
                    f"in {timeout_s:g} s)"
                ) from exc
            log.info("ssh.retry", host=target.host, port=target.port, attempt=attempts,
                     error=type(exc).__name__, delay_s=round(min(delay, left), 3))
            sleep(min(delay, left))
            delay = min(delay * 2, max_delay_s)
