"""The multi-host harness itself (tests/netns_hosts.py): each host is its own SSH server in
its own network namespace; a cut link, a dead sshd and a reboot do what they say; nothing
is left behind."""

from __future__ import annotations

import subprocess
import time

import pytest

from broker.shells.ssh import HostUnreachable, SshTarget, connect
from tests.netns_hosts import netns_hosts, netns_hosts_factory, require_netns  # noqa: F401 - fixture


def _target(host, timeout_s: float = 3.0) -> SshTarget:
    return SshTarget(host=host.address, port=22, user=host.sshd.user, key_path=str(host.sshd.client_key_path),
                     known_hosts_path=str(host.sshd.known_hosts_path), connect_timeout_s=timeout_s)


def test_each_host_is_its_own_machine(netns_hosts_factory):
    hosts = netns_hosts_factory(2)
    assert len({h.address for h in hosts}) == 2 and len({h.netns for h in hosts}) == 2
    for host in hosts:
        with connect(_target(host)) as session:
            result = session.run("echo $HOME; sleep 300 > /dev/null 2>&1 & echo $!")
        home, pid = result.stdout.split()
        assert home == str(host.home)
        assert int(pid) in host.pids()  # what a session starts runs inside the host's namespace
        assert "sleep 300" in host.broker_processes()[int(pid)]
    other = hosts[1]
    assert not set(hosts[0].broker_processes()) & set(other.broker_processes())


def test_a_cut_link_drops_packets_until_it_is_restored(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    with connect(_target(host)) as session:
        assert session.run("echo up").stdout.strip() == "up"
    host.cut_link()
    assert not host.link_up()
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="no answer within"):  # silence, not a refusal
        connect(_target(host, timeout_s=2.0))
    assert time.monotonic() - started >= 1.5
    host.restore_link()
    with connect(_target(host)) as session:
        assert session.run("echo back").stdout.strip() == "back"
    timer = host.outage(1.0)
    timer.join(10)
    assert host.link_up()


def test_a_killed_sshd_leaves_its_commands_running_and_a_reboot_kills_them(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    with connect(_target(host)) as session:
        pid = int(session.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!").stdout)
    host.kill_sshd()
    with pytest.raises(HostUnreachable, match="refused"):
        connect(_target(host))
    assert pid in host.pids()  # the host runs on without its SSH server
    host.reboot()
    assert pid not in host.pids()
    with connect(_target(host)) as session:
        assert session.run("echo rebooted").stdout.strip() == "rebooted"


def test_nothing_is_left_after_the_hosts_are_torn_down(tmp_path):
    require_netns()
    with netns_hosts(2, tmp_path) as hosts:
        names = [h.netns for h in hosts]
        for host in hosts:
            with connect(_target(host)) as session:
                session.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
        pids = [p for h in hosts for p in h.pids()]
        assert pids
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
