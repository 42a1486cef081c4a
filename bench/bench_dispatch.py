"""Dispatch throughput of no-op tasks through worker agents: tasks/s and per-task overhead.

    python3 bench/bench_dispatch.py                      # 1, 4 and 16 local agents, 4 slots each
    python3 bench/bench_dispatch.py --tasks 20000 --slots 8 --agents 1,2,4 --command true

Each row starts that many local agents (``connect_local_agent``: the same detached daemon an
SSH node runs, reached on its socket as ``broker run`` reaches a local node), keeps
``window`` Runs in flight per agent (twice its slots: a slot never waits for the master), acknowledges Results in batches, and times the
whole bag from the first submit to the last Result. Figures:

- tasks/s            completed no-op tasks per second of wall time;
- wall ms/task       1000 / tasks/s;
- slot-ms/task       total slots x wall time / tasks: what one task costs a slot beyond its
                     own runtime, the figure to weigh against a bag's task lengths;
- x spawn-only       throughput relative to a tight posix_spawn+wait loop of the same
                     command in one process (the fork/exec floor of this machine).

Hook for other transports (the SSH rows): :func:`run_dispatch` takes any list of
``Transport`` objects whose far ends are agents, e.g. ``SshSession.open_stream(...)``.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.shells.agent_client import AgentClient, NodeLost  # noqa: E402
from broker.shells.local_transport import connect_local_agent, stop_local_agent  # noqa: E402
from broker.shells.transport import Transport  # noqa: E402
from workers.protocol import Result, Run  # noqa: E402


@dataclass(frozen=True)
class DispatchFigures:
    agents: int
    slots: int  # over all agents
    tasks: int
    wall_s: float
    failed: int
    busy_s: float = 0.0  # the agents' own runtimes of the tasks, summed (spawn to reap)
    master_cpu_s: float = 0.0  # this process's CPU (every thread) from the first submit to the last Result
    attach_s: float = 0.0  # from the first agent's start to every agent's Hello (before wall_s's clock)

    @property
    def occupancy(self) -> float:
        """The fraction of slot time the agents spent running tasks; the rest a slot waited."""
        return self.busy_s / (self.slots * self.wall_s)

    @property
    def idle_ms_per_task(self) -> float:
        """Slot time per task not spent running it: what the trip to the master and back costs."""
        return 1000.0 * (self.slots * self.wall_s - self.busy_s) / self.tasks

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.wall_s

    @property
    def wall_ms_per_task(self) -> float:
        return 1000.0 * self.wall_s / self.tasks

    @property
    def slot_ms_per_task(self) -> float:
        return 1000.0 * self.slots * self.wall_s / self.tasks


def run_dispatch(transports: list[Transport], n_tasks: int, command: str = ":", window_per_slot: int = 2,
                 extra_cpu_ms: float = 0.0, attach_started: float | None = None) -> DispatchFigures:
    """Run ``n_tasks`` copies of ``command`` over the agents behind ``transports``; time it.
    ``extra_cpu_ms``: CPU the loop burns per Result on top of its own (bench_daemon.py's
    calibration: what a master that costs that much more per task loses)."""
    inbox: queue.Queue = queue.Queue()
    clients = {f"agent-{i}": AgentClient(t, f"agent-{i}", inbox=inbox) for i, t in enumerate(transports)}
    windows = {name: window_per_slot * c.hello.slots for name, c in clients.items()}
    total_slots = sum(c.hello.slots for c in clients.values())
    next_task = 0
    in_flight: dict[str, int] = defaultdict(int)

    def top_up(name: str) -> None:
        nonlocal next_task
        count = min(windows[name] - in_flight[name], n_tasks - next_task)
        if count > 0:
            clients[name].submit([Run(f"t{next_task + i}", 1, command) for i in range(count)])
            next_task += count
            in_flight[name] += count

    started, cpu0 = time.perf_counter(), time.process_time()
    for name in clients:
        top_up(name)
    done = failed = 0
    busy_s = 0.0
    while done < n_tasks:
        batch = [inbox.get()]
        while True:  # take everything that has arrived: one ack and one submit per agent
            try:
                batch.append(inbox.get_nowait())
            except queue.Empty:
                break
        finished: dict[str, list] = defaultdict(list)
        if extra_cpu_ms:
            _burn_cpu(extra_cpu_ms * len(batch) / 1000.0)
        for name, event in batch:
            if isinstance(event, Result):
                finished[name].append((event.task, event.attempt))
                failed += not event.ok
                busy_s += event.runtime_s
            elif isinstance(event, NodeLost):
                raise RuntimeError(f"{name} was lost during the benchmark: {event.reason}")
        for name, keys in finished.items():
            done += len(keys)
            in_flight[name] -= len(keys)
            clients[name].ack(keys)
            top_up(name)
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    for client in clients.values():
        client.shutdown(drain=True)
    for client in clients.values():
        client.wait_closed(10.0)
    attach_s = 0.0 if attach_started is None else started - attach_started
    return DispatchFigures(len(clients), total_slots, n_tasks, wall_s, failed, busy_s, cpu_s, attach_s)


def _burn_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


# A bench killed before its ``finally`` (a timeout, SIGKILL) leaves its detached agents behind;
# with a lease they stop by themselves once no master has spoken to them for this long.
ORPHAN_LEASE_S = 60.0


def local_dispatch(agents: int, slots: int, n_tasks: int, command: str, window_per_slot: int = 2,
                   extra_cpu_ms: float = 0.0) -> DispatchFigures:
    with tempfile.TemporaryDirectory(prefix="bk-bench-") as root:
        dirs = [Path(root) / f"a{i}" for i in range(agents)]
        try:
            attach_started = time.perf_counter()  # every agent starts at once; their Hellos are awaited in turn
            with ThreadPoolExecutor(len(dirs)) as pool:
                transports = list(pool.map(lambda d: connect_local_agent(d, slots, lease_s=ORPHAN_LEASE_S), dirs))
            return run_dispatch(transports, n_tasks, command, window_per_slot, extra_cpu_ms, attach_started)
        finally:
            for d in dirs:
                stop_local_agent(d)


def spawn_only_rate(command: str, n: int = 1000) -> float:
    """Tasks/s of a serial posix_spawn + wait loop: the machine's fork/exec floor."""
    env = dict(os.environ)
    started = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], env, setpgroup=0)
        os.waitpid(pid, 0)
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=4, help="slots per agent")
    parser.add_argument("--agents", default="1,4,16", help="comma-separated agent counts, one row each")
    parser.add_argument("--command", default=":")
    args = parser.parse_args()

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # keep info lines out
    spawn_rate = spawn_only_rate(args.command)
    print(f"python3 {' '.join(sys.argv)}")
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"spawn-only floor: {spawn_rate:,.0f} tasks/s ('/bin/sh -c {args.command}', posix_spawn + wait, serial)")
    print(f"{'agents':>6} {'slots':>6} {'tasks':>7} {'wall s':>7} {'tasks/s':>9} {'wall ms/task':>13} {'slot-ms/task':>13} {'x spawn-only':>13} {'failed':>6}")
    for agents in (int(a) for a in args.agents.split(",")):
        f = local_dispatch(agents, args.slots, args.tasks, args.command)
        print(
            f"{f.agents:>6} {f.slots:>6} {f.tasks:>7} {f.wall_s:>7.2f} {f.tasks_per_s:>9,.0f} "
            f"{f.wall_ms_per_task:>13.3f} {f.slot_ms_per_task:>13.3f} {f.tasks_per_s / spawn_rate:>13.2f} {f.failed:>6}"
        )


if __name__ == "__main__":
    main()
