"""LocalTransport against plain processes: the Transport contract, and the pid-file safety."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from broker.shells.local_transport import LocalTransport, local_agent_pid, stop_local_agent
from broker.shells.transport import Transport, TransportClosed


def read_exactly(transport: LocalTransport, size: int, timeout_s: float = 5.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout_s
    while len(data) < size and time.monotonic() < deadline:
        chunk = transport.recv(timeout_s=0.1)
        if chunk:
            data += chunk
    return data


def test_it_is_a_transport():
    transport = LocalTransport.spawn(["cat"])
    assert isinstance(transport, Transport)
    transport.close()


def test_round_trip_of_large_data_through_cat():
    transport = LocalTransport.spawn(["cat"])
    payload = os.urandom(1 << 20)
    writer = threading.Thread(target=transport.send, args=(payload,))
    writer.start()  # cat echoes while we write: both directions must move at once
    assert read_exactly(transport, len(payload)) == payload
    writer.join()
    transport.close()
    assert transport.closed


def test_send_nowait_stops_at_a_full_pipe_and_send_still_waits_for_room(tmp_path):
    """stdin is non-blocking now (for the agent hub): send_nowait answers 0 at a full pipe,
    and the blocking send the handshake uses still delivers every byte, in order."""
    go = tmp_path / "go"
    transport = LocalTransport.spawn(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exec cat"])
    payload = os.urandom(4 << 20)  # far more than a pipe holds
    sent = 0
    while sent < len(payload):
        n = transport.send_nowait(payload[sent : sent + 65536])
        if n == 0:
            break
        sent += n
    assert 0 < sent < len(payload)  # the pipe is full and nobody reads: 0, at once
    go.touch()
    rest = threading.Thread(target=transport.send, args=(payload[sent:],))
    rest.start()  # waits for room as cat drains
    assert read_exactly(transport, len(payload), timeout_s=30) == payload
    rest.join(10)
    assert not rest.is_alive()
    transport.close()
    with pytest.raises(TransportClosed):
        transport.send_nowait(b"x")


def test_recv_times_out_with_none_and_ends_with_empty_bytes():
    transport = LocalTransport.spawn(["/bin/sh", "-c", "read line; printf 'bye'"])
    started = time.monotonic()
    assert transport.recv(timeout_s=0.2) is None
    assert time.monotonic() - started >= 0.2
    transport.send(b"go\n")
    assert read_exactly(transport, 3) == b"bye"
    assert transport.recv(timeout_s=2.0) == b""
    assert transport.recv(timeout_s=2.0) == b""
    transport.close()


def test_send_to_a_dead_process_raises_transport_closed():
    transport = LocalTransport.spawn([sys.executable, "-c", "pass"])
    transport.process.wait(5)
    with pytest.raises(TransportClosed):
        for _ in range(100):  # the first writes may land in the pipe buffer
            transport.send(b"x" * 65536)
    transport.close()


def test_close_wakes_a_blocked_reader_and_is_idempotent():
    transport = LocalTransport.spawn(["sleep", "30"])
    got: list = []
    reader = threading.Thread(target=lambda: got.append(transport.recv(timeout_s=None)))
    reader.start()
    time.sleep(0.1)
    started = time.monotonic()
    transport.kill()
    reader.join(30)
    assert got == [b""] and time.monotonic() - started < 20  # woken by the kill, not by `sleep 30` ending
    transport.close()
    with pytest.raises(TransportClosed):
        transport.send(b"x")


def test_close_reaps_a_process_that_ignores_its_stdin():
    transport = LocalTransport.spawn(["sleep", "30"])
    transport.close()  # waits its grace, then kills
    assert transport.process.returncode is not None


def test_a_stale_pid_file_without_the_lock_points_nowhere(tmp_path):
    (tmp_path / "agent.lock").touch()
    victim = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "agent.pid").write_text(f"{victim.pid}\n")
        assert local_agent_pid(tmp_path) is None
        assert stop_local_agent(tmp_path) is False
        assert victim.poll() is None  # an unrelated process that reused the pid is left alone
    finally:
        victim.kill()
        victim.wait()
    assert local_agent_pid(tmp_path / "missing") is None
