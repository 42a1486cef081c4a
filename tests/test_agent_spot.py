"""The agent reads the spot interruption notice from a real HTTP endpoint (IMDSv2) and reports it.

The endpoint is ``broker.shells.fake_imds``: an http.server on 127.0.0.1 that refuses a
read without a token got by PUT with the TTL header, as EC2's metadata service does.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from broker.shells.agent_client import AgentClient
from broker.shells.fake_imds import FakeMetadata
from broker.shells.local_transport import attach_local_agent
from tests.test_agent import agent_dir  # noqa: F401 - fixture: stops the agent, fails on leftover tasks
from workers import imds
from workers.protocol import Connection, Interruption, Result, Run, decode, encode


@pytest.fixture
def metadata():
    with FakeMetadata() as fake:
        yield fake


def events_until(client: AgentClient, wanted, timeout_s: float = 30.0) -> list:
    """Events until one satisfies ``wanted`` (a hang guard, not a speed limit)."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in client.poll(0.1):
            seen.append(event)
            if wanted(event):
                return seen
    raise AssertionError(f"nothing wanted arrived within {timeout_s:g} s: {seen}")


def test_the_notice_is_read_over_imdsv2_and_reported_to_the_master(metadata, agent_dir):
    url = metadata.base_url("i-0abc")
    client = AgentClient(attach_local_agent(agent_dir, 2, grace_s=1.0, spot_metadata=url, spot_poll_s=0.05), "i-0abc")
    try:
        client.submit([Run("long", 1, "sleep 30")])
        events_until(client, lambda e: not isinstance(e, Result) and getattr(e, "task", None) == "long")
        # The agent polls, and there is no notice: 404s, no Interruption.
        deadline = time.monotonic() + 30
        while sum(1 for m, p, ok in metadata.requests if m == "GET" and ok) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [e for e in client.poll(0.2) if isinstance(e, Interruption)]
        terminate_at = time.time() + 120
        metadata.post_notice("i-0abc", terminate_at)
        seen = events_until(client, lambda e: isinstance(e, Interruption))
        notice = seen[-1]
        assert notice.action == "terminate"
        assert notice.time == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(terminate_at)))
        assert 90 < notice.in_s <= 121  # measured on the node's clock against the document's time
        assert not [e for e in seen if isinstance(e, Result)], "the notice ended no task: the master decides"
    finally:
        client.close()
    # Every read carried the token got by PUT with the TTL header: IMDSv2, not v1.
    gets = [(m, p, ok) for m, p, ok in metadata.requests if m == "GET"]
    assert gets and all(ok and p == "/i-0abc" + imds.ACTION_PATH for _, p, ok in gets)
    assert ("PUT", "/i-0abc" + imds.TOKEN_PATH, False) in metadata.requests


def test_a_master_that_attaches_after_the_notice_hears_it_after_the_hello(metadata, agent_dir):
    metadata.post_notice("i-1", time.time() + 60)
    url = metadata.base_url("i-1")
    first = AgentClient(attach_local_agent(agent_dir, 1, spot_metadata=url, spot_poll_s=0.05), "i-1")
    events_until(first, lambda e: isinstance(e, Interruption))
    first.close()
    second = AgentClient(attach_local_agent(agent_dir, 1), "i-1")  # the daemon that watches is reached
    try:
        notice = events_until(second, lambda e: isinstance(e, Interruption))[-1]
        assert notice.action == "terminate" and 0 < notice.in_s <= 61
    finally:
        second.close()


def test_an_agent_not_told_it_is_on_spot_never_asks(metadata, agent_dir):
    client = AgentClient(attach_local_agent(agent_dir, 1, grace_s=1.0), "n")
    try:
        client.submit([Run("t", 1, "true")])
        events_until(client, lambda e: isinstance(e, Result))
    finally:
        client.close()
    assert metadata.requests == []


def test_the_metadata_client_refuses_nothing_a_v1_read_would_get(metadata):
    """Without a token the fake answers 401, as IMDSv2 does: the client must PUT first."""
    request = urllib.request.Request(metadata.base_url("i-2") + imds.ACTION_PATH)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5)
    assert refused.value.code == 401
    client = imds.MetadataClient(metadata.base_url("i-2"))
    assert client.instance_action() is None  # 404: no notice
    metadata.post_notice("i-2", 1_800_000_000)
    assert client.instance_action() == {"action": "terminate", "time": "2027-01-15T08:00:00Z"}


def test_an_expired_token_is_fetched_again(metadata):
    client = imds.MetadataClient(metadata.base_url("i-3"))
    assert client.instance_action() is None
    client._token = "expired"  # the service no longer knows it: 401, then a new PUT
    assert client.instance_action() is None
    assert [m for m, p, _ in metadata.requests if p.endswith(imds.TOKEN_PATH)] == ["PUT", "PUT"]


def test_an_unreachable_endpoint_is_polled_again_until_it_answers():
    """A watcher pointed at nothing logs once and keeps polling; the notice comes when it can."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines, notices = [], []
    watcher = imds.SpotWatcher(f"http://127.0.0.1:{port}/i-4", lambda *n: notices.append(n), 0.02, lines.append)
    watcher.start()
    time.sleep(0.3)
    watcher.stop()
    assert notices == [] and len(lines) == 1 and "cannot read" in lines[0]


def test_seconds_until_reads_the_documents_time():
    assert imds.seconds_until("2027-01-15T08:00:00Z", now=1_800_000_000 - 120) == pytest.approx(120)
    assert imds.seconds_until("2027-01-15T08:00:00Z", now=1_800_000_000 + 5) == 0.0
    assert imds.seconds_until("not a time", now=0) == 0.0


def test_the_interruption_message_round_trips_and_only_an_agent_sends_it():
    message = Interruption(action="terminate", time="2027-01-15T08:00:00Z", in_s=118.5)
    assert decode(encode(message)) == message
    from workers.protocol import Hello, LocalProtocolError

    master = Connection("master")
    master.send(Hello(role="master"))
    with pytest.raises(LocalProtocolError):
        master.send(message)
