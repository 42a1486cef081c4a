"""Inject faults and count the damage, per fault kind: real dry runs over many seeds, and the simulator.

    python3 bench/bench_faults.py [--quick] [--json] [--seeds 20] [--sim-seeds 60] [--parallel 2]
                                  [--kinds all|required|NAME,...] [--workdir DIR]

(b) Real dry runs (``broker run --dry-run``: moto server process, local agents, tasks that
really run), one per fault kind and seed. The seed draws the bag (8-14 tasks of 1.5-2.5 s
wall, 30-50 s of run time, more than the one private slot can finish in time, so every plan
rents) and the goal (even seeds a deadline of 150-240 s, odd seeds a budget of $0.25-0.60).
The kinds (``KINDS``): a termination failing through all its retries; a launch whose retries
ran out after EC2 carried it out; eventual consistency for 30 s; an EC2 outage of 10 minutes
of run time from the first launch; an instance that never leaves ``pending``; SIGKILL of the
run's moto server while an instance runs a task; and the earlier mixes (capacity and limit,
throttles and timeouts, a partial launch). EC2 faults go through ``BROKER_DRY_RUN_FAULTS``
(broker/shells/faults.py).

Each run checks that its planned fault fired, from the fault layer's own record (the run's
``fault.injected`` events: every planned injection, and where it matters the effect, e.g.
``instance.launch_failed`` for the lost launch), or the bench's own act (the moto server
killed, seen gone). A run whose fault did not fire counts as damage.

Damage counted per kind (all must be 0):

- lost: tasks neither done nor quarantined at the end, except those a budget stop left
  pending (BaTS semantics: what the budget cannot pay is not started);
- duplicated: tasks recorded done more than once, and attempts started after the task's
  counted attempt had ended;
- orphaned: instances alive in EC2 (moto, under the run's tag) without a journal row that
  says so, or journaled terminated while alive; launches holding more instances than they
  asked for; agent processes left. An instance the run could not get confirmed terminated
  stays un-terminated in its journal and is named in its report (exit 1, ``broker down``):
  counted apart as ``exit1``, not as an orphan. After a killed moto server its instances
  died with it;
- over budget: budget runs whose committed spend ever exceeded the budget.

For the outage, the private node's utilisation over the outage window (busy slot-seconds /
available slot-seconds, from the journal's attempts; the window runs from the first launch
intent for 10 minutes of run time, or to the last task's end if sooner).

(a) The simulator (``broker/sim/``, the same controller and failure rules as the daemon):
one run per seed, each with a fault mix drawn from the seed (transient attempt failures,
poison tasks, bad nodes, lost instances, killed agents, capacity and limit refusals,
partial launches; half under a budget goal, half under a deadline).

``--quick``: one seed per kind, no simulator. ``--json``: the human report goes to stderr
and stdout gets one object ``{"kinds": {KIND: {"fired", "lost", "duplicated", "orphaned",
"over_budget", ...}}, "damage": N}``.
"""

from __future__ import annotations

import argparse
import contextlib
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


# -- (b) real dry runs, per fault kind -------------------------------------------------------

from tests.test_daemon_faults import INVENTORY, moto_by_token  # noqa: E402 - two types, one local slot: the tests' own

SCALE = 20.0
OUTAGE_S = 600.0  # run seconds: 30 wall seconds at SCALE


@dataclass(frozen=True)
class Kind:
    """One fault kind: the faults asked for, and how to tell from the run that they fired
    (each from the fault layer's own record, ``fault.injected``, or the bench's own act)."""

    name: str
    faults: str  # BROKER_DRY_RUN_FAULTS
    wanted: tuple[tuple[str, str, int], ...] = ()  # (operation, kind, at least n) in fault.injected
    kill_moto: bool = False  # SIGKILL the run's moto server while an instance runs a task
    scenario: str = ""  # an event that must show the fault had its effect, if any
    outage: bool = False  # measure the private node's utilisation during the outage
    tick: str = "60s"  # the monitoring interval (every tick describes the run's instances)
    scale: float = SCALE  # run seconds per wall second; the tasks' sleeps keep their run time


KINDS = [
    # Every one of the retry policy's five TerminateInstances attempts throttled: the first
    # release's termination fails for good, and must be asked again until EC2 confirms.
    Kind("failed_termination", "throttle:TerminateInstances:5", (("TerminateInstances", "throttle", 5),),
         scenario="instance.terminate_failed"),
    # Each launch attempt describes by its token first: four describes time out, the fifth
    # attempt's RunInstances is carried out and its answer lost: the launch is recorded failed
    # while EC2 holds its instances (they must be found by the run's tag and adopted).
    Kind("launch_lost_after_retries", "timeout:DescribeInstances:4,lost_response:RunInstances:1",
         (("DescribeInstances", "read_timeout", 4), ("RunInstances", "lost_response", 1)),
         scenario="instance.launch_failed"),
    # Launches happen at ticks, and only the next tick describes the instances: with 60-s
    # ticks at scale 20 (3 wall s) no describe fell in the 30 s (1.5 wall s) an instance is
    # hidden; the agents' start held the loop for seconds after a launch. At scale 5 and 20-s
    # ticks the window is 6 wall seconds.
    Kind("eventual_30s", "eventual:30", (("DescribeInstances", "eventual", 1),), tick="20s", scale=5.0),
    Kind("outage_10m", f"outage:{OUTAGE_S:g}", (("RunInstances", "outage", 1),), outage=True),
    Kind("stuck_pending", "stuck_pending:1", (("RunInstances", "stuck_pending", 1),
                                              ("DescribeInstances", "stuck_pending", 1))),
    Kind("moto_sigkill", "", kill_moto=True),
    # The earlier mixes (retried, avoided and partial launches): kept as kinds of their own.
    Kind("capacity+limit", "insufficient_capacity:c5.large:1,instance_limit:m5.large:1",
         (("RunInstances", "capacity", 1),)),
    # (Its lost response comes only with a second launch: the two describe timeouts can spend
    # the first launch's five attempts before it.)
    Kind("throttle+timeouts", "throttle:RunInstances:2,timeout:RunInstances:1,lost_response:RunInstances:1,"
         "throttle:TerminateInstances:1,timeout:TerminateInstances:1,timeout:DescribeInstances:2",
         (("RunInstances", "throttle", 2), ("DescribeInstances", "read_timeout", 2))),
    # (Half of one instance is not a partial launch: a plan that buys its c5.large one at a
    # time gets no fault, and the run is reported as not fired.)
    Kind("partial", "partial:c5.large:1", (("RunInstances", "partial", 1),)),
]
REQUIRED = [k.name for k in KINDS[:6]]


@dataclass(frozen=True)
class Case:
    """One seed's run: the bag and goal drawn from the seed, so that faults meet varied plans."""

    seed: int
    tasks: int
    task_s: float  # wall seconds (x SCALE in run time)
    goal: tuple[str, str]

    @classmethod
    def of(cls, seed: int) -> "Case":
        import random

        rng = random.Random(20_000 + seed)
        # Sleeps the one private slot cannot finish by the deadline, so that every plan rents.
        tasks, task_s = rng.randint(8, 14), rng.choice([1.5, 2.0, 2.5])
        goal = (("--budget", f"{rng.choice([0.25, 0.4, 0.6]):g}") if seed % 2
                else ("--deadline", f"{rng.choice([150, 180, 240])}s"))
        return cls(seed, tasks, task_s, goal)


@dataclass
class DryResult:
    kind: str
    seed: int
    returncode: int = 0
    tasks: int = 0
    done: int = 0
    quarantined: int = 0
    lost: int = 0
    left_budget: int = 0
    duplicated: int = 0
    orphaned: int = 0
    over_budget: int = 0
    fired: bool = False
    faults: Counter = field(default_factory=Counter)
    unconfirmed: int = 0  # instances the run named as not confirmed terminated (exit 1)
    budget: float | None = None
    max_committed: float = 0.0
    utilisation: float | None = None  # the private node's, during an outage
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


def _kill_moto_when_an_instance_works(proc: subprocess.Popen, run_dir: Path, result: DryResult) -> None:
    """SIGKILL the run's moto server once a task runs on an instance; the bench's own record."""
    from broker.shells.moto_world import find_moto_server

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            rows = _query(run_dir, "SELECT a.node FROM attempts a JOIN instances i ON i.id = a.node "
                                   "WHERE a.outcome = 'running'")
        except sqlite3.Error:
            rows = []
        server = find_moto_server(run_dir) if rows else None
        if server is not None:
            os.kill(server.pid, signal.SIGKILL)
            gone = time.monotonic() + 10
            while time.monotonic() < gone and find_moto_server(run_dir) is not None:
                time.sleep(0.05)
            if find_moto_server(run_dir) is None:
                result.faults["moto_server:sigkill"] += 1
            return
        time.sleep(0.05)


def _in_moto(run_dir: Path, killed: bool) -> dict[str, list[tuple[str, str]]]:
    """EC2's instances under the run's tag by token; none when the test killed EC2 itself."""
    from broker.shells.moto_world import find_moto_server

    if killed and find_moto_server(run_dir) is None:
        return {}  # the instances died with the server: nothing of them can bill
    return moto_by_token(run_dir)


def _orphaned(run_dir: Path, killed: bool) -> int:
    """Alive in EC2 without a journal row that says so, or journaled terminated but alive in
    EC2; agents left running; launches holding more than they asked (a doubled launch)."""
    in_moto = _in_moto(run_dir, killed)
    alive = {i for g in in_moto.values() for i, s in g if s not in ("terminated", "shutting-down")}
    journal = dict(_query(run_dir, "SELECT id, state FROM instances"))
    unaccounted = sum(1 for i in alive if journal.get(i) in (None, "terminated"))
    time.sleep(1.0)  # agents stop asynchronously at the run's end
    asked = {json.loads(p)["client_token"]: json.loads(p)["count"]
             for (p,) in _query(run_dir, "SELECT payload FROM actions WHERE kind = 'launch'")}
    doubled = sum(max(0, len(g) - asked.get(t, 0)) for t, g in in_moto.items())
    return unaccounted + len(_agent_pids(run_dir)) + doubled


def _duplicated(run_dir: Path) -> int:
    done_events = Counter(e["task"] for e in _events(run_dir, "task.done"))
    reruns = _query(run_dir, """
        SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
        JOIN attempts d ON d.task_id = t.id AND d.attempt = t.done_attempt
        WHERE a.attempt <> d.attempt AND a.started_at > d.ended_at""")[0][0]
    return sum(c - 1 for c in done_events.values() if c > 1) + reruns


def _outage_utilisation(run_dir: Path) -> float | None:
    """Busy slot-seconds of the private node over the outage window / its slot-seconds. The
    window starts at the first launch intent (its RunInstances starts the outage) and ends
    OUTAGE_S later, or when the last task ended if the bag was done sooner."""
    first = _query(run_dir, "SELECT min(created_at) FROM actions WHERE kind = 'launch'")[0][0]
    if first is None:
        return None
    last_end = _query(run_dir, "SELECT max(ended_at) FROM attempts")[0][0] or first
    end = min(first + OUTAGE_S, last_end)
    if end <= first:
        return None
    slots = dict(_query(run_dir, "SELECT name, slots FROM private_nodes"))
    names = ",".join(repr(n) for n in slots) or "NULL"
    rows = _query(run_dir, f"SELECT started_at, ended_at FROM attempts WHERE node IN ({names}) "
                           "AND started_at IS NOT NULL")
    busy = sum(max(0.0, min(e if e is not None else end, end) - max(s, first)) for s, e in rows)
    return busy / (sum(slots.values()) * (end - first))


def _fired(kind: Kind, run_dir: Path, result: DryResult) -> bool:
    for e in _events(run_dir, "fault.injected"):
        result.faults[f"{e['operation']}:{e['kind']}"] += 1
    if kind.kill_moto:
        return result.faults["moto_server:sigkill"] == 1
    if any(result.faults[f"{op}:{k}"] < n for op, k, n in kind.wanted):
        return False
    return not kind.scenario or bool(_events(run_dir, kind.scenario))


def _write_inputs(base: Path, case: Case, scale: float) -> None:
    (base / "inv.yaml").write_text(INVENTORY)
    stretch = SCALE / scale  # the same run time at another scale
    commands = [f"python3 -c 'import time; time.sleep({(case.task_s + 0.1 * (k % 2)) * stretch:g}); print({k})'"
                for k in range(case.tasks)]
    (base / "tasks.txt").write_text("\n".join(commands) + "\n")
    (base / "bag.yaml").write_text("name: faults\ntasks_file: tasks.txt\ntimeout: 60s\nretries: 2\n")


def run_dry(kind: Kind, seed: int, workdir: Path) -> DryResult:
    case = Case.of(seed)
    result = DryResult(kind.name, seed)
    base = workdir / kind.name / f"seed-{seed}"
    base.mkdir(parents=True, exist_ok=True)
    _write_inputs(base, case, kind.scale)
    run_dir = base / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(PYTHONPATH=str(REPO), BROKER_DRY_RUN_KEEP_MOTO="1")
    if kind.faults:
        env["BROKER_DRY_RUN_FAULTS"] = kind.faults
    argv = [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", *case.goal, "--tick", kind.tick,
            "--time-scale", f"{kind.scale:g}", "--inventory", str(base / "inv.yaml"), str(base / "bag.yaml"),
            "--run-dir", str(run_dir)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        if kind.kill_moto:
            _kill_moto_when_an_instance_works(proc, run_dir, result)
        _, err = proc.communicate(timeout=900)
        result.returncode = proc.returncode
        result.wall_s = time.monotonic() - started
        _measure(kind, case, run_dir, result)
        if proc.returncode not in (0, 1) or "Traceback" in err:
            result.error = err[-500:]
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], cwd=REPO, capture_output=True,
                       timeout=300, env={k: v for k, v in env.items() if k != "BROKER_DRY_RUN_FAULTS"})
    return result


def _measure(kind: Kind, case: Case, run_dir: Path, result: DryResult) -> None:
    states = dict(_query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state"))
    result.tasks = sum(states.values())
    result.done = states.get("done", 0)
    result.quarantined = states.get("quarantined", 0) + states.get("failed", 0)
    pending = states.get("pending", 0)
    budget_stop = bool(_events(run_dir, "budget.stop"))
    result.left_budget = pending if budget_stop else 0
    result.lost = result.tasks - result.done - result.quarantined - result.left_budget
    result.duplicated = _duplicated(run_dir)
    result.fired = _fired(kind, run_dir, result)
    result.orphaned = _orphaned(run_dir, kind.kill_moto)
    result.unconfirmed = sum(len(e["instance_ids"]) for e in _events(run_dir, "run.instances_unconfirmed"))
    if case.goal[0] == "--budget":
        result.budget = float(case.goal[1])
        spends = [e["committed_usd"] for e in _events(run_dir, "instance.terminated")]
        spends += [e["committed_usd"] for e in _events(run_dir, "budget.stop")]
        from broker.shells.journal import Journal

        with Journal.open(run_dir, readonly=True) as j:
            spends.append(j.committed_usd())
        result.max_committed = max(spends, default=0.0)
        result.over_budget = int(result.max_committed > result.budget + 1e-9)
    if kind.outage:
        result.utilisation = _outage_utilisation(run_dir)


def summarise(results: list[DryResult]) -> dict:
    kinds: dict[str, dict] = {}
    for r in results:
        k = kinds.setdefault(r.kind, {"runs": 0, "fired": 0, "lost": 0, "duplicated": 0, "orphaned": 0,
                                      "over_budget": 0, "errors": 0, "unconfirmed": 0, "seeds_not_fired": [],
                                      "wall_s": 0.0})
        k["runs"] += 1
        k["fired"] += int(r.fired)
        if not r.fired:
            k["seeds_not_fired"].append(r.seed)
        for col in ("lost", "duplicated", "orphaned", "over_budget", "unconfirmed"):
            k[col] += getattr(r, col)
        k["errors"] += int(bool(r.error))
        k["wall_s"] += r.wall_s
        if r.utilisation is not None:
            k.setdefault("utilisation", []).append(round(r.utilisation, 4))
    for k in kinds.values():
        k["wall_s"] = round(k["wall_s"], 1)
        if "utilisation" in k:
            u = k["utilisation"]
            k["private_utilisation_during_outage"] = {"mean": round(sum(u) / len(u), 4), "min": min(u),
                                                      "max": max(u), "runs": len(u)}
            del k["utilisation"]
    return kinds


# -- report ---------------------------------------------------------------------------------


def _print_sim(args) -> int:
    started = time.monotonic()
    sims = run_sim(args.sim_seeds, args.parallel)
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
          f"over budget {len(over)} of {len(budgets)} budget runs (max committed / budget: {worst:.3f})")
    for s in sims:
        if s["lost"] or s["duplicated"] or s["orphaned"] or s in over:
            print(f"  DAMAGE seed {s['seed']}: {s}")
    return total["lost"] + total["duplicated"] + total["orphaned"] + len(over)


def _print_kinds(kinds: dict, results: list[DryResult], wall: float, workdir: Path, seeds: int) -> int:
    print(f"\n(b) dry runs per fault kind: {seeds} seed(s) each, time scale {SCALE:g}, tick 60 s "
          f"(eventual: 20 s at scale 5), {wall:.0f} s wall (run directories in {workdir})")
    print(f"  {'kind':27s} {'runs':>4s} {'fired':>5s} {'lost':>4s} {'dup':>4s} {'orphan':>6s} {'over$':>5s} "
          f"{'errors':>6s} {'exit1':>5s}")
    damage = 0
    for name, k in kinds.items():
        print(f"  {name:27s} {k['runs']:4d} {k['fired']:5d} {k['lost']:4d} {k['duplicated']:4d} {k['orphaned']:6d} "
              f"{k['over_budget']:5d} {k['errors']:6d} {k['unconfirmed']:5d}")
        if "private_utilisation_during_outage" in k:
            u = k["private_utilisation_during_outage"]
            print(f"      private node's utilisation during the {OUTAGE_S / 60:g}-min outage: mean {u['mean']:.1%} "
                  f"(min {u['min']:.1%}, max {u['max']:.1%}, {u['runs']} runs)")
        if k["seeds_not_fired"]:
            print(f"      NOT FIRED in seeds {k['seeds_not_fired']}")
        damage += (k["lost"] + k["duplicated"] + k["orphaned"] + k["over_budget"] + k["errors"]
                   + k["runs"] - k["fired"])
    for r in results:
        if r.lost or r.duplicated or r.orphaned or r.over_budget or r.error:
            print(f"  DAMAGE {r.kind} seed {r.seed}: exit {r.returncode}, done {r.done}/{r.tasks}, lost {r.lost}, "
                  f"duplicated {r.duplicated}, orphaned {r.orphaned}, over budget {r.over_budget} "
                  f"(max ${r.max_committed:.3f} of {r.budget}) {r.error}")
    print("  exit1: instances the run named as not confirmed terminated (it exits 1 and says `broker down`)")
    return damage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="dry runs per fault kind (--quick: 1)")
    parser.add_argument("--sim-seeds", type=int, default=60, help="simulated runs, one per seed (0: none)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--kinds", default="all", help="all, required, or names: " + ", ".join(k.name for k in KINDS))
    parser.add_argument("--quick", action="store_true", help="one seed per kind, no simulator: a few minutes")
    parser.add_argument("--json", action="store_true", help='one JSON object: {"kinds": {KIND: {...}}}')
    parser.add_argument("--workdir", help="where the dry runs' directories go (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.sim_seeds = 1, 0
    names = {"all": [k.name for k in KINDS], "required": REQUIRED}.get(args.kinds, args.kinds.split(","))
    chosen = [k for k in KINDS if k.name in names]
    out = sys.stderr if args.json else sys.stdout
    started = time.monotonic()
    damage = 0
    with contextlib.redirect_stdout(out):
        print(f"$ python3 bench/bench_faults.py {' '.join(argv if argv is not None else sys.argv[1:])}")
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"load {os.getloadavg()[0]:.1f}")
        if args.sim_seeds > 0:
            damage += _print_sim(args)
        kinds: dict = {}
        if chosen and args.seeds > 0:
            workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-faults-"))
            jobs = [(k, seed) for seed in range(args.seeds) for k in chosen]
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=args.parallel) as pool:
                results = list(pool.map(lambda job: run_dry(job[0], job[1], workdir), jobs))
            kinds = summarise(results)
            damage += _print_kinds(kinds, results, time.monotonic() - t0, workdir, args.seeds)
        print(f"\ndamage in all (lost + duplicated + orphaned + over budget + errors + faults not fired): {damage}; "
              f"{time.monotonic() - started:.0f} s wall")
    if args.json:
        print(json.dumps({"kinds": kinds, "damage": damage}, sort_keys=True))
    return 0 if damage == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
