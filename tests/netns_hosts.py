"""Several SSH hosts on one machine: a network namespace each, reached over a veth pair.

:func:`netns_hosts` (a context manager) and the ``netns_hosts`` pytest fixture (a factory:
``hosts = netns_hosts(3)``) build, for each host ``i``:

- a network namespace ``bk<pid>-<seq>-<i>`` with its loopback up;
- a veth pair: one end in the root namespace (``10.X.i.1/24``), the other in the host's
  namespace as ``eth0`` (``10.X.i.2/24``, the host's :attr:`NetnsHost.address`), where
  ``10.X`` is a /16 of 10.200-10.250 that no route or address of this machine uses;
- its own OpenSSH server (``tests/sshd.py``) listening on ``address:22`` inside the
  namespace, with its own host key, user key, ``known_hosts`` and ``HOME`` (so each host
  has its own ``~/.broker``). Whatever a session starts (the broker's agent, its tasks)
  runs inside that namespace too, so the namespace's process list is the host's.

What a test can do to a host: :meth:`NetnsHost.cut_link` / :meth:`NetnsHost.restore_link`
(``ip link set eth0 down|up`` inside the namespace: packets are dropped silently, as on a
lost network; TCP connections survive a short cut) or :meth:`NetnsHost.outage` (cut now,
restore after T seconds on a timer); :meth:`NetnsHost.kill_sshd` (the SSH server and its
connection processes die for good, what they started runs on); :meth:`NetnsHost.reboot`
(every process of the host killed, then sshd started again with the same keys);
:meth:`NetnsHost.signal_agents` (e.g. SIGTERM the broker's agent daemons); and read
:meth:`NetnsHost.processes` (pid and command line of everything running on the host).

Clean-up runs whatever happened: every process in each namespace is SIGKILLed, the
namespaces (and with them the veth pairs) deleted, and at start namespaces this module left
behind in a process that has since died are removed. Only the namespaces built here are
ever a traffic target.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip``: :func:`netns_missing_reason`
says why not; the fixture then skips with that reason, or fails under ``CI=true``.
Stdlib only apart from the fixture (usable from ``bench/``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from tests.sshd import SSHD_BINARY, TestSshd, _wait_listening, running_sshd, sshd_missing_reason

PREFIX = "bk"
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)-([0-9a-f]+)-(\d+)$")
_SEQ = itertools.count(1)
IP = shutil.which("ip") or "/usr/sbin/ip"


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, no kernel support)."""


def _ip(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [IP, *(("netns", "exec", netns, IP) if netns else ()), *args]
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if check and result.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.returncode}")
    return result


_REASON: list[str | None] = []


def netns_missing_reason() -> str | None:
    """Why network namespaces with sshd cannot be made here, or ``None`` if they can
    (checked once per process by making and deleting one)."""
    if _REASON:
        return _REASON[0]
    reason = sshd_missing_reason()
    if reason is None and not os.access(IP, os.X_OK):
        reason = "the `ip` command (iproute2) is not installed"
    if reason is None:
        probe = f"{PREFIX}{os.getpid():x}-0-0"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            reason = f"cannot create a network namespace (root or CAP_SYS_ADMIN needed): {made.stderr.strip()}"
        else:
            _ip("netns", "del", probe, check=False)
    _REASON.append(reason)
    return reason


@dataclass
class NetnsHost:
    """One host: its namespace, address, SSH server and home directory."""

    name: str  # the inventory's node name, e.g. "h0"
    netns: str
    address: str
    root_address: str
    sshd: TestSshd
    _timers: list[threading.Timer] = field(default_factory=list)

    @property
    def home(self) -> Path:
        """``HOME`` of the host's SSH sessions (the agent keeps ``~/.broker`` there)."""
        return self.sshd.directory / "home"

    def inventory_entry(self, slots: int, **extra: object) -> dict[str, object]:
        """The inventory's ``private:`` entry reaching this host (with its own known_hosts)."""
        entry: dict[str, object] = {
            "name": self.name, "host": self.address, "user": self.sshd.user,
            "key": str(self.sshd.client_key_path), "known_hosts": str(self.sshd.known_hosts_path),
            "slots": slots,
        }
        entry.update(extra)
        return entry

    # -- the network ------------------------------------------------------------------
    def cut_link(self) -> None:
        """Drop every packet to and from the host from now on (its processes run on)."""
        _ip("link", "set", "eth0", "down", netns=self.netns)

    def restore_link(self) -> None:
        _ip("link", "set", "eth0", "up", netns=self.netns)

    def outage(self, seconds: float) -> threading.Timer:
        """Cut the link now and restore it ``seconds`` later (on a timer thread)."""
        self.cut_link()
        timer = threading.Timer(seconds, self.restore_link)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()
        return timer

    def link_up(self) -> bool:
        flags = _ip("-o", "link", "show", "eth0", netns=self.netns).stdout.split("<", 1)[-1].split(">", 1)[0]
        return "UP" in flags.split(",")

    # -- processes --------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every process running in the host's namespace (sshd included)."""
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return sorted(int(p) for p in out.split() if p.isdigit() and _alive(int(p)))

    def processes(self) -> dict[int, str]:
        """pid -> command line of every process on the host."""
        found = {}
        for pid in self.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found[pid] = " ".join(a.decode(errors="replace") for a in argv if a)
        return found

    def broker_processes(self) -> dict[int, str]:
        """What the broker left on the host: every process but its SSH server."""
        return {pid: cmd for pid, cmd in self.processes().items() if not _is_sshd_process(pid)}

    def agent_pids(self) -> list[int]:
        """The broker's agent daemons running on the host."""
        return [pid for pid, cmd in self.processes().items() if "agent.py serve" in cmd]

    def signal_agents(self, signum: int = signal.SIGTERM) -> list[int]:
        """Send ``signum`` to every agent daemon on the host; returns their pids."""
        pids = self.agent_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return pids

    def kill_sshd(self) -> None:
        """Kill the SSH server and its connection processes for good; the commands they
        started (the agent, its tasks) keep running, as on a host whose sshd died."""
        sshd_pids = [pid for pid in self.pids() if _is_sshd_process(pid)]
        for pid in sshd_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.sshd.process.wait(timeout=5)
        _wait_until(lambda: not any(_is_sshd_process(p) for p in self.pids()), 5.0)

    def kill_all(self) -> None:
        """SIGKILL every process on the host (what a power cut does)."""
        for _round in range(20):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                self.sshd.process.wait(timeout=0.1)
            time.sleep(0.05)

    def reboot(self) -> None:
        """Every process of the host killed, then its sshd started again (same keys, port)."""
        self.kill_all()
        self.start_sshd()

    def start_sshd(self) -> None:
        """Start the host's SSH server again after :meth:`kill_sshd` or :meth:`kill_all`."""
        config = self.sshd.directory / "sshd_config"
        with open(self.sshd.directory / "sshd.log", "ab") as log:
            process = subprocess.Popen(
                [IP, "netns", "exec", self.netns, SSHD_BINARY, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self.sshd.process = process
        if not _wait_listening(self.address, self.sshd.port, process):
            raise NetnsUnavailable(f"sshd of {self.name} did not start again; see {self.sshd.directory}/sshd.log")

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self.kill_all()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _is_sshd_process(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd")
    except OSError:
        return False


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.X.0.0/16 (X in 200..250) that no address or route of this machine overlaps."""
    used = []
    for args in (("-4", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for word in _ip(*args, check=False).stdout.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    choices = list(range(200, 251))
    random.shuffle(choices)
    for x in choices:
        net = ipaddress.ip_network(f"10.{x}.0.0/16")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsUnavailable("no free 10.X.0.0/16 (X in 200..250) for the test hosts")


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces this module made in processes that are gone (a killed test run)."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1), 16)):
            continue
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


def _make_host(index: int, seq: int, subnet: ipaddress.IPv4Network, directory: Path,
               stack: contextlib.ExitStack) -> NetnsHost:
    netns = f"{PREFIX}{os.getpid():x}-{seq:x}-{index}"
    root_if, peer_if = f"{netns}r", f"{netns}p"
    if len(root_if) > 15:  # interface names are at most 15 characters
        root_if, peer_if = f"bk{seq:x}{index}r{os.getpid() % 10000}", f"bk{seq:x}{index}p{os.getpid() % 10000}"
    base = int(subnet.network_address) + (index + 1) * 256
    root_address, address = str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))
    _ip("netns", "add", netns)
    stack.callback(_ip, "netns", "del", netns, check=False)  # deletes the veth pair with it
    _ip("link", "add", root_if, "type", "veth", "peer", "name", peer_if)
    stack.callback(_ip, "link", "del", root_if, check=False)
    _ip("link", "set", peer_if, "netns", netns)
    _ip("link", "set", peer_if, "name", "eth0", netns=netns)
    _ip("addr", "add", f"{root_address}/24", "dev", root_if)
    _ip("link", "set", root_if, "up")
    _ip("link", "set", "lo", "up", netns=netns)
    _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
    _ip("link", "set", "eth0", "up", netns=netns)
    sshd = stack.enter_context(running_sshd(directory / f"h{index}", host=address, port=22,
                                            prefix=(IP, "netns", "exec", netns)))
    host = NetnsHost(name=f"h{index}", netns=netns, address=address, root_address=root_address, sshd=sshd)
    stack.callback(host.close)  # runs before the sshd's own stop and the namespace's deletion
    return host


@contextlib.contextmanager
def netns_hosts(count: int, directory: Path) -> Iterator[list[NetnsHost]]:
    """``count`` hosts (see the module's docstring), torn down on exit whatever happened."""
    reason = netns_missing_reason()
    if reason is not None:
        raise NetnsUnavailable(reason)
    remove_stale_namespaces()
    subnet = _free_subnet()
    seq = next(_SEQ)
    with contextlib.ExitStack() as stack:
        yield [_make_host(i, seq, subnet, Path(directory), stack) for i in range(count)]


# --------------------------------------------------------------------------- pytest
try:
    import pytest
except ImportError:  # used outside pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def require_netns() -> None:
        """Skip (or, under CI, fail) the calling test when namespaces cannot be made."""
        reason = netns_missing_reason()
        if reason is None:
            return
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the multi-host tests, but {reason}", pytrace=False)
        pytest.skip(f"multi-host test not run: {reason}")

    @pytest.fixture
    def netns_hosts_factory(tmp_path: Path) -> Iterator[Callable[[int], list[NetnsHost]]]:
        """``make(n)``: n hosts in network namespaces, each with its own sshd; all torn down
        after the test."""
        require_netns()
        with contextlib.ExitStack() as stack:

            def make(count: int) -> list[NetnsHost]:
                return stack.enter_context(netns_hosts(count, tmp_path / f"hosts{next(_SEQ)}"))

            yield make
