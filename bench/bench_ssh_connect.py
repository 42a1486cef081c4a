"""What an SSH connection costs, with and without TCP_NODELAY, against a real sshd on loopback.

    python3 bench/bench_ssh_connect.py [--repeat 30]

Per setting, medians over ``--repeat`` fresh connections of: connect+auth (Ed25519 user
key, host key verified), ``open_stream`` returning (channel open plus the server's reply
to the exec request) for the connection's first and second stream, the second ``cat``'s
first echo (command start-up), one set-up command (``run("true")``), and one echo round trip on an open stream (the per-message
latency the agent protocol pays). Prints the ratio off/on. No asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import structlog  # noqa: E402

from broker.shells.ssh import SshSession, SshTarget, SshTransport, connect  # noqa: E402
from tests.sshd import running_sshd  # noqa: E402


def echo(stream: SshTransport, payload: bytes) -> None:
    stream.send(payload)
    received = b""
    while len(received) < len(payload):
        chunk = stream.recv(65536, timeout_s=10.0)
        if not chunk:
            raise RuntimeError("echo stream ended")
        received += chunk


def measure(target: SshTarget, tcp_nodelay: bool, repeat: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {
        "connect+auth": [],
        "open_stream, 1st": [],
        "open_stream, 2nd": [],
        "first echo (cmd start)": [],
        "run('true')": [],
        "echo round trip": [],
    }
    for _ in range(repeat):
        t0 = time.perf_counter()
        session: SshSession = connect(target, tcp_nodelay=tcp_nodelay)
        t1 = time.perf_counter()
        first = session.open_stream("cat")
        t_first = time.perf_counter()
        stream = session.open_stream("cat")
        t_open = time.perf_counter()
        echo(stream, b"x\n")
        t2 = time.perf_counter()
        session.run("true", timeout_s=30)
        t3 = time.perf_counter()
        round_trips = []
        for _ in range(20):
            start = time.perf_counter()
            echo(stream, b'{"type": "ping", "seq": 1}\n')
            round_trips.append(time.perf_counter() - start)
        first.close()
        stream.close()
        session.close()
        samples["connect+auth"].append(t1 - t0)
        samples["open_stream, 1st"].append(t_first - t1)
        samples["open_stream, 2nd"].append(t_open - t_first)
        samples["first echo (cmd start)"].append(t2 - t_open)
        samples["run('true')"].append(t3 - t2)
        samples["echo round trip"].append(statistics.median(round_trips))
    return {name: statistics.median(values) * 1000.0 for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only

    with tempfile.TemporaryDirectory() as directory, running_sshd(Path(directory)) as server:
        target = SshTarget(
            host=server.host,
            port=server.port,
            user=server.user,
            key_path=str(server.client_key_path),
            known_hosts_path=str(server.known_hosts_path),
        )
        measure(target, True, 2)  # warm caches (sshd binary, python imports)
        on = measure(target, True, args.repeat)
        off = measure(target, False, args.repeat)

    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"# python3 bench/bench_ssh_connect.py --repeat {args.repeat}   (medians, ms)")
    print(f"{'step':<24} {'TCP_NODELAY':>12} {'Nagle':>10} {'Nagle/NODELAY':>14}")
    for name in on:
        print(f"{name:<24} {on[name]:>12.2f} {off[name]:>10.2f} {off[name] / on[name]:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
