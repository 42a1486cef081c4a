"""The sans-I/O protocol: two state machines wired together in memory, exact bytes and events."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    Connection,
    ConnectionClosed,
    Hello,
    LocalProtocolError,
    Ping,
    Pong,
    Progress,
    RemoteProtocolError,
    Result,
    Run,
    Shutdown,
    Started,
    decode,
    encode,
)


def drain(conn: Connection) -> list:
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return events


def greeted_pair() -> tuple[Connection, Connection]:
    master, agent = Connection("master"), Connection("agent")
    agent.receive_data(master.send(Hello(role="master", node="n1")))
    master.receive_data(agent.send(Hello(role="agent", node="n1", slots=4)))
    assert [type(e) for e in drain(agent)] == [Hello]
    assert [type(e) for e in drain(master)] == [Hello]
    return master, agent


def test_hello_and_run_exact_bytes():
    master = Connection("master")
    assert master.send(Hello(role="master", node="lab-a")) == (
        b'{"type":"hello","role":"master","protocol":1,"node":"lab-a","slots":0,'
        b'"agent_version":"","running":[],"pending_results":0}\n'
    )
    assert master.send(Run("t-7", 2, "echo hi", timeout_s=30, env={"X": "1"}, cwd="/tmp")) == (
        b'{"type":"run","task":"t-7","attempt":2,"command":"echo hi","timeout_s":30,'
        b'"env":{"X":"1"},"cwd":"/tmp"}\n'
    )


def test_conversation_events_arrive_in_order_with_their_fields():
    master, agent = greeted_pair()
    runs = [Run(f"t{i}", 1, "true") for i in range(3)]
    agent.receive_data(master.send_all(runs))  # batched: three lines in one write
    assert drain(agent) == runs
    replies = [
        Started("t0", 1, 4242),
        Progress("t0", 1, 0.25, 1.5),
        Result("t0", 1, 0, 2.0, stdout_tail="é\n", stdout_path="/s/out/t0.1.stdout"),
        Pong(7),
    ]
    master.receive_data(agent.send_all(replies))
    assert drain(master) == replies
    agent.receive_data(master.send(Ack("t0", 1)) + master.send(Cancel("t1", 1)) + master.send(Ping(8)))
    assert drain(agent) == [Ack("t0", 1), Cancel("t1", 1), Ping(8)]


@pytest.mark.parametrize("chunk", [1, 2, 7, 1000])
def test_input_cut_anywhere_gives_the_same_events(chunk):
    sender = Connection("agent")
    messages = [
        Hello(role="agent", slots=2, running=(("a", 1), ("b", 3)), pending_results=1),
        Result("a", 0, -9, 0.5, timed_out=True, stderr_tail="killed\n", error=None),
        Started("b", 3, 99),
    ]
    wire = sender.send_all(messages)
    receiver = Connection("master")
    seen = []
    for start in range(0, len(wire), chunk):
        receiver.receive_data(wire[start : start + chunk])
        seen += drain(receiver)
    assert seen == messages
    receiver.receive_data(b"")
    assert receiver.next_event() == ConnectionClosed()


def test_line_cut_mid_message_needs_data_then_completes():
    line = encode(Hello(role="master"))
    agent = Connection("agent")
    agent.receive_data(line[:10])
    assert agent.next_event() is NEED_DATA
    agent.receive_data(line[10:])
    assert agent.next_event() == Hello(role="master")


def test_end_of_stream_inside_a_message_is_the_peers_error():
    agent = Connection("agent")
    agent.receive_data(encode(Hello(role="master"))[:-5])
    agent.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="ended inside"):
        agent.next_event()


@pytest.mark.parametrize(
    "line, match",
    [
        (b"{not json\n", "not a JSON line"),
        (b"\xff\xfe\n", "not a JSON line"),
        (b"[1, 2]\n", "JSON object"),
        (b'{"type": "launch_missiles"}\n', "unknown message type"),
        (b'{"role": "master"}\n', "unknown message type"),
        (b'{"type": "hello"}\n', "lacks the field 'role'"),
        (b'{"type": "hello", "role": "master", "protocol": "1"}\n', "hello.protocol must be an integer"),
        (b'{"type": "hello", "role": "master", "slots": true}\n', "hello.slots must be an integer"),
        (b'{"type": "hello", "role": "master", "running": [["a"]]}\n', "pairs"),
        (b"\n", "not a JSON line"),
    ],
)
def test_malformed_lines_are_remote_errors(line, match):
    agent = Connection("agent")
    agent.receive_data(line)
    with pytest.raises(RemoteProtocolError, match=match):
        agent.next_event()
    with pytest.raises(RemoteProtocolError):  # the connection stays broken
        agent.next_event()


def test_nan_and_wrong_field_types_are_refused():
    master, agent = greeted_pair()
    agent.receive_data(b'{"type":"run","task":"t","attempt":1,"command":"x","timeout_s":NaN}\n')
    with pytest.raises(RemoteProtocolError, match="timeout_s"):
        agent.next_event()
    master.receive_data(b'{"type":"result","task":"t","attempt":1,"exit_code":0,"runtime_s":"1"}\n')
    with pytest.raises(RemoteProtocolError, match="runtime_s must be a finite number"):
        master.next_event()


def test_message_before_hello_is_a_remote_error():
    agent = Connection("agent")
    agent.receive_data(encode(Run("t", 1, "true")))
    with pytest.raises(RemoteProtocolError, match="master sent run before its Hello"):
        agent.next_event()


def test_a_master_that_skips_started_never_decodes_it_once_the_agent_said_hello():
    """The daemon's loop has no use for Started (one a task): its lines are dropped undecoded
    (a sixth of the agent hub's CPU a no-op task). Only after the agent's Hello, and only
    lines that open as encode() opens a Started; everything else is decoded and checked."""
    master, agent = Connection("master", skip=("started",)), Connection("agent")
    early = encode(Started("t0", 1, 7))
    master.receive_data(early)
    with pytest.raises(RemoteProtocolError, match="agent sent started before its Hello"):
        master.next_event()
    master, agent = Connection("master", skip=("started",)), Connection("agent")
    agent.receive_data(master.send(Hello(role="master", node="n1")))
    drain(agent)
    stream = agent.send(Hello(role="agent", node="n1", slots=4))
    for i in range(3):
        stream += agent.send(Started(f"t{i}", 1, 100 + i)) + agent.send(Result(f"t{i}", 1, 0, 0.01))
    stream += b'{"type":"started","task":1}\n'  # malformed, but of a skipped type: dropped
    stream += b'{"task":"t9","type":"started","attempt":1,"pid":1}\n'  # not how encode() opens one: decoded
    master.receive_data(stream)
    events = drain(master)
    assert [type(e) for e in events] == [Hello, Result, Result, Result, Started]
    assert [e.task for e in events[1:]] == ["t0", "t1", "t2", "t9"]
    master.receive_data(b'{"type":"result","task":"t3"}\n')  # a type not skipped is still checked
    with pytest.raises(RemoteProtocolError, match="lacks the field"):
        master.next_event()


def test_sending_before_our_hello_is_a_local_error():
    with pytest.raises(LocalProtocolError, match="before its Hello"):
        Connection("master").send(Run("t", 1, "true"))


def test_master_may_pipeline_runs_before_the_agents_hello():
    master = Connection("master")
    master.send(Hello(role="master"))
    assert master.send(Run("t", 1, "true")).startswith(b'{"type":"run"')


def test_version_mismatch_names_both_versions():
    agent = Connection("agent")
    agent.receive_data(encode(Hello(role="master", protocol=PROTOCOL_VERSION + 1)))
    with pytest.raises(RemoteProtocolError, match=f"speaks protocol {PROTOCOL_VERSION + 1}.*speaks {PROTOCOL_VERSION}"):
        agent.next_event()
    with pytest.raises(LocalProtocolError, match="speaks protocol"):
        Connection("master").send(Hello(role="master", protocol=PROTOCOL_VERSION + 1))


def test_roles_are_checked_both_ways():
    with pytest.raises(LocalProtocolError, match="role='master'"):
        Connection("master").send(Hello(role="agent"))
    agent = Connection("agent")
    agent.receive_data(encode(Hello(role="agent")))
    with pytest.raises(RemoteProtocolError, match="expected a 'master'"):
        agent.next_event()


def test_messages_flow_only_in_their_direction():
    master, agent = greeted_pair()
    with pytest.raises(LocalProtocolError, match="master may not send result"):
        master.send(Result("t", 1, 0, 1.0))
    with pytest.raises(LocalProtocolError, match="agent may not send run"):
        agent.send(Run("t", 1, "true"))
    agent.receive_data(encode(Pong(1)))
    with pytest.raises(RemoteProtocolError, match="master may not send pong"):
        agent.next_event()


def test_no_run_after_shutdown_but_acks_still_flow():
    master, agent = greeted_pair()
    agent.receive_data(master.send(Shutdown(drain=True)))
    assert drain(agent) == [Shutdown(drain=True)]
    with pytest.raises(LocalProtocolError, match="may not send run while draining"):
        master.send(Run("t", 1, "true"))
    agent.receive_data(master.send(Ack("t", 1)))
    assert drain(agent) == [Ack("t", 1)]
    agent.receive_data(encode(Run("t", 2, "true")))
    with pytest.raises(RemoteProtocolError, match="may not send run while draining"):
        agent.next_event()


def test_send_all_is_all_or_nothing():
    master = Connection("master")
    with pytest.raises(LocalProtocolError):
        master.send_all([Hello(role="master"), Run("t", 1, "x"), Result("t", 1, 0, 1.0)])
    assert master.send(Hello(role="master"))  # the failed batch left the state IDLE


def test_line_length_cap_both_ways():
    agent = Connection("agent", max_line_bytes=64)
    agent.receive_data(b"x" * 65)
    with pytest.raises(RemoteProtocolError, match="64-byte limit"):
        agent.next_event()
    small = Connection("master", max_line_bytes=200)
    small.send(Hello(role="master"))
    with pytest.raises(LocalProtocolError, match="line limit"):
        small.send(Run("t", 1, "x" * 300))


def test_unknown_fields_are_ignored_for_forward_compatibility():
    master, _ = greeted_pair()
    master.receive_data(b'{"type":"pong","seq":3,"future_field":[1,2]}\n')
    assert master.next_event() == Pong(3)


def test_receiving_after_the_end_of_stream_is_a_local_error():
    conn = Connection("agent")
    conn.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"{}")


_texts = st.text(max_size=30)
_keys = st.tuples(_texts, st.integers(0, 10**6))
_finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
_agent_messages = st.one_of(
    st.builds(Started, _texts, st.integers(0, 99), st.integers(1, 2**22)),
    st.builds(Progress, _texts, st.integers(0, 99), _finite, _finite),
    st.builds(
        Result,
        _texts,
        st.integers(0, 99),
        st.none() | st.integers(-64, 255),
        _finite,
        st.booleans(),
        st.booleans(),
        _texts,
        _texts,
        st.none() | _texts,
        st.none() | _texts,
        st.none() | _texts,
    ),
    st.builds(Pong, st.integers(0, 2**40)),
)


@given(
    hello=st.builds(
        Hello,
        role=st.just("agent"),
        node=_texts,
        slots=st.integers(0, 512),
        running=st.lists(_keys, max_size=5).map(tuple),
        pending_results=st.integers(0, 100),
    ),
    messages=st.lists(_agent_messages, max_size=8),
    cuts=st.lists(st.integers(0, 4000), max_size=6),
)
def test_any_message_sequence_survives_any_cutting(hello, messages, cuts):
    sender, receiver = Connection("agent"), Connection("master")
    wire = sender.send_all([hello, *messages])
    assert all(json.loads(line)["type"] for line in wire.splitlines())
    seen = []
    start = 0
    for cut in sorted(c % (len(wire) + 1) for c in cuts) + [len(wire)]:
        if cut > start:
            receiver.receive_data(wire[start:cut])
            start = cut
        seen += drain(receiver)
    assert seen == [hello, *messages]


def test_decode_is_the_inverse_of_encode_for_every_message_type():
    samples = [
        Hello(role="agent", node="n", slots=3, agent_version="1", running=(("a", 1),), pending_results=2),
        Run("t", 1, "sleep 1", 2.5, {"A": "B"}, "/w"),
        Started("t", 1, 5),
        Progress("t", 1, 0.5, 3.0),
        Result("t", 1, None, 0.0, False, True, "", "", None, None, "cwd missing"),
        Ack("t", 1),
        Cancel("t", 1),
        Ping(1),
        Pong(1),
        Shutdown(drain=False),
    ]
    for message in samples:
        assert decode(encode(message)) == message


# -- regression: a malformed line of any kind is this module's own error ------------------
NESTED = b'{"type":"ack","task":' + b"[" * 100_000 + b"]" * 100_000 + b',"attempt":1}\n'


@pytest.mark.parametrize("line", [
    NESTED,  # json.loads raises RecursionError (not a ValueError) on this
    b"[" * 100_000 + b"\n",
    b'{"type":"ack","task":"\xff\xfe","attempt":1}\n',  # not UTF-8
    b'{"type":"ack","task":"t","attempt":1e999}\n',  # not a finite number
], ids=["nested-in-a-field", "nested-array", "not-utf8", "infinite"])
def test_a_recursion_error_line_is_a_remote_protocol_error_on_both_ends(line):
    for role in ("master", "agent"):
        conn = Connection(role)
        conn.receive_data(line)
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
    with pytest.raises(RemoteProtocolError):
        decode(line)
