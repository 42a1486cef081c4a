"""Inject faults and count the damage: in the simulator over many seeds, and in real dry runs.

    python3 bench/bench_faults.py [--seeds 60] [--parallel 2] [--dry-runs all|none|NAME,...] [--workdir DIR]

(a) The simulator (``broker/sim/``, the same controller and failure rules as the daemon):
one run per seed, each with a fault mix drawn from the seed (transient attempt failures,
poison tasks, bad nodes, lost instances, killed agents, capacity and limit refusals,
partial launches; half under a budget goal, half under a deadline; retries and the
distinct-nodes rule drawn too).

(b) Real dry runs (``broker run --dry-run``: moto server process, local agents, tasks that
really run), each with EC2 faults injected through ``BROKER_DRY_RUN_FAULTS`` (see
broker/shells/faults.py) and, in some, an instance's agent SIGKILLed mid-task and a task
that fails everywhere.

Damage counted (all must be 0):

- lost: tasks neither done, nor quarantined, nor pending (waiting to run) at the end. Tasks
  left pending are counted apart: by a budget stop (BaTS semantics: what the budget cannot
  pay is not started), or when the run gave up with no node left to run on (a finding to
  look at, not a loss: the journal and the report list them as left);
- duplicated: tasks recorded done more than once, tasks both done and quarantined, and
  (dry runs) attempts started after the task's counted attempt had ended;
- orphaned: instances still running at the end (sim: launched but never released; dry run:
  alive in moto under the run's tag, or not terminated in the journal, or an agent process
  left), and (dry runs) launches that hold more instances in EC2 than they asked for, or
  instances in EC2 the journal does not know (a doubled launch);
- over budget: runs whose committed spend ever exceeded the budget (the maximum committed
  spend over the budget is printed too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# -- (a) the simulator ----------------------------------------------------------------------


def _sim_one(seed: int) -> dict:
    import numpy as np

    from broker.core.billing import Billing
    from broker.core.control.controller import ControllerConfig
    from broker.core.control.failures import FailurePolicy
    from broker.core.control.snapshot import Goal
    from broker.core.model import Inventory, MachineType, PrivateNode
    from broker.sim.engine import SimOptions, SimWorkload, Simulation

    rng = np.random.default_rng(10_000 + seed)
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    billing = pick([Billing.hourly(), Billing.per_second(), Billing.custom(600, 600)])
    limit = int(rng.integers(1, 6))
    types = (MachineType("cheap", 2, 1.0, 0.10, limit, 60.0, billing),
             MachineType("fast", 4, 2.0, 0.45, limit, 60.0, billing))
    private_slots = pick([0, 1, 2])
    private = (PrivateNode("own", private_slots, 1.0, 0.0, local=True),) if private_slots else ()
    n = int(rng.integers(20, 150))
    mean = pick([60.0, 300.0, 1200.0])
    runtimes = np.random.default_rng(seed).lognormal(math.log(mean) - 0.125, 0.5, n)
    workload = SimWorkload(runtimes, None, float(runtimes.mean()), name="lognormal")
    budget = seed % 2 == 0
    goal = (Goal("budget", pick([0.05, 0.3, 1.0, 5.0])) if budget
            else Goal("deadline", float(runtimes.sum()) / pick([2.0, 8.0]) + 900))
    rate = lambda: pick([0.0, 0.05, 0.2, 0.5])  # noqa: E731
    options = SimOptions(
        seed=seed, max_virtual_s=20 * 86400.0,
        failure_rate=rate(), poison_rate=pick([0.0, 0.02, 0.1]), bad_node_rate=pick([0.0, 0.1, 0.3]),
        instance_loss_rate=rate(), agent_kill_rate=rate(), capacity_rate=pick([0.0, 0.2, 0.5]),
        limit_rate=pick([0.0, 0.1]), partial_rate=rate(),
        failures=FailurePolicy(retries=int(rng.integers(0, 5)), distinct_nodes=pick([0, 2, 3])),
    )
    config = ControllerConfig(tick_s=60.0, replan_every_s=600.0, margin_s=120.0)
    sim = Simulation(Inventory(private=private, types=types), workload, goal, config, options)
    r = sim.run()
    done, quarantined = set(r.completions), set(r.quarantined)
    pending = len(sim.pool)
    left = r.tasks_total - len(done | quarantined)
    return {
        "seed": seed, "tasks": r.tasks_total, "done": r.tasks_done, "quarantined": r.tasks_quarantined,
        "faults": dict(r.faults),
        "lost": left - pending,  # neither done, quarantined nor waiting in the pool
        "left_budget": pending if r.budget_stopped else 0,
        "left_gave_up": 0 if r.budget_stopped else pending,
        "duplicated": sum(c - 1 for c in r.completions.values() if c > 1) + len(done & quarantined),
        "orphaned": r.instances_launched - len(r.releases),
        "budget": goal.value if budget else None, "max_committed": r.max_committed_usd,
        "bad_nodes": len(r.bad_nodes_found),
    }


def run_sim(seeds: int, parallel: int) -> list[dict]:
    with ProcessPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(_sim_one, range(seeds)))


# -- (b) real dry runs ----------------------------------------------------------------------

from tests.test_daemon_faults import INVENTORY, moto_by_token  # noqa: E402 - two types, one local slot: the tests' own

SCALE = 20.0


@dataclass
class DryRun:
    name: str
    faults: str  # BROKER_DRY_RUN_FAULTS
    goal: tuple[str, str] = ("--deadline", "3m")
    task_s: float = 0.4
    kill_agent: bool = False  # SIGKILL an instance's agent while it runs a task
    poison: bool = False  # one task fails everywhere (it must be quarantined)


DRY_RUNS = [
    DryRun("capacity+limit", "insufficient_capacity:c5.large:1,instance_limit:m5.large:1"),
    DryRun("throttle+timeouts", "throttle:RunInstances:2,timeout:RunInstances:1,lost_response:RunInstances:1,"
           "throttle:TerminateInstances:1,timeout:TerminateInstances:1,timeout:DescribeInstances:2"),
    DryRun("partial", "partial:c5.large:1"),
    DryRun("budget+throttle+partial", "throttle:RunInstances:1,partial:c5.large:1,lost_response:RunInstances:1,"
           "timeout:TerminateInstances:1", goal=("--budget", "0.25")),
    DryRun("agent-kill+poison+capacity", "insufficient_capacity:c5.large:1", task_s=2.0, kill_agent=True, poison=True),
]


@dataclass
class DryResult:
    name: str
    returncode: int = 0
    tasks: int = 0
    done: int = 0
    quarantined: int = 0
    lost: int = 0
    left_budget: int = 0
    left_gave_up: int = 0
    duplicated: int = 0
    orphaned: int = 0
    doubled: int = 0
    faults: Counter = field(default_factory=Counter)
    budget: float | None = None
    max_committed: float = 0.0
    wall_s: float = 0.0
    error: str = ""


def _query(run_dir: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _events(run_dir: Path, name: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _agent_pids(run_dir: Path) -> list[int]:
    from tests.test_dryrun import agent_pids

    return agent_pids(run_dir)


def _kill_an_instance_agent(proc: subprocess.Popen, run_dir: Path, result: DryResult) -> None:
    from broker.shells.local_transport import local_agent_pid
    from broker.shells.nodes import agent_dir

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            rows = _query(run_dir, "SELECT a.node FROM attempts a JOIN instances i ON i.id = a.node "
                                   "WHERE a.outcome = 'running'")
        except sqlite3.Error:
            rows = []
        if rows:
            pid = local_agent_pid(agent_dir(run_dir, rows[0][0]))
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                result.faults["agent_killed"] += 1
                return
        time.sleep(0.05)


def run_dry(spec: DryRun, workdir: Path) -> DryResult:
    result = DryResult(spec.name)
    base = workdir / spec.name
    base.mkdir(parents=True, exist_ok=True)
    (base / "inv.yaml").write_text(INVENTORY)
    commands = [f"python3 -c 'import time; time.sleep({spec.task_s + 0.1 * (k % 2)}); print({k})'" for k in range(10)]
    if spec.poison:
        commands.append("sh -c 'echo poison: cannot open input >&2; exit 3'")
    (base / "tasks.txt").write_text("\n".join(commands) + "\n")
    (base / "bag.yaml").write_text("name: faults\ntasks_file: tasks.txt\ntimeout: 60s\nretries: 2\n")
    run_dir = base / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(PYTHONPATH=str(REPO), BROKER_DRY_RUN_FAULTS=spec.faults, BROKER_DRY_RUN_KEEP_MOTO="1")
    argv = [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", *spec.goal, "--tick", "60s",
            "--time-scale", f"{SCALE:g}", "--inventory", str(base / "inv.yaml"), str(base / "bag.yaml"),
            "--run-dir", str(run_dir)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        if spec.kill_agent:
            _kill_an_instance_agent(proc, run_dir, result)
        _, err = proc.communicate(timeout=300)
        result.returncode = proc.returncode
        result.wall_s = time.monotonic() - started
        run_id = _query(run_dir, "SELECT id FROM run")[0][0]
        states = dict(_query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state"))
        result.tasks = sum(states.values())
        result.done = states.get("done", 0)
        result.quarantined = states.get("quarantined", 0) + states.get("failed", 0)
        pending = states.get("pending", 0)
        result.lost = result.tasks - result.done - result.quarantined - pending
        budget_stop = bool(_events(run_dir, "budget.stop"))
        result.left_budget, result.left_gave_up = (pending, 0) if budget_stop else (0, pending)
        done_events = Counter(e["task"] for e in _events(run_dir, "task.done"))
        reruns = _query(run_dir, """
            SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
            JOIN attempts d ON d.task_id = t.id AND d.attempt = t.done_attempt
            WHERE a.attempt <> d.attempt AND a.started_at > d.ended_at""")[0][0]
        result.duplicated = sum(c - 1 for c in done_events.values() if c > 1) + reruns
        for e in _events(run_dir, "fault.injected"):
            result.faults[f"{e['operation']}:{e['kind']}"] += 1
        if spec.poison:
            result.faults["poison_task"] += 1
        in_moto = moto_by_token(run_dir)  # the tests' own lookup
        alive_in_moto = sum(1 for g in in_moto.values() for _, s in g if s not in ("terminated", "shutting-down"))
        not_terminated = _query(run_dir, "SELECT count(*) FROM instances WHERE state <> 'terminated'")[0][0]
        time.sleep(1.0)  # agents stop asynchronously at the run's end
        result.orphaned = alive_in_moto + not_terminated + len(_agent_pids(run_dir))
        asked = {json.loads(p)["client_token"]: json.loads(p)["count"]
                 for (p,) in _query(run_dir, "SELECT payload FROM actions WHERE kind = 'launch'")}
        journal_ids = {i for (i,) in _query(run_dir, "SELECT id FROM instances")}
        moto_ids = {i for g in in_moto.values() for i, _ in g}
        result.doubled = (sum(max(0, len(g) - asked.get(t, 0)) for t, g in in_moto.items())
                          + len(moto_ids - journal_ids))
        if spec.goal[0] == "--budget":
            result.budget = float(spec.goal[1])
        spends = [e["committed_usd"] for e in _events(run_dir, "instance.terminated")]
        spends += [e["committed_usd"] for e in _events(run_dir, "budget.stop")]
        result.max_committed = max(spends, default=0.0)
        if proc.returncode not in (0, 1) or "Traceback" in err:
            result.error = err[-500:]
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], cwd=REPO, capture_output=True,
                       timeout=120, env={**env, "BROKER_DRY_RUN_FAULTS": ""})
    return result


# -- report ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=60, help="simulated runs, one per seed (0: none)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--dry-runs", default="all", help="all, none, or names: "
                        + ", ".join(d.name for d in DRY_RUNS))
    parser.add_argument("--workdir", help="where the dry runs' directories go (default: a temporary one)")
    args = parser.parse_args(argv)
    print(f"$ python3 bench/bench_faults.py --seeds {args.seeds} --parallel {args.parallel} --dry-runs {args.dry_runs}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    damage = 0

    if args.seeds > 0:
        started = time.monotonic()
        sims = run_sim(args.seeds, args.parallel)
        wall = time.monotonic() - started
        faults: Counter = Counter()
        for s in sims:
            faults.update(s["faults"])
        budgets = [s for s in sims if s["budget"] is not None]
        over = [s for s in budgets if s["max_committed"] > s["budget"] + 1e-9]
        worst = max((s["max_committed"] / s["budget"] for s in budgets), default=0.0)
        total = {k: sum(s[k] for s in sims) for k in ("tasks", "done", "quarantined", "lost", "left_budget",
                                                      "left_gave_up", "duplicated", "orphaned", "bad_nodes")}
        print(f"\n(a) simulator: {len(sims)} runs (seeds 0-{len(sims) - 1}), {wall:.0f} s wall")
        print("  faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
        print(f"  tasks {total['tasks']}: done {total['done']}, quarantined {total['quarantined']}, "
              f"left pending by a budget stop {total['left_budget']}, left pending when the run gave up "
              f"{total['left_gave_up']}; bad nodes found {total['bad_nodes']}")
        print(f"  lost {total['lost']}, duplicated {total['duplicated']}, instances orphaned {total['orphaned']}, "
              f"over budget {len(over)} of {len(budgets)} budget runs "
              f"(max committed / budget: {worst:.3f})")
        damage += total["lost"] + total["duplicated"] + total["orphaned"] + len(over)
        for s in sims:
            if s["lost"] or s["duplicated"] or s["orphaned"] or s in over:
                print(f"  DAMAGE seed {s['seed']}: {s}")
        for s in sims:
            if s["left_gave_up"]:
                print(f"  finding: seed {s['seed']} gave up with {s['left_gave_up']} tasks pending "
                      f"(goal {'budget' if s['budget'] is not None else 'deadline'}; {s['faults']})")

    chosen = [] if args.dry_runs == "none" else (
        DRY_RUNS if args.dry_runs == "all" else [d for d in DRY_RUNS if d.name in args.dry_runs.split(",")])
    if chosen:
        workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-faults-"))
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            results = list(pool.map(lambda d: run_dry(d, workdir), chosen))
        wall = time.monotonic() - started
        print(f"\n(b) dry runs: {len(results)} at time scale {SCALE:g}, tick 60 s, {wall:.0f} s wall "
              f"(run directories in {workdir})")
        faults = Counter()
        for r in results:
            faults.update(r.faults)
            budget = f", max committed ${r.max_committed:.3f} of ${r.budget:.2f}" if r.budget is not None else ""
            print(f"  {r.name:28s} exit {r.returncode}: done {r.done}/{r.tasks}, quarantined {r.quarantined}, "
                  f"lost {r.lost}, left pending {r.left_budget + r.left_gave_up}, duplicated {r.duplicated}, "
                  f"orphaned {r.orphaned}, doubled launches {r.doubled}{budget} ({r.wall_s:.0f} s)")
            print("      injected: " + ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items())))
            if r.error:
                print(f"      ERROR: {r.error}")
            over = r.budget is not None and r.max_committed > r.budget + 1e-9
            damage += r.lost + r.duplicated + r.orphaned + r.doubled + int(over) + int(bool(r.error))
        print("  faults injected in all: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print(f"\ndamage in all (lost + duplicated + orphaned + doubled + over budget + errors): {damage}")
    return 0 if damage == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
