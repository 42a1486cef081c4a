"""SSH streams as Transports: byte-exact round trips, closing, and a dropped connection."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.shells.ssh import SshSession, SshTarget, SshTransport, connect
from broker.shells.transport import Transport, TransportClosed
from tests.sshd import TestSshd, running_sshd
from tests.sshd_fixtures import require_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("structlog_defaults")]

# Reads stdin line by line and answers each line upper-cased, until end of file.
PYTHON_ECHO = (
    "python3 -u -c 'import sys\n"
    "for line in sys.stdin: sys.stdout.write(line.upper())'"
)


def session_for(server: TestSshd) -> SshSession:
    return connect(
        SshTarget(
            host=server.host,
            port=server.port,
            user=server.user,
            key_path=str(server.client_key_path),
            known_hosts_path=str(server.known_hosts_path),
            connect_timeout_s=5.0,
        )
    )


def read_exactly(stream: SshTransport, size: int, timeout_s: float = 10.0) -> bytes:
    received = bytearray()
    deadline = time.monotonic() + timeout_s
    while len(received) < size:
        chunk = stream.recv(65536, timeout_s=max(0.0, deadline - time.monotonic()))
        if chunk is None:
            raise AssertionError(f"timed out with {len(received)} of {size} bytes")
        if chunk == b"":
            raise AssertionError(f"end of stream after {len(received)} of {size} bytes")
        received += chunk
    return bytes(received)


def read_to_end(stream: SshTransport, timeout_s: float = 10.0) -> bytes:
    received = bytearray()
    deadline = time.monotonic() + timeout_s
    while (chunk := stream.recv(65536, timeout_s=max(0.0, deadline - time.monotonic()))) != b"":
        if chunk is None:
            raise AssertionError("stream did not end in time")
        received += chunk
    return bytes(received)


def wait_until(condition, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_stream_honours_the_transport_contract(sshd: TestSshd) -> None:
    with session_for(sshd) as session:
        stream = session.open_stream("cat")
        assert isinstance(stream, Transport)
        assert stream.recv(timeout_s=0.05) is None  # nothing yet: a timeout, not end of file
        stream.close()
        stream.close()  # idempotent
        assert stream.closed
        assert stream.recv(timeout_s=0.05) == b""
        with pytest.raises(TransportClosed):
            stream.send(b"x")


def test_close_from_another_thread_wakes_a_reader_waiting_forever(sshd: TestSshd) -> None:
    with session_for(sshd) as session:
        stream = session.open_stream("cat")
        got: list[bytes | None] = []
        reader = threading.Thread(target=lambda: got.append(stream.recv(timeout_s=None)))
        reader.start()
        time.sleep(0.05)
        stream.close()
        reader.join(timeout=2.0)
        assert not reader.is_alive() and got == [b""]


def test_cat_echoes_partial_lines_and_every_byte_value(sshd: TestSshd) -> None:
    with session_for(sshd) as session:
        stream = session.open_stream("cat")
        for piece in [b'{"type": "hel', b'lo", "v', b'ersion": 1}\n{"half"', b": true}\n", bytes(range(256))]:
            stream.send(piece)
            assert read_exactly(stream, len(piece)) == piece
        stream.close()


def test_a_megabytes_long_round_trip_with_concurrent_send_and_recv(sshd: TestSshd) -> None:
    payload = os.urandom(5 * 1024 * 1024)  # more than the SSH window, so flow control matters
    with session_for(sshd) as session:
        stream = session.open_stream("cat")
        sender = threading.Thread(target=lambda: [stream.send(payload[i : i + 100_000]) for i in range(0, len(payload), 100_000)])
        sender.start()
        echoed = read_exactly(stream, len(payload), timeout_s=60)
        sender.join()
        assert echoed == payload


def test_send_nowait_stops_at_a_full_window_instead_of_waiting_and_keeps_every_byte(
    sshd: TestSshd, tmp_path: Path
) -> None:
    """What the agent hub relies on: a command that stops reading fills its SSH window, and
    send_nowait then answers 0 at once; once it reads again, the rest goes through in order."""
    payload = os.urandom(8 * 1024 * 1024)  # more than the SSH window and the pipes behind it
    with session_for(sshd) as session:
        go = tmp_path / "go"
        tmp_path.chmod(0o777)
        # Reads nothing until the test says so, then echoes everything.
        stream = session.open_stream(f"while [ ! -e {go} ]; do sleep 0.02; done; cat")
        sent = 0
        outcome: list[str] = []

        def fill() -> None:  # never waits: the window closes before 8 MiB are taken
            nonlocal sent
            while sent < len(payload):
                n = stream.send_nowait(payload[sent : sent + 65536])
                if n == 0:
                    outcome.append("full")
                    return
                sent += n
            outcome.append("all taken")

        filler = threading.Thread(target=fill, daemon=True)
        filler.start()
        filler.join(30)
        assert outcome == ["full"], (outcome, sent)
        assert 0 < sent < len(payload)
        go.touch()
        echoed = bytearray()

        def drain() -> None:
            echoed.extend(read_exactly(stream, len(payload), timeout_s=60))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        while sent < len(payload):  # what a hub's retries do: write what is taken, when it is
            n = stream.send_nowait(payload[sent : sent + 65536])
            sent += n
            if n == 0:
                time.sleep(0.005)
        reader.join(60)
        assert bytes(echoed) == payload
        stream.close()


def test_a_python_echo_loop_answers_line_by_line_and_exits_on_close(sshd: TestSshd, tmp_path: Path) -> None:
    pid_file = tmp_path / "echo.pid"
    with session_for(sshd) as session:
        stream = session.open_stream(f"echo $$ > {pid_file}; exec {PYTHON_ECHO}")
        stream.send(b"first line\nsec")
        assert read_exactly(stream, len(b"FIRST LINE\n")) == b"FIRST LINE\n"
        stream.send(b"ond\n")
        assert read_exactly(stream, len(b"SECOND\n")) == b"SECOND\n"
        remote_pid = int(pid_file.read_text())
        assert Path(f"/proc/{remote_pid}").exists()
        stream.close()
        # The remote loop sees end of file and exits: nothing is left running on the node.
        assert wait_until(lambda: not _alive(remote_pid)), "remote echo loop outlived its stream"


def test_remote_exit_is_end_of_file_and_stderr_is_kept_apart(sshd: TestSshd) -> None:
    # 3 MB of stderr would stall stdout if nobody drained it (the channel window is 2 MB).
    command = "python3 -c 'import sys; sys.stderr.write(\"e\" * 3000000); sys.stderr.flush(); print(\"done\")'; exit 7"
    with session_for(sshd) as session:
        stream = session.open_stream(command)
        assert read_to_end(stream, timeout_s=20) == b"done\n"
        assert wait_until(lambda: stream.exit_status is not None)
        assert stream.exit_status == 7
        assert stream.stderr_tail() == b"e" * len(stream.stderr_tail())
        assert 64 * 1024 <= len(stream.stderr_tail()) < 64 * 1024 + 65536
        stream.close()


def test_a_dropped_connection_ends_streams_promptly(sshd: TestSshd) -> None:
    session = session_for(sshd)
    streams = [session.open_stream("cat") for _ in range(3)]
    streams[0].send(b"before the drop\n")
    assert read_exactly(streams[0], 16) == b"before the drop\n"
    reader_result: list[bytes | None] = []
    blocked_reader = threading.Thread(target=lambda: reader_result.append(streams[1].recv(timeout_s=None)))
    blocked_reader.start()

    dropped_at = time.monotonic()
    assert sshd.drop_connections() >= 1
    assert streams[0].recv(timeout_s=5.0) == b""
    blocked_reader.join(timeout=5.0)
    assert reader_result == [b""]  # a reader waiting forever is woken by the drop
    assert wait_until(lambda: all(s.closed for s in streams), timeout_s=5.0)
    with pytest.raises(TransportClosed):
        streams[2].send(b"after the drop\n")
    assert time.monotonic() - dropped_at < 5.0
    assert not session.alive
    session.close()

    # The daemon is still listening: the master can reconnect.
    with session_for(sshd) as again:
        stream = again.open_stream("cat")
        stream.send(b"back\n")
        assert read_exactly(stream, 5) == b"back\n"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --------------------------------------------------------------------------- property


@pytest.fixture(scope="module")
def cat_stream(tmp_path_factory: pytest.TempPathFactory, structlog_defaults: None):  # type: ignore[no-untyped-def]
    """One ``cat`` stream shared by every example: chunking, not start-up, is under test."""
    require_sshd()
    with running_sshd(tmp_path_factory.mktemp("sshd-shared")) as server, session_for(server) as session:
        stream = session.open_stream("cat")
        yield stream
        stream.close()


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=12))
def test_any_chunking_comes_back_byte_identical(cat_stream: SshTransport, chunks: list[bytes]) -> None:
    for chunk in chunks:
        cat_stream.send(chunk)
    expected = b"".join(chunks)
    assert read_exactly(cat_stream, len(expected)) == expected
    assert cat_stream.recv(timeout_s=0.005) is None  # and nothing more
