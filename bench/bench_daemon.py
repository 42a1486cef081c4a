"""The full daemon's dispatch rate of no-op tasks, against the bare agent path.

    python3 bench/bench_daemon.py [--tasks 5000] [--agents 16] [--slots 4] [--repeat 3]

``broker run`` (private-only, no EC2) on ``--agents`` local nodes of ``--slots`` slots and a
bag of ``--tasks`` copies of ``:``; the rate is tasks from the first ``task.start`` to the last
``task.done`` in the run's ``events.jsonl``, over that span (the agents' start-up and the
planning before the first start are left out). The bare agent path is
``bench/bench_dispatch.py``'s loop (the same agents, no journal, no controller) on the same
machine in the same invocation, so the ratio daemon / bare is what the daemon costs.

Also the CPU time of the ``broker run`` process per task (its threads, start-up included; the
agents are detached and not counted), and of its main thread (the loop: journal, log lines,
decisions, pipe writes) from the first start to the last result: steadier than the rates on a
shared machine.
Medians over ``--repeat`` runs of each. No asserts: a loaded machine moves both figures.
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
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def daemon_rate(agents: int, slots: int, n_tasks: int) -> tuple[float, float, float, float]:
    """(tasks/s between the first start and the last result, wall seconds of ``broker run``,
    CPU seconds of the ``broker run`` process (its threads, start-up included; not the
    detached agents), CPU seconds of its main thread, the loop, between the first start and
    the last result)."""
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
            samples = _main_thread_cpu(child)  # (epoch s, main-thread CPU s) every 20 ms
        wall_s, cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
        if child.returncode != 0:
            raise RuntimeError(f"broker run exited {child.returncode}: {(root / 'stderr').read_text()[-2000:]}")
        first = last = None
        count = 0
        with open(root / "run" / "events.jsonl", encoding="utf-8") as f:
            for line in f:
                if '"task.' not in line:
                    continue
                event = json.loads(line)
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                if event["event"] == "task.start" and first is None:
                    first = at
                elif event["event"] == "task.done":
                    last, count = at, count + 1
        if count != n_tasks or first is None or last is None:
            raise RuntimeError(f"{count} of {n_tasks} tasks done in events.jsonl")
        loop_cpu_s = _cpu_at(samples, last) - _cpu_at(samples, first)
        return n_tasks / (last - first), wall_s, cpu_s, loop_cpu_s


def _main_thread_cpu(child: subprocess.Popen) -> list[tuple[float, float]]:
    """Poll the child's main thread's CPU time (/proc/PID/task/PID/stat) until it exits."""
    tick = os.sysconf("SC_CLK_TCK")
    samples = []
    while child.poll() is None:
        try:
            with open(f"/proc/{child.pid}/task/{child.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            samples.append((time.time(), (int(fields[11]) + int(fields[12])) / tick))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
    return samples


def _cpu_at(samples: list[tuple[float, float]], at: float) -> float:
    """The last sampled CPU time at or before ``at``."""
    before = [cpu for t, cpu in samples if t <= at]
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
    args = parser.parse_args()

    import structlog

    from bench.bench_dispatch import local_dispatch, spawn_only_rate

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    print(f"python3 {' '.join(sys.argv)}")
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    spawn = spawn_only_rate(":")
    bare, daemon, walls, cpus, loops = [], [], [], [], []
    for _ in range(args.repeat):  # interleaved, so that a change of load hits both alike
        bare.append(local_dispatch(args.agents, args.slots, args.tasks, ":").tasks_per_s)
        rate, wall, cpu, loop_cpu = daemon_rate(args.agents, args.slots, args.tasks)
        loops.append(loop_cpu)
        daemon.append(rate)
        walls.append(wall)
        cpus.append(cpu)
    b, d = statistics.median(bare), statistics.median(daemon)
    print(f"spawn-only floor:            {spawn:,.0f} tasks/s")
    print(f"bare agent path ({args.agents} agents):  {b:,.0f} tasks/s  (runs: {', '.join(f'{x:,.0f}' for x in bare)})")
    print(f"broker run ({args.agents} agents):       {d:,.0f} tasks/s  (runs: {', '.join(f'{x:,.0f}' for x in daemon)}; "
          f"whole command {statistics.median(walls):.1f} s)")
    print(f"broker run CPU per task:     {1e3 * statistics.median(cpus) / args.tasks:.3f} ms (the whole process, "
          f"start-up included: runs {', '.join(f'{1e3 * c / args.tasks:.3f}' for c in cpus)})")
    print(f"its main thread (the loop):  {1e3 * statistics.median(loops) / args.tasks:.3f} ms CPU per task, first start "
          f"to last result (runs {', '.join(f'{1e3 * c / args.tasks:.3f}' for c in loops)})")
    print(f"daemon / bare agent path:    {d / b:.2f}x;  bare / spawn-only: {b / spawn:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
