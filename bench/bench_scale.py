"""One master for many agents (issue 20): the daemon against fake agents that answer at once.

    python3 bench/bench_scale.py                         # 10, 100, 1,000 fake agents; 16 local agents
    python3 bench/bench_scale.py --agents 10,100 --tasks 5000 --no-local

The fake agents (:mod:`broker.shells.fake_agents`) are the agent's side of the real
protocol, in this process, over ``socket.socketpair()``, all served by one thread of their
own: a Run is answered at once by a successful Result, so what is measured is the master.
Each row runs the full daemon (:class:`broker.shells.run.Daemon`: ledger, controller,
journal in SQLite, events.jsonl and structlog as ``broker run`` configures them) on a
private-only inventory of that many nodes of 4 slots, and prints:

- timed              the tasks done in the timed span below (the row's bag is ``--tasks``, all done:
                     checked; those done while the last agents were still attaching are not timed);
- attach s           from the first attach to the last agent's handshake (bounded concurrency, 8);
- tasks/s            tasks done per second of wall time, from the moment every agent is attached
                     (the nodes attach in the background) to the last result;
- master CPU ms/task CPU of every thread but the fake agents' (process CPU minus that
                     thread's own clock), over the same span, per task;
- decide CPU ms      the decision of a turn (the ledger's snapshot and the controller's decide), in
                     the loop thread's CPU time (``time.thread_time``: on a loaded machine wall time
                     counts other processes' turns too): median and 95th percentile, over the turns
                     after every agent attached;
- starts/turn        the attempts a decision hands out (median): a decision costs in proportion to
                     them (each is a pick), and a turn with many results hands out many;
- turn CPU ms        one whole loop turn (drain the inbox, agent messages into the ledger and one
                     journal batch, acks, decide, and carrying out its starts: journal rows, events,
                     submits to the agents), loop thread CPU: median, with the messages it drained;
- threads            threads alive in the process while the row runs (its agents attached).

Then the journal's commits per second (one batch per commit: a start, a result and an
event), and the full daemon against the bare agent path with 16 real local agents
(``bench/bench_dispatch.py``'s ``run_dispatch`` and its spawn-only floor), and last the
simulator's cases (``bench/bench_sim.py --scale``: 100,000 and 1,000,000 tasks on 1,000
machines, each in a process of its own; ``--no-sim`` skips them). The issue's goals are
printed next to the figures (PASS/MISS); a MISS exits 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.goal import Goal  # noqa: E402
from broker.core.model import Bag, Inventory, PrivateNode, Task  # noqa: E402
from broker.shells.agent_client import AgentClient  # noqa: E402
from broker.shells.clock import RunClock  # noqa: E402
from broker.shells.fake_agents import FakeAgents, FakeNodes  # noqa: E402
from broker.shells.journal import AttemptResult, Journal  # noqa: E402
from broker.shells.run import Daemon, DaemonOptions  # noqa: E402

SLOTS = 4


@dataclass
class Row:
    agents: int
    tasks: int
    done: int
    attach_s: float
    wall_s: float
    master_cpu_s: float
    decide_ms: list[float]  # loop-thread CPU of snapshot + decide, turns after all attached
    turn_ms: list[float]  # loop-thread CPU of whole turns, the same turns
    threads: int
    starts: list[int]  # attempts handed out by each of those decisions
    messages: list[int]  # messages drained by each of those turns
    decide_wall_ms: list[float]

    @property
    def tasks_per_s(self) -> float:
        return self.done / self.wall_s

    @property
    def cpu_ms_per_task(self) -> float:
        return 1000.0 * self.master_cpu_s / max(1, self.done)


def _inventory(agents: int, local: bool) -> Inventory:
    return Inventory(private=tuple(PrivateNode(f"n{i:04d}", SLOTS, local=local, host=None if local else "fake")
                                   for i in range(agents)))


def _bag(tasks: int) -> Bag:
    return Bag(tasks=tuple(Task(f"t{i:07d}", ":") for i in range(tasks)), timeout_s=3600.0, retries=2)


class _Probe:
    """Times the daemon's turns and decisions (loop-thread CPU; the decision's wall time too),
    and the span from the moment its last node is ready (every agent attached: the nodes
    attach in the background, so tasks start before) to its last result, with the tasks done
    in that span (``measured``). Turns and decisions are kept from that moment on."""

    def __init__(self, daemon: Daemon, cpu_other, total: int, nodes: int) -> None:  # noqa: ANN001
        self.decide_ms: list[float] = []
        self.decide_wall_ms: list[float] = []
        self.turn_ms: list[float] = []
        self.starts: list[int] = []
        self.messages: list[int] = []
        self.first: tuple[float, float] | None = None  # (perf_counter, master cpu)
        self.last: tuple[float, float] = (0.0, 0.0)
        self.done = self.done_before = self.ready = 0
        self.threads = 0
        decide, turn, ready, result = daemon._decide, daemon._turn, daemon._mark_ready, daemon._on_result
        new_ledger, controller_decide, drain = daemon._new_ledger, daemon.controller.decide, daemon._drain
        spent = [0.0, 0.0, 0]  # CPU ms, wall ms in the snapshot and the controller during this _decide; starts
        drained = [0]

        def timed(fn):  # noqa: ANN001, ANN202
            def call(*a, **k):  # noqa: ANN002, ANN003, ANN202
                c, t = time.thread_time(), time.perf_counter()
                out = None
                try:
                    out = fn(*a, **k)
                    return out
                finally:
                    spent[0] += 1000 * (time.thread_time() - c)
                    spent[1] += 1000 * (time.perf_counter() - t)
                    spent[2] += sum(type(x).__name__ in ("Assign", "Replicate") for x in getattr(out, "actions", ()))
            return call

        def counted_drain():  # noqa: ANN202
            messages = drain()
            drained[0] = len(messages)
            return messages

        def wrapped_new_ledger(ledger):  # noqa: ANN001, ANN202
            new_ledger(ledger)
            daemon.ledger.snapshot = timed(daemon.ledger.snapshot)

        daemon._new_ledger, daemon.controller.decide, daemon._drain = (
            wrapped_new_ledger, timed(controller_decide), counted_drain)

        def cpu() -> float:
            return time.process_time() - cpu_other()

        def timed_decide(*a, **k):  # noqa: ANN002, ANN003, ANN202
            spent[:] = [0.0, 0.0, 0]
            decide(*a, **k)
            if self.first is not None:
                self.decide_ms.append(spent[0])
                self.decide_wall_ms.append(spent[1])
                self.starts.append(spent[2])

        def timed_turn() -> None:
            c = time.thread_time()
            drained[0] = 0
            turn()
            if self.first is not None and drained[0]:
                self.turn_ms.append(1000 * (time.thread_time() - c))
                self.messages.append(drained[0])
            self.threads = max(self.threads, threading.active_count())

        def all_ready(node_id):  # noqa: ANN001, ANN202
            ready(node_id)
            self.ready += 1
            if self.ready == nodes:
                self.first, self.done_before = (time.perf_counter(), cpu()), self.done

        def on_result(node, r):  # noqa: ANN001, ANN202
            changed = result(node, r)
            self.done += 1
            if self.done == total:  # the clocks read twice a row: process_time is no free call
                self.last = (time.perf_counter(), cpu())
            return changed

        daemon._decide, daemon._turn, daemon._mark_ready, daemon._on_result = (
            timed_decide, timed_turn, all_ready, on_result)

    @property
    def measured(self) -> int:
        return self.done - self.done_before


def run_daemon(inventory: Inventory, bag: Bag, nodes_for, cpu_other=lambda: 0.0) -> tuple[Daemon, _Probe]:  # noqa: ANN001
    """The full daemon over ``nodes_for(inbox, run_dir)``, logging as ``broker run`` does."""
    from broker.shells.logging import configure_logging

    with tempfile.TemporaryDirectory(prefix="bk-scale-") as root:
        run_dir = Path(root) / "run"
        run_dir.mkdir()
        inbox: queue.Queue = queue.Queue()
        clock = RunClock(1.0)
        with open(os.devnull, "w") as console, open(run_dir / "events.jsonl", "a", encoding="utf-8") as events:
            configure_logging(level="info", stream=console, extra_files=[events], bind={"run_id": "scale"})
            try:
                with Journal.open(run_dir, clock=clock.now_s, anchor_s=clock.epoch_anchor_s) as journal:
                    journal.create_run("scale", goal_kind="theta", goal_value=1.0, retries=bag.retries, tasks=bag.tasks)
                    daemon = Daemon(inventory, bag, Goal(), DaemonOptions(run_dir=run_dir, run_id="scale", tick_s=60.0),
                                    journal=journal, clock=clock, fleet=None, nodes=nodes_for(inbox, run_dir),
                                    inbox=inbox, config=ControllerConfig(tick_s=60.0, margin_s=120.0))
                    probe = _Probe(daemon, cpu_other, len(bag.tasks), len(inventory.private))
                    report = daemon.run()
            finally:
                configure_logging(level="warning", stream=sys.stderr)
        if report.tasks_done != len(bag.tasks):
            raise RuntimeError(f"the daemon did {report.tasks_done} of {len(bag.tasks)} tasks")
        return daemon, probe


def fake_row(agents: int, tasks: int, reader_threads: bool = False) -> Row:
    """One row; ``reader_threads``: every client reads its agent on a thread of its own, as
    before the hub (the transports are kept from the hub), for comparison."""
    from broker.shells.agent_hub import AgentHub

    can_watch = AgentHub.can_watch
    if reader_threads:
        AgentHub.can_watch = staticmethod(lambda transport: False)
    try:
        return _fake_row(agents, tasks)
    finally:
        AgentHub.can_watch = can_watch


def _fake_row(agents: int, tasks: int) -> Row:
    with FakeAgents() as fakes:
        clock_id = time.pthread_getcpuclockid(fakes._thread.ident)

        def fake_cpu() -> float:
            return time.clock_gettime(clock_id)

        holder: dict = {}

        def nodes_for(inbox: queue.Queue, _run_dir: Path) -> FakeNodes:
            holder["nodes"] = FakeNodes(fakes, inbox, SLOTS)
            return holder["nodes"]

        _, probe = run_daemon(_inventory(agents, local=False), _bag(tasks), nodes_for, fake_cpu)
        nodes: FakeNodes = holder["nodes"]
        nodes.pool.shutdown()
        (t0, c0), (t1, c1) = probe.first, probe.last
        return Row(agents, tasks, probe.measured, nodes.last_at - (nodes.first_at or nodes.last_at), t1 - t0, c1 - c0,
                   probe.decide_ms, probe.turn_ms, probe.threads, probe.starts, probe.messages, probe.decide_wall_ms)


def local_daemon_rate(agents: int, tasks: int) -> float:
    """Tasks/s of the full daemon over ``agents`` real local agents (no-op ``:`` tasks)."""
    from broker.shells.nodes import LocalAgents
    from broker.shells.run import RunNodes

    inventory = _inventory(agents, local=True)

    def nodes_for(inbox: queue.Queue, run_dir: Path) -> RunNodes:
        return RunNodes(inventory, local=LocalAgents(run_dir, inbox))

    _, probe = run_daemon(inventory, _bag(tasks), nodes_for)
    return probe.measured / (probe.last[0] - probe.first[0])


def local_attach_s(agents: int) -> tuple[float, float]:
    """Seconds to attach ``agents`` local agents one after another (as the loop did) and in
    the background (``LocalAgents.attach_in_background``, at most 8 at once)."""
    from broker.shells.nodes import LocalAgents

    figures = []
    with tempfile.TemporaryDirectory(prefix="bk-attach-") as root:
        for mode in ("serial", "background"):
            local = LocalAgents(Path(root) / mode, queue.Queue())
            names = [f"a{i}" for i in range(agents)]
            started = time.perf_counter()
            if mode == "serial":
                clients = [local.attach(n, SLOTS) for n in names]
            else:
                got: queue.Queue = queue.Queue()
                for n in names:
                    local.attach_in_background(n, SLOTS, lambda c, e: got.put((c, e)))
                clients = [got.get(timeout=120) for _ in names]
                if any(e is not None for _, e in clients):
                    raise RuntimeError(f"an attach failed: {[e for _, e in clients if e is not None][0]}")
                clients = [c for c, _ in clients]
                names = [c.node for c in clients]  # in the order they answered
            figures.append(time.perf_counter() - started)
            for n, c in zip(names, clients):
                local.stop(n, c)
    return figures[0], figures[1]


def journal_commits_per_s(n: int = 2000) -> float:
    with tempfile.TemporaryDirectory(prefix="bk-journal-") as root:
        bag = _bag(n)
        with Journal.open(root) as journal:
            journal.create_run("j", goal_kind="theta", goal_value=1.0, tasks=bag.tasks)
            started = time.perf_counter()
            for i, task in enumerate(bag.tasks):
                with journal.batch():
                    journal.task_started(task.id, 1, "n0", at_s=float(i))
                    journal.task_finished(task.id, 1, AttemptResult(exit_code=0, runtime_s=0.0), node="n0",
                                          at_s=float(i))
                    journal.record_event("task.done", {"task": task.id, "attempt": 1})
            return n / (time.perf_counter() - started)


def _p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) > 1 else xs[0]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="10,100,1000", help="fake agent counts, one row each")
    parser.add_argument("--tasks", type=int, default=20000, help="no-op tasks per row")
    parser.add_argument("--local-agents", type=int, default=16)
    parser.add_argument("--local-tasks", type=int, default=5000)
    parser.add_argument("--no-local", action="store_true", help="skip the 16 local agents' comparison")
    parser.add_argument("--no-sim", action="store_true",
                        help="skip the simulator's cases (bench_sim.py --scale: 100,000 and 1,000,000 tasks, ~2 min)")
    parser.add_argument("--compare-threads", action="store_true",
                        help="also run each row with a reader thread per agent (the design before the hub)")
    args = parser.parse_args()
    print(f"python3 {' '.join(sys.argv)}")
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    misses = 0
    print(f"{'agents':>6} {'timed':>6} {'attach s':>8} {'tasks/s':>8} {'master CPU ms/task':>18} "
          f"{'decide CPU ms p50/p95':>21} {'starts/turn':>11} {'turn CPU ms p50 (msgs)':>22} {'threads':>7}")
    rows = []
    for agents in (int(a) for a in args.agents.split(",")):
        for threads in (False, True) if args.compare_threads else (False,):
            r = fake_row(agents, args.tasks, reader_threads=threads)
            if not threads:
                rows.append(r)
            print(f"{r.agents:>6} {r.done:>6} {r.attach_s:>8.2f} {r.tasks_per_s:>8,.0f} {r.cpu_ms_per_task:>18.3f} "
                  f"{statistics.median(r.decide_ms):>12.2f}/{_p95(r.decide_ms):<8.2f} "
                  f"{statistics.median(r.starts):>11.0f} {statistics.median(r.turn_ms):>15.2f} "
                  f"({statistics.median(r.messages):>4.0f}) {r.threads:>7}{'  (a reader thread per agent)' if threads else ''}")
    big = max(rows, key=lambda r: r.agents)
    # The verdict counts only the decisions that hand out work: decisions that start nothing
    # are cheap and, when they are most of them, make the median say nothing about dispatch.
    working = [d for d, n in zip(big.decide_ms, big.starts) if n > 0] or big.decide_ms
    working_starts = [n for n in big.starts if n > 0] or big.starts
    goals = [
        (f"{big.agents} agents attach in 10 s or less", big.attach_s <= 10.0, f"{big.attach_s:.2f} s"),
        (f"decision turn 2 ms or less at {big.agents} agents (median of the decisions that start work, CPU)",
         statistics.median(working) <= 2.0,
         f"{statistics.median(working):.2f} ms CPU, p95 {_p95(working):.2f} ms, {len(working)} of "
         f"{len(big.decide_ms)} decisions started work, a median {statistics.median(working_starts):.0f} tasks each; "
         f"all decisions: median {statistics.median(big.decide_ms):.2f} ms, "
         f"{statistics.median(big.starts):.0f} starts a decision (wall: median {statistics.median(big.decide_wall_ms):.2f} ms, "
         f"p95 {_p95(big.decide_wall_ms):.2f} ms); whole turn {statistics.median(big.turn_ms):.2f} ms CPU for "
         f"{statistics.median(big.messages):.0f} messages"),
        (f"master CPU 0.3 ms/task or less at {big.agents} agents", big.cpu_ms_per_task <= 0.3,
         f"{big.cpu_ms_per_task:.3f} ms"),
        ("no thread per agent", big.threads < 50 + min(r.agents for r in rows),
         f"{big.threads} threads at {big.agents} agents, {min(rows, key=lambda r: r.agents).threads} at "
         f"{min(r.agents for r in rows)}"),
    ]
    rate = journal_commits_per_s()
    print(f"journal: {rate:,.0f} commits/s (one batch per commit: a start, a result, an event)")
    if not args.no_local:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_dispatch import local_dispatch, spawn_only_rate

        spawn = spawn_only_rate(":")
        bare = local_dispatch(args.local_agents, SLOTS, args.local_tasks, ":").tasks_per_s
        full = local_daemon_rate(args.local_agents, args.local_tasks)
        serial_s, background_s = local_attach_s(args.local_agents)
        print(f"{args.local_agents} local agents attach in {background_s:.2f} s in the background, at most 8 at once "
              f"({serial_s:.2f} s one after another: {serial_s / background_s:.1f}x)")
        print(f"{args.local_agents} local agents, {args.local_tasks} no-op tasks: spawn-only floor {spawn:,.0f}/s, "
              f"bare agent path {bare:,.0f}/s ({bare / spawn:.2f}x floor), full daemon {full:,.0f}/s "
              f"({full / bare:.2f}x bare)")
        goals += [("full daemon 0.9x the bare agent path or better", full / bare >= 0.9, f"{full / bare:.2f}x"),
                  ("bare agent path 0.9x the spawn-only floor or better", bare / spawn >= 0.9, f"{bare / spawn:.2f}x")]
    for text, ok, figure in goals:
        misses += not ok
        print(f"{_verdict(ok)}  {text}: {figure}")
    if not args.no_sim:  # its own PASS/MISS lines; its exit status counts as a miss
        print(flush=True)
        sim = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "bench_sim.py"), "--scale"])
        misses += sim.returncode != 0
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
