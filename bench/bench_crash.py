"""Kill the dry-run daemon (SIGKILL) at many points, resume it each time, and count damage.

    python3 bench/bench_crash.py [--points 50] [--parallel 2] [--workdir DIR]

How: a tiny bag (10 tasks of 0.2-0.5 s; every other chain a faulty bag of 8 tasks with a
transient failure, a poison task and one that always times out, whose agents are also
SIGTERMed once while tasks run) on one local slot plus up to three 2-slot EC2
types served by the run's moto server, at time scale 60 with a 10 s tick. Kill points are
exact: ``BROKER_CRASH_AT=<point>:<n>`` makes the daemon SIGKILL itself right after the
n-th occurrence of a journal write, an event or an EC2 call (``broker/shells/crashpoints.py``);
``batch:<n>`` lands inside the turn's journal group (before its one commit: the whole turn's
results and starts are lost, unacknowledged and unsent), ``group:<n>`` right after that commit
(results durable but not acknowledged, attempts durable but not sent to their agents).
A *chain* is one run directory: ``broker run`` with the first point, then the same command
(a resume) with the next point, and so on through a point in each phase (sampling,
launching, dispatching, releasing), then one last resume without a kill point. A point that
is not reached (the run finished first) ends the chain and is not counted as tried.

After each chain, from the journal, the moto server (kept up for the check by
``BROKER_DRY_RUN_KEEP_MOTO``) and the process table:

- lost: tasks not done (in a faulty-bag chain, other than the poison and timed-out tasks,
  which must end quarantined: ``wrongly quarantined`` counts any that do not, or any other);
- hung: a ``broker run`` that does not end (its chain errs on the timeout);
- duplicates: tasks with more than one ``task.done`` event in the journal, plus attempts
  started after the task's counted attempt had already ended (a re-run of a done task);
- orphans: instances of the run's tag still alive in moto, journal rows not terminated,
  agent processes of the run still alive, intents left open;
- spend: committed spend after the last resume is at least what it was at every kill;
- re-attached attempts: attempts a resumed daemon found still running (or finished and not
  yet acknowledged) on an agent and kept.

Prints one line per chain, then: kill points tried, tasks lost, duplicates, orphans (all
must be 0 except the first), spend decreases, attempts re-attached, and the wall time per
kill point. ``tests/test_resume_crash.py`` runs the same loop and asserts the zeros.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the broker and the tests' helpers

from broker.cli.verdict import late_but_done  # noqa: E402

INVENTORY = """\
private:
  - name: local
    local: true
    slots: 1
    speed: 1.0
aws:
  region: us-east-1
  billing: hourly
  types:
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 0.085
      limit: 3
      boot: 3s
"""

BAG = """\
command: "python3 -c 'import time; time.sleep({t}); print({k})'"
sweep:
  t: [0.2, 0.3, 0.4, 0.5, 0.3]
  k: [1, 2]
timeout: 30s
retries: 2
"""

# Every other chain runs this bag instead: a task that fails once (then succeeds), a poison
# task (exit 3 every time, everywhere), a task that always times out, and slower ones that an
# agent SIGTERM catches running. The poison and timed-out tasks must end quarantined, every
# other task done once.
FAULTY_BAG = """\
command: "python3 -c 'import os, sys, time; k = {k}; m = os.path.join(sys.argv[1], str(k)); once = k == 2 and not os.path.exists(m); open(m, chr(97)).close(); time.sleep(60 if k == 4 else 0.5 + 0.1 * k); sys.exit(3 if k == 3 or once else 0)' MARKS"
sweep:
  k: [1, 2, 3, 4, 5, 6, 7, 8]
timeout: 2s
retries: 2
"""
EXPECTED_QUARANTINED = {"t000003", "t000004"}  # the poison task and the one that times out

ARGS = ("--dry-run", "--yes", "--deadline", "2m", "--tick", "10s")

# Kill points by phase, in the order a run meets them. Chain k takes the k-th point of
# each phase (cycling), so every chain kills once per phase.
PHASES: dict[str, tuple[str, ...]] = {
    "sampling": (
        "record_sample_draws:1", "task_started:1", "group:3", "event:sample.done:1", "task_finished:1",
        "batch:1", "record_sample_draws:2", "batch:2", "event:sample.done:2", "task_finished:2",
        "batch:3", "task_started:2", "record_private_node:1", "event:run.start:1",
    ),
    "launching": (
        "intend:launch:1", "fleet.launch:1", "record_launch:1", "record_launch:2", "event:instance.launch:1",
        "set_release:1", "complete:1", "event:plan.solved:1", "record_plan:1", "event:instance.launch:2",
        "record_instance_state:1", "event:instance.ready:1", "fleet.launch:2",
    ),
    "dispatching": (
        "task_started:1", "group:4", "batch:2", "event:task.done:1", "task_finished:2", "group:9", "task_started:3",
        "batch:4",
        "event:task.done:2", "task_finished:1", "batch:1", "task_started:2", "event:task.done:3",
        "batch:3", "task_finished:3",
    ),
    "failing": (
        "event:task.failed:1", "group:6", "attempt_lost:1", "quarantine:1", "event:task.quarantined:1",
        "event:task.failed:2", "event:task.failed:3", "task_finished:4", "quarantine:2",
    ),
    "releasing": (
        "intend:terminate:1", "fleet.terminate:1", "event:instance.terminated:1", "fleet.terminate:2",
        "intend:terminate:2", "event:instance.terminated:2", "finish_run:1", "event:run.done:1",
        "fleet.terminate:3", "complete:2", "event:instance.release_scheduled:2", "intend:terminate:3",
        "event:instance.terminated:3",
    ),
}


@dataclass
class Chain:
    index: int
    run_dir: Path
    run_id: str = "?"
    kills: list[tuple[str, str]] = field(default_factory=list)  # (phase, point) that killed
    not_reached: list[tuple[str, str]] = field(default_factory=list)
    runs: int = 0
    wall_s: float = 0.0
    tasks: int = 0
    lost: int = 0
    duplicates: int = 0
    reruns: int = 0
    orphans_moto: int = 0
    orphans_journal: int = 0
    orphans_agents: int = 0
    open_intents: int = 0
    quarantined_wrongly: int = 0  # expected-quarantined tasks not quarantined, or others quarantined
    agent_sigterms: int = 0
    faulty: bool = False
    spend_at_kills: list[float] = field(default_factory=list)
    spend_final: float = 0.0
    reattached: int = 0
    final_rc: int | None = None
    error: str | None = None

    @property
    def orphans(self) -> int:
        return self.orphans_moto + self.orphans_journal + self.orphans_agents + self.open_intents

    @property
    def spend_decreases(self) -> int:
        return sum(1 for s in self.spend_at_kills if self.spend_final + 1e-9 < s)


def faulty(k: int) -> bool:
    """Odd chains run the faulty bag (and get their agents SIGTERMed once)."""
    return k % 2 == 1


def chain_points(k: int) -> list[tuple[str, str]]:
    return [(phase, points[k % len(points)]) for phase, points in PHASES.items()
            if phase != "failing" or faulty(k)]


_FORK: multiprocessing.context.ForkServerContext | None = None


def use_fork_server() -> None:
    """Run each ``broker run`` as a child forked from a warm server (modules imported, the
    EC2 model loaded) instead of a fresh ``python -m broker``: the same code and the same
    SIGKILL, without paying the imports again on every one of the ~70 runs (half of their
    CPU time). ``--no-fork`` goes back to plain subprocesses."""
    global _FORK
    if _FORK is None:
        for path in (str(REPO), str(REPO / "bench")):
            if path not in sys.path:
                sys.path.insert(0, path)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["crash_preload"])
        _FORK = ctx


def _forked_main(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the environment, cwd and output files of a real ``broker run``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    from broker.cli import main

    rc = 1
    try:
        rc = main(argv)
    except BaseException:  # os._exit below would swallow the traceback: a chain saw rc 1 and no output
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _sigterm_agents_once(run_dir: Path, done: "threading.Event", sent: list[int]) -> None:
    """Once attempts run, SIGTERM the run's agents (a private node rebooting): they cancel
    what they run and say so; the daemon must re-attach and run those attempts again."""
    while not done.wait(0.05):
        try:
            running = _query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'")[0][0]
        except Exception:  # noqa: BLE001 - no journal (or no table) yet
            continue
        if running >= 2:
            for pid in agent_pids(run_dir):
                try:
                    os.kill(pid, signal.SIGTERM)
                    sent.append(pid)
                except ProcessLookupError:
                    pass
            return


def _broker(run_dir: Path, files: Path, crash: str | None, timeout_s: float = 180.0,
            sigterm_agents: list[int] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BROKER_DRY_RUN_KEEP_MOTO": "1"}
    env.pop("BROKER_CRASH_AT", None)
    if crash is not None:
        env["BROKER_CRASH_AT"] = crash
    argv = ["run", *ARGS, "--inventory", str(files / "inv.yaml"), str(files / "bag.yaml"), "--run-dir", str(run_dir)]
    if _FORK is None:
        if sigterm_agents is not None:
            raise ValueError("SIGTERMing agents needs the fork server (use_fork_server)")
        return subprocess.run([sys.executable, "-m", "broker", *argv], cwd=REPO, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    n = len(list(files.glob("out.*")))
    out, err = files / f"out.{n}", files / f"err.{n}"
    child = _FORK.Process(target=_forked_main, args=(argv, env, str(out), str(err)))
    child.start()
    done = threading.Event()
    if sigterm_agents is not None:
        threading.Thread(target=_sigterm_agents_once, args=(run_dir, done, sigterm_agents), daemon=True).start()
    child.join(timeout_s)
    done.set()
    if child.exitcode is None:
        child.kill()
        child.join()
        raise subprocess.TimeoutExpired(argv, timeout_s)
    return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())


def _query(run_dir: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _committed(run_dir: Path) -> float:
    from broker.shells.journal import Journal

    if not (run_dir / "journal.sqlite").exists():
        return 0.0
    with Journal.open(run_dir, readonly=True) as j:
        if j.run() is None:
            return 0.0
        latest = j.latest_time_s()
        return j.committed_usd(latest) if latest is not None else 0.0


def agent_pids(run_dir: Path) -> list[int]:
    """The run's agent processes still alive (the tests' own helper, shared)."""
    from tests.test_dryrun import agent_pids as pids_of

    return pids_of(run_dir)


def _alive_in_moto(run_dir: Path, run_id: str) -> int:
    from broker.shells.moto_world import DEFAULT_REGION, fake_aws_environment, find_moto_server, server_client

    server = find_moto_server(run_dir)
    if server is None:
        raise RuntimeError(f"{run_dir}: the moto server is gone, so its instances cannot be checked")
    with fake_aws_environment(DEFAULT_REGION):
        ec2 = server_client(server, DEFAULT_REGION)
        pages = ec2.describe_instances(Filters=[{"Name": "tag:broker:run", "Values": [run_id]}])
    states = [i["State"]["Name"] for r in pages["Reservations"] for i in r["Instances"]]
    return sum(1 for s in states if s not in ("terminated", "shutting-down"))


def run_chain(index: int, workdir: Path) -> Chain:
    files = workdir / f"chain{index:02d}"
    files.mkdir(parents=True, exist_ok=True)
    (files / "inv.yaml").write_text(INVENTORY)
    marks = files / "marks"
    marks.mkdir(exist_ok=True)
    (files / "bag.yaml").write_text(FAULTY_BAG.replace("MARKS", str(marks)) if faulty(index) else BAG)
    chain = Chain(index, files / "run", faulty=faulty(index))
    started = time.monotonic()
    try:
        finished = False
        for phase, point in chain_points(index):
            sigterms: list[int] | None = [] if chain.faulty and phase == "dispatching" and _FORK is not None else None
            done = _broker(chain.run_dir, files, point, sigterm_agents=sigterms)
            chain.agent_sigterms += len(sigterms or ())
            chain.runs += 1
            if done.returncode == -signal.SIGKILL:
                chain.kills.append((phase, point))
                chain.spend_at_kills.append(_committed(chain.run_dir))
                continue
            if done.returncode not in (0, 1):
                raise RuntimeError(f"broker run with {point} exited {done.returncode}:\n{done.stderr[-3000:]}")
            chain.not_reached.append((phase, point))
            chain.final_rc = done.returncode
            finished = True
            break
        if not finished:
            done = _broker(chain.run_dir, files, None, timeout_s=240.0)
            chain.runs += 1
            chain.final_rc = done.returncode
            if done.returncode == 2 and "already ended (finished)" in done.stderr:
                # The last kill came after the journal recorded the run as finished: there is
                # nothing left to resume, and `broker run` says so (check() still counts).
                chain.final_rc = 0
            elif done.returncode != 0 and not (done.returncode == 1 and (chain.faulty or late_but_done(done.stdout))):
                # a faulty bag ends with failures (exit 1); so does a deadline missed with every task
                # done (issue 16: the truth): a chain of kills and resumes keeps the run clock going
                raise RuntimeError(f"the last resume exited {done.returncode}:\n{done.stderr[-3000:]}")
        chain.wall_s = time.monotonic() - started
        check(chain)
    except Exception as exc:  # noqa: BLE001 - reported per chain, and fails the test
        chain.error = f"{type(exc).__name__}: {exc}"
        chain.wall_s = time.monotonic() - started
    finally:
        down = subprocess.run([sys.executable, "-m", "broker", "down", str(chain.run_dir)], cwd=REPO,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        if down.returncode not in (0, 2) and chain.error is None:
            chain.error = f"broker down exited {down.returncode}: {down.stdout}{down.stderr}"
    return chain


def check(chain: Chain) -> None:
    run_dir = chain.run_dir
    chain.run_id = _query(run_dir, "SELECT id FROM run")[0][0]
    tasks = dict(_query(run_dir, "SELECT id, state FROM tasks"))
    chain.tasks = len(tasks)
    done_events: dict[str, int] = {}
    for (fields,) in _query(run_dir, "SELECT fields FROM events WHERE name = 'task.done'"):
        task = json.loads(fields)["task"]
        done_events[task] = done_events.get(task, 0) + 1
    expected = EXPECTED_QUARANTINED if chain.faulty else set()
    chain.lost = sum(1 for t, state in tasks.items() if t not in expected and (state != "done" or t not in done_events))
    chain.quarantined_wrongly = (sum(1 for t in expected if tasks.get(t) != "quarantined")
                                 + sum(1 for t, state in tasks.items() if state == "quarantined" and t not in expected))
    chain.duplicates = sum(1 for n in done_events.values() if n > 1)
    chain.reruns = _query(run_dir, """
        SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
        JOIN attempts d ON d.task_id = t.id AND d.attempt = t.done_attempt
        WHERE a.attempt <> d.attempt AND a.started_at IS NOT NULL AND a.started_at > d.ended_at""")[0][0]
    chain.orphans_journal = _query(run_dir, "SELECT count(*) FROM instances WHERE state <> 'terminated'")[0][0]
    chain.open_intents = _query(run_dir, "SELECT count(*) FROM actions WHERE state = 'intended'")[0][0]
    chain.orphans_moto = _alive_in_moto(run_dir, chain.run_id)
    deadline = time.monotonic() + 5.0
    while agent_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    chain.orphans_agents = len(agent_pids(run_dir))
    chain.spend_final = _committed(run_dir)
    chain.reattached = sum(json.loads(f).get("attempts", 0)
                           for (f,) in _query(run_dir, "SELECT fields FROM events WHERE name = 'agent.reattached'"))


@dataclass
class Summary:
    chains: list[Chain]
    wall_s: float

    @property
    def kills(self) -> int:
        return sum(len(c.kills) for c in self.chains)

    def total(self, attr: str) -> int:
        return sum(getattr(c, attr) for c in self.chains)

    def by_phase(self) -> dict[str, int]:
        counts = {phase: 0 for phase in PHASES}
        for c in self.chains:
            for phase, _ in c.kills:
                counts[phase] += 1
        return counts


def crash_loop(points: int, workdir: Path, parallel: int = 2, on_chain=None) -> Summary:
    """Run chains until at least ``points`` kill points were tried."""
    chains: list[Chain] = []
    started = time.monotonic()
    index = 0
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        while sum(len(c.kills) for c in chains) < points:
            missing = points - sum(len(c.kills) for c in chains)
            batch = max(1, min(parallel, -(-missing // len(PHASES))))
            for chain in pool.map(lambda k: run_chain(k, workdir), range(index, index + batch)):
                chains.append(chain)
                if on_chain is not None:
                    on_chain(chain)
            index += batch
            if any(c.error for c in chains) or index > 4 * points:
                break
    return Summary(chains, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=50, help="kill points to try (at least)")
    parser.add_argument("--parallel", type=int, default=2, help="chains at once")
    parser.add_argument("--workdir", help="where the run directories go (default: a temporary directory)")
    parser.add_argument("--no-fork", action="store_true",
                        help="start every broker run as a fresh `python -m broker` (slower; same results)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if not args.no_fork:
        use_fork_server()
    print(f"$ python3 bench/bench_crash.py --points {args.points} --parallel {args.parallel}"
          + (" --no-fork" if args.no_fork else ""))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")

    def show(c: Chain) -> None:
        kills = ", ".join(p for _, p in c.kills)
        print(f"chain {c.index:2d}: {len(c.kills)} kills [{kills}]"
              + (f", not reached: {c.not_reached[0][1]}" if c.not_reached else "")
              + (f" (faulty bag, {c.agent_sigterms} agent processes SIGTERMed)" if c.faulty else "")
              + f"; lost {c.lost}, duplicates {c.duplicates + c.reruns}, orphans {c.orphans}, "
              f"wrongly quarantined {c.quarantined_wrongly}, "
              f"re-attached {c.reattached}, spend ${c.spend_final:.3f}, {c.runs} runs in {c.wall_s:.1f} s"
              + (f"\n  ERROR {c.error}" if c.error else ""), flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        summary = crash_loop(args.points, workdir, args.parallel, on_chain=show)
    s = summary
    print()
    print(f"kill points tried:    {s.kills} ({', '.join(f'{k} {v}' for k, v in s.by_phase().items())}) "
          f"in {len(s.chains)} chains, {s.total('runs')} broker runs")
    faulty_chains = [c for c in s.chains if c.faulty]
    print(f"faulty bags:          {len(faulty_chains)} chains (a transient failure, a poison task, a timed-out "
          f"task), {sum(len(c.kills) for c in faulty_chains)} of the kill points, "
          f"agents SIGTERMed mid-run in {sum(1 for c in faulty_chains if c.agent_sigterms)} of them "
          f"({s.total('agent_sigterms')} agent processes)")
    print(f"tasks lost:           {s.total('lost')} of {s.total('tasks')}")
    print(f"wrongly quarantined:  {s.total('quarantined_wrongly')} (the poison and timed-out tasks must be, no other)")
    print(f"hung:                 {sum(1 for c in s.chains if c.error and 'Timeout' in c.error)} (a run that never ended)")
    print(f"duplicates:           {s.total('duplicates') + s.total('reruns')} "
          f"({s.total('duplicates')} recorded twice, {s.total('reruns')} re-run after done)")
    print(f"orphans:              {sum(c.orphans for c in s.chains)} (instances alive in moto "
          f"{s.total('orphans_moto')}, journal rows not terminated {s.total('orphans_journal')}, agents "
          f"{s.total('orphans_agents')}, intents open {s.total('open_intents')})")
    print(f"spend decreases:      {s.total('spend_decreases')} (committed spend after resume below a kill's)")
    print(f"attempts re-attached: {s.total('reattached')}")
    print(f"errors:               {sum(1 for c in s.chains if c.error)}")
    print(f"time per kill point:  {s.wall_s / max(1, s.kills):.2f} s wall ({s.wall_s:.0f} s in all, "
          f"{args.parallel} chains at once, {'fresh processes' if args.no_fork else 'forked from a warm server'})")
    bad = (s.total("lost") + s.total("duplicates") + s.total("reruns") + sum(c.orphans for c in s.chains)
           + s.total("quarantined_wrongly"))
    return 1 if bad or any(c.error for c in s.chains) or s.kills < args.points else 0


if __name__ == "__main__":
    sys.exit(main())
