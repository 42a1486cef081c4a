"""The full daemon's dispatch rate of no-op tasks, against the bare agent path.

    python3 bench/bench_daemon.py [--tasks 5000] [--agents 16] [--slots 4] [--repeat 3]

``broker run`` (private-only, no EC2) on ``--agents`` local nodes of ``--slots`` slots and a
bag of ``--tasks`` copies of ``:``; the rate is tasks from the first ``task.start`` to the last
``task.done`` in the run's ``events.jsonl``, over that span (the agents' start-up and the
planning before the first start are left out). The bare agent path is
``bench/bench_dispatch.py``'s loop (the same agents, no journal, no controller) on the same
machine in the same invocation, so the ratio daemon / bare is what the daemon costs.

Where the time goes, for both paths, from the first start to the last result:

- slots busy: the agents' own runtimes of the tasks (spawn to reap) over slots x span; the rest
  of a slot's time it waited for the master (``slot idle ms per task``);
- the master's CPU per task: every thread of the bare loop's process, and of the ``broker
  run`` process (the loop and the agent hub), and of the daemon's loop thread alone (journal,
  log lines, decisions, pipe writes): steadier than the rates on a shared machine;
- ``--calibrate MS``: the bare path again, its loop burning MS ms of CPU per result, so the
  cost of a master's extra CPU per task shows on the same machine at the same load
  (``--window 1``: one Run a slot in the bare path). By default the bare path keeps as many
  Runs a slot as the daemon's queue-ahead holds for no-op tasks (``1 + DEEP_QUEUE_DEPTH``, 8),
  so neither side has a deeper queue than the other (with 2 a slot it ran ~2% slower).

The daemon attaches its agents in the background and dispatches as soon as the first is ready,
so its span holds the others' start-up (a Python process an agent, reached on its socket: about
0.5 s for 16 on this 2-core machine), which the bare path pays before its clock starts. ``all
agents attached``: the daemon's results after its last ``node.ready``, over the time from then
to the last result, the same figure as the bare path's (a little generous: the daemon's queues
are full at that moment, the bare path's clock starts with them empty, about one no-op task's
time of a 2-3 s span; counting the tasks dispatched after it instead, as before the tenth
session, left out the 512 queued then, a tenth of a 5,000-task span, and read 0.82-0.85x when
the first-start figure read 0.88-0.90x). ``agents' start-up on both clocks``: the other way to make the
two alike, each clock started when its agents are started (the daemon's ``run.start``; the
bare path's first ``connect_local_agent``, all 16 started at once) and stopped at the last result.

Also the CPU of ``broker run`` and its children per task, start-up included: the local agents
it starts are its children, and with them their tasks, counted once reaped (an agent still
running at the end is not). Medians over ``--repeat`` runs of each. No asserts: a loaded
machine moves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class DaemonFigures:
    rate: float  # tasks/s between the first start and the last result
    wall_s: float  # the whole ``broker run`` command
    cpu_s: float  # the ``broker run`` process and its children (start-up included; not the detached agents)
    loop_cpu_s: float  # its main thread (the loop), first start to last result
    master_cpu_s: float  # every thread of the ``broker run`` process, first start to last result
    busy_s: float  # the agents' runtimes of the tasks (spawn to reap), summed
    span_s: float  # first start to last result
    slots: int
    ready_s: float = 0.0  # the last agent ready (its node.ready), from the first start
    steady_rate: float = 0.0  # results after that, over the time from then to the last result
    from_attach_rate: float = 0.0  # tasks over the time from run.start (its agents start then) to the last result

    @property
    def occupancy(self) -> float:
        return self.busy_s / (self.slots * self.span_s)


def daemon_rate(agents: int, slots: int, n_tasks: int) -> DaemonFigures:
    """One ``broker run`` of ``n_tasks`` no-op tasks on ``agents`` local nodes; see DaemonFigures."""
    with tempfile.TemporaryDirectory(prefix="bk-daemon-") as tmp:
        root = Path(tmp)
        nodes = "".join(f"  - name: n{i}\n    local: true\n    slots: {slots}\n" for i in range(agents))
        (root / "inv.yaml").write_text(f"private:\n{nodes}")
        (root / "bag.yaml").write_text(f'command: ": {{k}}"\ntimeout: 30s\nsweep:\n  k: {{range: [0, {n_tasks}]}}\n')
        env = dict(os.environ, PYTHONPATH=str(REPO))
        t0, cpu0 = time.perf_counter(), _children_cpu_s()
        with open(root / "stderr", "w") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "broker", "run", "--inventory", str(root / "inv.yaml"), "--deadline", "10h",
                 "--run-dir", str(root / "run"), "--yes", str(root / "bag.yaml")],
                env=env, stdout=subprocess.DEVNULL, stderr=err)
            samples = _cpu_samples(child)  # (epoch s, main-thread CPU s, process CPU s) every 20 ms
        wall_s, cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
        if child.returncode != 0:
            raise RuntimeError(f"broker run exited {child.returncode}: {(root / 'stderr').read_text()[-2000:]}")
        first = last = run_start = None
        count, busy_s = 0, 0.0
        ready, dones = [], []
        with open(root / "run" / "events.jsonl", encoding="utf-8") as f:
            for line in f:
                if '"task.' not in line and '"node.ready"' not in line and '"run.start"' not in line:
                    continue
                event = json.loads(line)
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                if event["event"] == "run.start":
                    run_start = at
                elif event["event"] == "node.ready":
                    ready.append(at)
                elif event["event"] == "task.start":
                    first = at if first is None else first
                elif event["event"] == "task.done":
                    last, count, busy_s = at, count + 1, busy_s + event["runtime_s"]
                    dones.append(at)
        if count != n_tasks or first is None or last is None or run_start is None or len(ready) != agents:
            raise RuntimeError(f"{count} of {n_tasks} tasks done, {len(ready)} of {agents} nodes ready in events.jsonl")
        all_ready = max(max(ready), first)
        after = sum(1 for at in dones if at > all_ready)
        return DaemonFigures(
            rate=n_tasks / (last - first), wall_s=wall_s, cpu_s=cpu_s,
            loop_cpu_s=_cpu_at(samples, last, 1) - _cpu_at(samples, first, 1),
            master_cpu_s=_cpu_at(samples, last, 2) - _cpu_at(samples, first, 2),
            busy_s=busy_s, span_s=last - first, slots=agents * slots, ready_s=all_ready - first,
            steady_rate=after / (last - all_ready), from_attach_rate=n_tasks / (last - run_start))


def _cpu_samples(child: subprocess.Popen) -> list[tuple[float, float, float]]:
    """Poll the child's CPU time, its main thread's (/proc/PID/task/PID/stat) and its whole
    process's (/proc/PID/stat: every thread), until it exits."""
    tick = os.sysconf("SC_CLK_TCK")
    samples = []
    while child.poll() is None:
        try:
            cpu = []
            for path in (f"/proc/{child.pid}/task/{child.pid}/stat", f"/proc/{child.pid}/stat"):
                with open(path) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu.append((int(fields[11]) + int(fields[12])) / tick)
            samples.append((time.time(), cpu[0], cpu[1]))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
    return samples


def _cpu_at(samples: list[tuple[float, float, float]], at: float, which: int) -> float:
    """The last sampled CPU time (``which``: 1 the main thread, 2 the process) at or before ``at``."""
    before = [sample[which] for sample in samples if sample[0] <= at]
    return before[-1] if before else 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=None,
                        help="the bare path's Runs in flight per slot (default: as many as the daemon's deepest "
                             "queue-ahead holds, 1 + DEEP_QUEUE_DEPTH; 2: bench_dispatch's; 1: one a slot)")
    parser.add_argument("--calibrate", type=float, default=None, metavar="MS",
                        help="also run the bare path burning MS ms of CPU per Result in its loop (interleaved)")
    args = parser.parse_args()
    if args.window is None:  # the same queue at each slot as the daemon keeps for no-op tasks: no handicap either way
        from broker.core.control.queue_ahead import DEEP_QUEUE_DEPTH

        args.window = 1 + DEEP_QUEUE_DEPTH

    import structlog

    from bench.bench_dispatch import local_dispatch, spawn_only_rate

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    print(f"python3 {' '.join(sys.argv)}")
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    spawn = spawn_only_rate(":")
    bare, calibrated, daemon = [], [], []
    for _ in range(args.repeat):  # interleaved, so that a change of load hits both alike
        bare.append(local_dispatch(args.agents, args.slots, args.tasks, ":", args.window))
        daemon.append(daemon_rate(args.agents, args.slots, args.tasks))
        if args.calibrate is not None:
            calibrated.append(local_dispatch(args.agents, args.slots, args.tasks, ":", args.window, args.calibrate))
    _print(args, spawn, bare, daemon, calibrated)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def _runs(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} (runs {', '.join(format(v, fmt) for v in values)})"


def _print(args: argparse.Namespace, spawn: float, bare: list, daemon: list[DaemonFigures], calibrated: list) -> None:
    n = args.tasks
    b, d = statistics.median(f.tasks_per_s for f in bare), statistics.median(f.rate for f in daemon)
    print(f"spawn-only floor:            {spawn:,.0f} tasks/s")
    print(f"bare agent path ({args.agents} agents):  {_runs([f.tasks_per_s for f in bare], ',.0f')} tasks/s, "
          f"window {args.window} a slot")
    print(f"broker run ({args.agents} agents):       {_runs([f.rate for f in daemon], ',.0f')} tasks/s; "
          f"whole command {statistics.median(f.wall_s for f in daemon):.1f} s")
    print(f"daemon / bare agent path:    {d / b:.2f}x;  bare / spawn-only: {b / spawn:.2f}x")
    steady = statistics.median(f.steady_rate for f in daemon)
    print(f"broker run, all agents attached: {_runs([f.steady_rate for f in daemon], ',.0f')} tasks/s "
          f"(results after the last node.ready, {_runs([f.ready_s for f in daemon], '.2f')} s into the span, "
          f"over the time from then to the last result) = {steady / b:.2f}x the bare agent path (whose agents are "
          f"attached before its clock starts)")
    both = statistics.median(f.from_attach_rate for f in daemon)
    bare_both = statistics.median(f.tasks / (f.attach_s + f.wall_s) for f in bare)
    print(f"agents' start-up on both clocks: broker run {_runs([f.from_attach_rate for f in daemon], ',.0f')} tasks/s "
          f"(from run.start, when it starts its agents, to the last result); bare agent path "
          f"{_runs([f.tasks / (f.attach_s + f.wall_s) for f in bare], ',.0f')} tasks/s (from starting its agents, "
          f"{_runs([f.attach_s for f in bare], '.2f')} s to every Hello, to the last result) = {both / bare_both:.2f}x")
    print("where the time goes (first start to last result):")
    print(f"  slots busy running tasks:  bare {_runs([f.occupancy for f in bare], '.2f')}; "
          f"daemon {_runs([f.occupancy for f in daemon], '.2f')}")
    print(f"  slot idle ms per task:     bare {_runs([f.idle_ms_per_task for f in bare], '.1f')}; daemon "
          f"{_runs([1e3 * (f.slots * f.span_s - f.busy_s) / n for f in daemon], '.1f')}")
    print(f"  master CPU ms per task:    bare {_runs([1e3 * f.master_cpu_s / n for f in bare], '.3f')} (its process); "
          f"daemon {_runs([1e3 * f.master_cpu_s / n for f in daemon], '.3f')} (the broker run process), "
          f"of which its loop thread {_runs([1e3 * f.loop_cpu_s / n for f in daemon], '.3f')}")
    print(f"  broker run CPU per task:   {_runs([1e3 * f.cpu_s / n for f in daemon], '.3f')} ms (the process and "
          f"its children, start-up included: the local agents it started and their tasks, once reaped)")
    if calibrated:
        c = statistics.median(f.tasks_per_s for f in calibrated)
        print(f"calibration: the bare path burning {args.calibrate:g} ms CPU per result in its loop: "
              f"{_runs([f.tasks_per_s for f in calibrated], ',.0f')} tasks/s = {c / b:.2f}x the bare path, master CPU "
              f"{_runs([1e3 * f.master_cpu_s / n for f in calibrated], '.3f')} ms per task")


if __name__ == "__main__":
    main()
