"""Reaching private nodes that are not there yet, or not any more (issue 18, item 2): the
retrying attach and reconnect of ``SshAgents``, on hosts in network namespaces whose link
the test cuts (``tests/netns_hosts.py``).

- a node unreachable at start is attached once its link comes back, in the background;
- a node whose link dropped is reconnected once it answers again, and its agent, which ran
  on meanwhile, replays what finished while the broker could not hear it;
- a node that stays away is given up after the time given, one that can never be trusted
  (an unknown host key) at once, and an abandoned try stops early.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from broker.core.model import PrivateNode
from broker.shells.nodes import SshAgents
from broker.shells.ssh import HostKeyUnknown, HostUnreachable
from tests.netns_hosts import NetnsHost, netns_hosts_factory  # noqa: F401 - fixture
from workers.protocol import Result, Run

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _node(host: NetnsHost, **extra) -> PrivateNode:
    return PrivateNode(name=host.name, slots=2, host=host.address, user=host.sshd.user,
                       key=str(host.sshd.client_key_path), known_hosts=str(host.sshd.known_hosts_path), **extra)


class _Done:
    """Collects a background ``done(value, error)`` call."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value = self.error = None
        self.at = None

    def __call__(self, value, error) -> None:
        self.value, self.error, self.at = value, error, time.monotonic()
        self.event.set()

    def wait(self, timeout_s: float = 120.0) -> "_Done":
        assert self.event.wait(timeout_s), "the background try never ended"
        return self


def _events(inbox: queue.Queue, kind: type, count: int, timeout_s: float = 60.0) -> list:
    found, deadline = [], time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        try:
            _, event = inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        if isinstance(event, kind):
            found.append(event)
    return found


def test_a_node_unreachable_at_start_is_attached_once_it_answers(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    inbox: queue.Queue = queue.Queue()
    agents = SshAgents("run-1", inbox, connect_timeout_s=2.0, max_delay_s=2.0)
    host.cut_link()
    done = _Done()
    started = time.monotonic()
    agents.attach_in_background(_node(host), done, timeout_s=120)
    time.sleep(4)
    assert not done.event.is_set()  # still trying, and nobody waits on it
    host.restore_link()
    done.wait()
    assert done.error is None and done.value.hello.slots == 2 and done.at - started >= 4
    done.value.submit([Run("t", 1, "echo hello")])
    assert [r.stdout_tail for r in _events(inbox, Result, 1)] == ["hello\n"]
    agents.stop(host.name, done.value)


def test_a_dropped_link_is_reconnected_and_what_finished_meanwhile_is_replayed(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    inbox: queue.Queue = queue.Queue()
    agents = SshAgents("run-1", inbox, connect_timeout_s=2.0, max_delay_s=2.0)
    node = _node(host)
    client = agents.attach(node)
    client.submit([Run("during", 1, "sleep 2; echo finished-while-away")])
    time.sleep(0.5)
    timer = host.outage(8.0)  # the task ends during the outage
    done = _Done()
    agents.reconnect_in_background(node, done, timeout_s=120)  # tries while the link is down
    timer.join()
    done.wait()
    assert done.error is None, done.error
    client.reattach(done.value)
    results = _events(inbox, Result, 1)
    assert [(r.task, r.stdout_tail) for r in results] == [("during", "finished-while-away\n")]
    assert len(host.agent_pids()) == 1  # the same agent daemon all along
    agents.stop(host.name, client)


def test_a_node_that_stays_away_is_given_up_after_the_time_given(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    agents = SshAgents("run-1", queue.Queue(), connect_timeout_s=1.0, max_delay_s=1.0)
    host.cut_link()
    done = _Done()
    agents.attach_in_background(_node(host), done, timeout_s=4)
    done.wait()
    assert isinstance(done.error, HostUnreachable) and "gave up after" in str(done.error)


def test_an_unknown_host_key_is_not_retried(netns_hosts_factory, tmp_path):
    (host,) = netns_hosts_factory(1)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    agents = SshAgents("run-1", queue.Queue())
    done = _Done()
    started = time.monotonic()
    untrusted = PrivateNode(name=host.name, slots=1, host=host.address, user=host.sshd.user,
                            key=str(host.sshd.client_key_path), known_hosts=str(empty))
    agents.attach_in_background(untrusted, done, timeout_s=300)
    done.wait(60)
    assert isinstance(done.error, HostKeyUnknown) and time.monotonic() - started < 30
    assert f"give private node {host.name} a known_hosts: file in the inventory" in str(done.error)


def test_an_abandoned_try_stops_early(netns_hosts_factory):
    (host,) = netns_hosts_factory(1)
    agents = SshAgents("run-1", queue.Queue(), connect_timeout_s=1.0, max_delay_s=1.0)
    host.cut_link()
    done = _Done()
    started = time.monotonic()
    agents.attach_in_background(_node(host), done, timeout_s=600)
    time.sleep(2)
    agents.abandon(host.name)
    done.wait(60)
    assert done.error is not None and time.monotonic() - started < 60
