"""How the live shell reaches a node's worker agent: its local socket or an SSH stream.

- the private ``local: true`` node, and every dry-run "instance", get a detached agent on
  this machine serving ``run_dir/agents/<node>`` (:func:`connect_local_agent`); the addresses
  moto reports are never contacted;
- a private node with a host is reached over SSH: connect (host key checked against
  known_hosts), ship the agent's files, and open a stream to ``agent.py attach``, whose
  daemon survives a dropped connection;
- an EC2 instance of a live run is reached the same way once it has booted
  (:class:`InstanceAgents`: its address from describe_instances, its host key from its
  console or known_hosts, SSH retried with backoff until ``aws.ssh_timeout``).

``attach`` returns a :class:`~broker.shells.agent_client.AgentClient` after its handshake;
``stop`` ends the agent (cancelling what it runs) and is safe to call twice.
"""

from __future__ import annotations

import posixpath
import queue
import shlex
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import structlog

from broker.config.aws import AwsSettings
from broker.core.model import PrivateNode
from broker.shells.agent_client import AgentClient, HandshakeError
from broker.shells.attach_pool import AttachPool
from broker.shells.local_transport import connect_local_agent, stop_local_agent
from broker.shells.node_files import fetch_local, fetch_over_ssh
from broker.shells.private_files import private_dir
from broker.shells.transport import TransportClosed
from broker.shells.ssh_errors import is_transient, raise_with

log = structlog.get_logger()

AGENTS_DIR = "agents"
REMOTE_AGENT_ROOT = "~/.broker"
# An agent with no broker for this long cancels its tasks and exits (a private node's own
# ``lease`` overrides it): no agent is left running for ever after a crash nobody resumed.
DEFAULT_LEASE_S = 3600.0
# Local agents attached at once: each is two Python start-ups, CPU-bound. Started while the
# first nodes' tasks already load the machine, the last of 16 local agents were ready 2.5-3.7 s
# into the run at 8 at once (issue 20, ``bench/bench_daemon.py``); all at once, before the load.
LOCAL_ATTACH_CONCURRENCY = 32
SPOT_OPTIONS = ("--spot-metadata", "http://169.254.169.254")  # a spot instance's agent: EC2's metadata
# A local agent's re-attach met a socket that accepted and closed (its agent killed a moment
# before, still exiting): tries, and the pause between them.
REATTACH_TRIES, REATTACH_PAUSE_S = 3, 0.1


def agent_dir(run_dir: Path, node: str) -> Path:
    return Path(run_dir) / AGENTS_DIR / node


class LocalAgents:
    """Agents on this machine, one state directory per node under ``run_dir/agents``."""

    def __init__(self, run_dir: Path, inbox: queue.Queue, handshake_timeout_s: float = 15.0,
                 lease_s: float | None = DEFAULT_LEASE_S) -> None:
        self.run_dir = Path(run_dir)
        self.inbox = inbox
        self.handshake_timeout_s = handshake_timeout_s
        self.lease_s = lease_s
        self.spot_metadata_of: Callable[[str], str] | None = None  # a dry run's fake metadata URL per instance
        self.spot_poll_s: float | None = None
        self._background = AttachPool(LOCAL_ATTACH_CONCURRENCY, self.stop, "local-attach")

    def attach_in_background(self, node: str, slots: int, done: Callable[[Any, BaseException | None], None],
                             spot: bool = False) -> None:
        """:meth:`attach` off the caller's thread, at most ``LOCAL_ATTACH_CONCURRENCY`` at once (:class:`AttachPool`)."""
        self._background.submit(node, lambda: self.attach(node, slots, spot=spot), done)

    def _spot_options(self, node: str, spot: bool) -> dict[str, Any]:
        ok = spot and self.spot_metadata_of is not None
        return {"spot_metadata": self.spot_metadata_of(node), "spot_poll_s": self.spot_poll_s} if ok else {}

    def attach(self, node: str, slots: int, expect: tuple = (), spot: bool = False) -> AgentClient:
        """``expect``: Runs a previous daemon submitted there (see AgentClient); ``spot``: its agent watches."""
        state_dir = private_dir(agent_dir(self.run_dir, node))  # 0700 before the agent's first file
        transport = connect_local_agent(state_dir, slots, node=node, grace_s=1.0, lease_s=self.lease_s,
                                        **self._spot_options(node, spot))
        try:
            return AgentClient(transport, node, inbox=self.inbox, handshake_timeout_s=self.handshake_timeout_s,
                               expect=expect, started=False)
        except Exception:
            transport.close()
            stop_local_agent(state_dir)
            raise

    def reattach(self, node: str, slots: int, client: AgentClient, spot: bool = False) -> None:
        """A new connection for ``client`` after its agent's link broke; starts the agent
        again on the same state directory if it is gone (it then reports what it lost). An
        agent killed a moment ago can still accept a connection on its socket and then drop
        it: such a handshake is tried again, up to :data:`REATTACH_TRIES` times."""
        for tries_left in range(REATTACH_TRIES - 1, -1, -1):
            transport = connect_local_agent(agent_dir(self.run_dir, node), slots, node=node, grace_s=1.0,
                                            lease_s=self.lease_s, **self._spot_options(node, spot))
            try:
                client.reattach(transport)
                return
            except HandshakeError as exc:
                transport.close()
                if not exc.closed or not tries_left:
                    raise
                time.sleep(REATTACH_PAUSE_S)
            except Exception:
                transport.close()
                raise

    def stop(self, node: str, client: AgentClient | None) -> None:
        if client is None:
            self._background.abandon(node)  # an attach under way gives up
        _close_client(client, wait_s=2.0)
        stop_local_agent(agent_dir(self.run_dir, node))

    def fetch(self, node: str, workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]:
        """Copy a task's output (file or directory) from this machine into ``dest``."""
        return fetch_local(workdir, path, dest, env)


class SshAgents:
    """Agents on private nodes reached over SSH (one connection per node, kept open).

    :meth:`attach` and :meth:`reattach` connect once, in the caller's thread. The
    ``*_in_background`` forms retry on a thread of their own (doubling pauses from 1 s up to
    ``max_delay_s``, each attempt bounded by ``connect_timeout_s``) for as long as they are
    given, so that one node that does not answer holds up neither the daemon's loop nor the
    other nodes; :meth:`abandon` (and :meth:`stop`) makes such a try give up at its next step.
    At most ``concurrency`` tries (connect and ship the agent) run at once, whatever the
    number of nodes; the pauses between tries hold no place. A node that refuses us (a host
    key unknown or changed, our key refused, an unusable key file, no key) is not retried:
    waiting never mends it (:func:`~broker.shells.ssh_errors.is_refusal`).
    """

    def __init__(self, run_id: str, inbox: queue.Queue, handshake_timeout_s: float = 30.0,
                 known_hosts_path: str | None = None, remote_root: str = REMOTE_AGENT_ROOT,
                 connect_timeout_s: float = 10.0, max_delay_s: float = 30.0, concurrency: int = 8) -> None:
        self.run_id = run_id
        self._gate = threading.BoundedSemaphore(concurrency)
        self.inbox = inbox
        self.handshake_timeout_s = handshake_timeout_s
        self.known_hosts_path = known_hosts_path
        self.remote_root = remote_root
        self.connect_timeout_s = connect_timeout_s
        self.max_delay_s = max_delay_s
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}
        self._abandoned: set[str] = set()
        self._handed: dict[str, AgentClient] = {}  # attached in the background, maybe not taken yet

    def attach(self, node: PrivateNode, expect: tuple = (), timeout_s: float | None = None) -> AgentClient:
        """Connect (retrying for ``timeout_s`` if given), ship the agent, attach; ``expect``:
        the attempts a resumed run's journal says this agent runs (those it does not know
        come back as lost)."""
        transport = self._open(node, timeout_s)
        try:
            return AgentClient(transport, node.name, inbox=self.inbox,
                               handshake_timeout_s=self.handshake_timeout_s, expect=expect, started=False)
        except Exception:
            transport.close()
            self._drop_session(node.name)
            raise

    def reattach(self, node: PrivateNode, client: AgentClient, timeout_s: float | None = None) -> None:
        """A new SSH connection for ``client`` after its link dropped; the agent daemon on the
        node outlived the old one and replays what finished meanwhile."""
        self._drop_session(node.name)
        client.reattach(self._open(node, timeout_s))

    def attach_in_background(self, node: PrivateNode, done: Callable[[AgentClient | None, BaseException | None], None],
                             expect: tuple = (), timeout_s: float | None = None,
                             on_retry: Callable[[BaseException], None] | None = None) -> None:
        """:meth:`attach` on a thread of its own, retrying for ``timeout_s`` (the node's grace
        by default); then ``done(client, None)`` or ``done(None, error)``. ``on_retry(error)``
        is called once, when the first try failed and the node is being tried again. An
        attach that succeeds after :meth:`abandon` stops the agent it started and reports an
        error: nobody may be left to take it."""
        def work() -> AgentClient:
            transport = self._open(node, node.grace_s if timeout_s is None else timeout_s, on_retry)
            try:
                client = AgentClient(transport, node.name, inbox=self.inbox,
                                     handshake_timeout_s=self.handshake_timeout_s, expect=expect, started=False)
            except Exception:
                transport.close()
                self._drop_session(node.name)
                raise
            with self._lock:
                abandoned = node.name in self._abandoned
                if not abandoned:
                    self._handed[node.name] = client  # until its taker has it: stop() still reaches it
            if abandoned:
                self.stop(node.name, client)
                raise ConnectionAbortedError(f"private node {node.name}: given up while its agent was started")
            return client

        self._background(f"attach-{node.name}", node.name, done, work)

    def reconnect_in_background(self, node: PrivateNode, done: Callable[[Any, BaseException | None], None],
                                timeout_s: float | None = None) -> None:
        """A new connection and agent stream to ``node``, on a thread of its own, retrying for
        ``timeout_s`` (the node's grace by default); ``done(transport, None)`` or
        ``done(None, error)``. The caller hands the transport to its client
        (``AgentClient.reattach``) on its own thread, where it submits."""
        self._drop_session(node.name)
        self._background(f"reconnect-{node.name}", node.name, done,
                         lambda: self._open(node, node.grace_s if timeout_s is None else timeout_s))

    def abandon(self, node: str) -> None:
        """Make a background attach or reconnect to ``node`` give up at its next step."""
        with self._lock:
            self._abandoned.add(node)

    def _background(self, name: str, node: str, done: Callable[[Any, BaseException | None], None],
                    work: Callable[[], Any]) -> None:
        with self._lock:
            self._abandoned.discard(node)

        def run() -> None:
            try:
                value = work()
            except Exception as exc:  # noqa: BLE001 - handed to the caller, which reports it
                done(None, exc)
                return
            done(value, None)

        threading.Thread(target=run, name=name, daemon=True).start()

    def _is_abandoned(self, node: str) -> bool:
        with self._lock:
            return node in self._abandoned

    def _open(self, node: PrivateNode, timeout_s: float | None = None,
              on_retry: Callable[[BaseException], None] | None = None):
        """An agent stream to ``node``: one try, or tries for ``timeout_s`` with doubling
        pauses (a link that drops again while the agent is shipped is tried again too)."""
        if timeout_s is None:
            return self._open_once(node)
        deadline = time.monotonic() + timeout_s
        delay, tries = 1.0, 0
        while True:
            tries += 1
            try:
                with self._gate:  # at most `concurrency` tries at once, across all nodes
                    if self._is_abandoned(node.name):
                        raise ConnectionAbortedError(f"private node {node.name}: given up while connecting")
                    return self._open_once(node)
            except Exception as exc:  # noqa: BLE001 - filtered below
                left = deadline - time.monotonic()
                if not is_transient(exc) or left <= 0 or self._is_abandoned(node.name):
                    if is_transient(exc) and left <= 0:
                        raise_with(exc, f" (gave up after {tries} tr{'ies' if tries != 1 else 'y'} in {timeout_s:g} s)")
                    raise
                if tries == 1 and on_retry is not None:
                    on_retry(exc)
                log.info("ssh.retry", node=node.name, error=type(exc).__name__, delay_s=round(min(delay, left), 3))
                time.sleep(min(delay, left))
                delay = min(delay * 2, self.max_delay_s)

    def _open_once(self, node: PrivateNode):
        from broker.shells.ssh import SshTarget, connect

        target = replace(SshTarget.for_node(node, known_hosts_path=self.known_hosts_path),
                         connect_timeout_s=self.connect_timeout_s)
        session = connect(target)
        if self._is_abandoned(node.name):
            session.close()
            raise ConnectionAbortedError(f"private node {node.name}: given up while connecting")
        with self._lock:
            self._sessions[node.name] = session
        try:
            return open_remote_agent_stream(session, self.run_id, node.name, node.slots, self.remote_root,
                                            agent_options=node_agent_options(node))
        except BaseException:
            self._drop_session(node.name)
            raise

    def _drop_session(self, node: str) -> None:
        with self._lock:
            session = self._sessions.pop(node, None)
        if session is not None:
            session.close()

    def stop(self, node: str, client: AgentClient | None) -> None:
        """Stop the node's agent (``client``, or the one a background attach made for it)."""
        self.abandon(node)
        with self._lock:
            handed = self._handed.pop(node, None)
        _close_client(client or handed, wait_s=5.0)
        self._drop_session(node)

    def fetch(self, node: str, workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]:
        """Fetch a task's output (file or directory) from the node over SFTP into ``dest``."""
        with self._lock:
            session = self._sessions.get(node)
        return fetch_over_ssh(session, node, workdir, path, dest, env)


def node_agent_options(node: PrivateNode) -> tuple[str, ...]:
    """The agent options a private node's inventory entry sets: its lease and keep."""
    return ("--lease-s", f"{node.lease_s:g}", "--keep-s", f"{node.keep_s:g}")


def remote_state_dir(run_id: str, node: str, remote_root: str = REMOTE_AGENT_ROOT) -> str:
    """The agent's state directory for ``node`` of run ``run_id``, as a remote shell word."""
    return remote_path(remote_root, f"runs/{run_id}/{node}")


def remote_path(root: str, rest: str) -> str:
    """``root/rest`` for a remote shell: quoted, except a leading ``~`` the shell must expand."""
    if root == "~" or root.startswith("~/"):
        return "~/" + shlex.quote(posixpath.join(root[2:], rest))
    return shlex.quote(posixpath.join(root, rest))


def start_remote_agent(
    session: Any,
    run_id: str,
    node: str,
    slots: int,
    inbox: queue.Queue,
    handshake_timeout_s: float,
    remote_root: str = REMOTE_AGENT_ROOT,
    expect: tuple = (),
    spot: bool = False,
) -> AgentClient:
    """Ship the agent over ``session`` and attach to it (starting its daemon if none runs).

    The daemon's state lives in ``<remote_root>/runs/<run_id>/<node>`` on the node; ``spot``:
    its agent watches EC2's metadata for the notice."""
    transport = open_remote_agent_stream(session, run_id, node, slots, remote_root, spot=spot)
    return AgentClient(transport, node, inbox=inbox, handshake_timeout_s=handshake_timeout_s, expect=expect,
                       started=False)


def open_remote_agent_stream(session: Any, run_id: str, node: str, slots: int,
                             remote_root: str = REMOTE_AGENT_ROOT,
                             agent_options: tuple[str, ...] = ("--lease-s", f"{DEFAULT_LEASE_S:g}"),
                             spot: bool = False) -> Any:
    """Ship the agent over ``session`` and open a stream to it (``attach`` starts its daemon
    if none runs, else joins the one that outlived an earlier connection). ``agent_options``
    are passed on to the daemon (its lease, keep); ``spot``: it watches EC2's metadata for the notice."""
    remote_dir = session.deploy_agent(f"{remote_root}/agent")
    q = shlex.quote
    command = (
        f"python3 -B {q(remote_dir + '/agent.py')} attach"  # -B: no __pycache__ (0755 under the login's umask)
        f" --state-dir {remote_state_dir(run_id, node, remote_root)}"
        f" --slots {int(slots)} --node {q(node)}"
        + "".join(f" {q(option)}" for option in agent_options + (SPOT_OPTIONS if spot else ()))
    )
    return session.open_stream(command)


def stop_remote_agent(session: Any, run_id: str, node: str, remote_root: str = REMOTE_AGENT_ROOT,
                      keep_s: float | None = None, timeout_s: float = 60.0) -> dict[str, Any]:
    """Stop the agent of ``node`` for run ``run_id`` over ``session`` and every task it ran
    (``agent.py stop``), and apply ``keep_s`` to its state; returns what the agent reported."""
    import json

    remote_dir = session.deploy_agent(f"{remote_root}/agent")
    command = (f"python3 -B {shlex.quote(remote_dir + '/agent.py')} stop"
               f" --state-dir {remote_state_dir(run_id, node, remote_root)}"
               + (f" --keep-s {keep_s:g}" if keep_s is not None else ""))
    result = session.run(command, timeout_s=timeout_s)
    lines = result.stdout.strip().splitlines()
    if result.exit_code != 0 or not lines:
        raise ConnectionError(f"`agent.py stop` on {node} failed (exit {result.exit_code}): "
                              f"{result.stderr.strip()[-500:] or 'no output'}")
    return json.loads(lines[-1])


class InstanceUnreachable(ConnectionError):
    """An instance gave no address, host key or SSH login within ``aws.ssh_timeout``."""


class InstanceAgents:
    """Agents on EC2 instances, reached over SSH once they have booted.

    ``attach(instance_id, slots)`` waits (doubling pauses of 1 s up to 15 s, all within the
    inventory's ``aws.ssh_timeout``) for the instance's address, then for its host key
    under ``aws.host_key_policy``, then for an SSH login as ``aws.user`` with ``aws.key``;
    it ships the agent, starts it and returns the client after its handshake. Whatever
    fails raises with the instance and what was missing named; the daemon then reports
    ``node.lost`` and releases the instance, and the controller re-plans without it.

    Host keys (a fresh instance's are new by definition):

    - ``console`` (default): the keys cloud-init prints on the instance's console, read
      through the EC2 API (``console_of``), become the only keys accepted for that instance
      (``run_dir/known_hosts.d/<id>``); any other key is refused as changed;
    - ``known-hosts``: ``aws.known_hosts`` (default ``~/.ssh/known_hosts``) must already hold
      the key, e.g. for an AMI with baked-in host keys;
    - ``accept-new``: trust on first use, each acceptance logged as ``ssh.host_key_trusted``
      with the fingerprint and recorded in ``run_dir/known_hosts.d/<id>``.

    ``address_of(instance_id)`` gives the IP to use (``None`` while there is none);
    ``console_of(instance_id)`` the console text. Both are injected: live runs pass the
    fleet's lookups, tests map moto's instances to an sshd on 127.0.0.1 (moto's IPs are
    invented and must never be contacted).
    """

    def __init__(
        self,
        run_id: str,
        run_dir: Path,
        inbox: queue.Queue,
        settings: AwsSettings,
        *,
        address_of: Callable[[str], str | None],
        console_of: Callable[[str], str | None] | None = None,
        handshake_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not settings.key:
            raise ValueError("instances are reached over SSH with aws.key, which the inventory does not give")
        if settings.host_key_policy == "console" and console_of is None:
            raise ValueError("host_key_policy console needs a console_of lookup")
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        self.inbox = inbox
        self.settings = settings
        self.address_of = address_of
        self.console_of = console_of
        self.handshake_timeout_s = handshake_timeout_s
        self.remote_root = settings.agent_dir.rstrip("/") or "/"
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}
        self._abandoned: set[str] = set()

    def attach(self, node: str, slots: int, expect: tuple = (), spot: bool = False) -> AgentClient:
        session = self._connect(node, self.settings.ssh_timeout_s)
        try:
            if self._is_abandoned(node):
                raise InstanceUnreachable(f"instance {node} was released while its agent was being started")
            return start_remote_agent(session, self.run_id, node, slots, self.inbox, self.handshake_timeout_s,
                                      self.remote_root, expect, spot)
        except BaseException:
            with self._lock:
                self._sessions.pop(node, None)
            session.close()
            raise

    def reattach(self, node: str, slots: int, client: AgentClient, timeout_s: float = 30.0, spot: bool = False) -> None:
        """A new SSH connection for ``client`` after its link dropped (the agent daemon on the
        instance outlived it and replays what finished meanwhile). It blocks the caller for at
        most ``timeout_s`` (or ``aws.ssh_timeout`` if shorter) before giving up."""
        with self._lock:
            old = self._sessions.pop(node, None)
        if old is not None:
            old.close()
        session = self._connect(node, min(timeout_s, self.settings.ssh_timeout_s))
        try:
            client.reattach(open_remote_agent_stream(session, self.run_id, node, slots, self.remote_root, spot=spot))
        except BaseException:
            with self._lock:
                self._sessions.pop(node, None)
            session.close()
            raise

    def _connect(self, node: str, timeout_s: float) -> Any:
        """An SSH session to the instance once it has an address, a trusted host key and sshd."""
        from broker.shells.ssh import SshTarget, connect_when_up

        s = self.settings
        deadline = self._clock() + timeout_s
        host = self._wait_for(node, lambda: self.address_of(node), deadline, f"{s.address} IP address")
        known_hosts, tofu = self._host_keys(node, host, deadline)
        target = SshTarget(host=host, port=s.ssh_port, user=s.user, key_path=s.key,
                           known_hosts_path=known_hosts, trust_on_first_use=tofu)
        try:
            session = connect_when_up(target, max(1.0, deadline - self._clock()), clock=self._clock,
                                      sleep=self._sleep, cancelled=lambda: self._is_abandoned(node))
        except ConnectionError as exc:
            raise InstanceUnreachable(f"instance {node}: {exc}") from exc
        with self._lock:
            self._sessions[node] = session
        return session

    def attach_in_background(self, node: str, slots: int,
                             done: Callable[[AgentClient | None, BaseException | None], None],
                             spot: bool = False) -> None:
        """:meth:`attach` on a thread of its own; ``done(client, None)`` or ``done(None, error)``
        after. The daemon's loop goes on meanwhile (a boot can take minutes), and a
        :meth:`stop` before the end abandons the attempt."""

        def work() -> None:
            try:
                client = self.attach(node, slots, spot=spot)
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which reports it
                done(None, exc)
                return
            if self._is_abandoned(node):  # released meanwhile: nobody may be left to take it
                self.stop(node, client)
                done(None, InstanceUnreachable(f"instance {node} was released while its agent was being started"))
                return
            done(client, None)

        threading.Thread(target=work, name=f"attach-{node}", daemon=True).start()

    def fetch(self, node: str, workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]:
        """Fetch a task's output (file or directory) from the instance over SFTP into ``dest``."""
        with self._lock:
            session = self._sessions.get(node)
        return fetch_over_ssh(session, node, workdir, path, dest, env)

    def stop(self, node: str, client: AgentClient | None) -> None:
        with self._lock:
            if client is None:
                self._abandoned.add(node)  # an attach under way gives up at its next step
            session = self._sessions.pop(node, None)
        _close_client(client, wait_s=5.0)
        if session is not None:
            session.close()

    def _is_abandoned(self, node: str) -> bool:
        with self._lock:
            return node in self._abandoned

    def known_hosts_file(self, node: str) -> Path:
        return self.run_dir / "known_hosts.d" / node

    def _host_keys(self, node: str, host: str, deadline: float) -> tuple[str | None, bool]:
        """The known_hosts file to check the instance against, and whether to trust on first use."""
        from broker.shells.ssh import host_keys_from_console, write_known_hosts

        policy = self.settings.host_key_policy
        if policy == "known-hosts":
            return self.settings.known_hosts, False
        path = self.known_hosts_file(node)
        if policy == "accept-new":
            return str(path), True
        assert self.console_of is not None  # checked in __init__
        keys = self._wait_for(node, lambda: host_keys_from_console(self.console_of(node) or "") or None,
                              deadline, "SSH host keys on its console (cloud-init prints them at first boot)")
        write_known_hosts(path, host, self.settings.ssh_port, keys)
        log.info("ssh.host_keys_from_console", instance_id=node, host=host,
                 key_types=[key_type for key_type, _ in keys], known_hosts=str(path))
        return str(path), False

    def _wait_for(self, node: str, probe: Callable[[], Any], deadline: float, what: str) -> Any:
        delay = 1.0
        while True:
            if self._is_abandoned(node):
                raise InstanceUnreachable(f"instance {node} was released while waiting for its {what}")
            value = probe()
            if value is not None:
                return value
            left = deadline - self._clock()
            if left <= 0:
                raise InstanceUnreachable(
                    f"instance {node} gave no {what} within aws.ssh_timeout ({self.settings.ssh_timeout_s:g} s)")
            self._sleep(min(delay, left))
            delay = min(delay * 2, 15.0)


def _close_client(client: AgentClient | None, wait_s: float) -> None:
    """Ask the agent to stop its tasks, wait a little for it to hang up, and close."""
    if client is None:
        return
    try:
        client.shutdown(drain=False)
        client.wait_closed(wait_s)
    except TransportClosed:
        pass  # closed already (a re-attach that failed retires its link): nothing to ask it
    finally:
        client.close()
