"""The private node's utilisation while EC2 is out for 10 minutes of run time.

    python3 bench/bench_outage.py [--outage 10m] [--scale 20] [--repo DIR] [--json]

One real dry run (``broker run --dry-run``: moto server process, local agents, tasks that
really run): a private node with 2 slots and one rentable c5.large (2 slots, limit 1), a bag
of 160 tasks of 1 s of wall time each under a deadline that needs the instance. Once the
instance is ready, the run's moto server is frozen (SIGSTOP) for ``--outage`` of run time
and thawed (SIGCONT): every EC2 call made meanwhile hangs until then, as against an API
that stopped answering. The run then goes on to the end.

Printed: the private node's utilisation during the outage, from the journal: for each of
its attempts, the time it really ran (from its start, as journaled, for its runtime as the
agent measured it, in run time) inside the outage window, over slots x window. A loop that
waits on EC2 leaves the slots idle once their tasks end; one that does not keeps them full.
Also: the same figure from the private node's first attempt to the outage (the loop's own
overhead, for reference), the EC2 calls in flight during the outage (journal intents) and
how the run ended (exit 1: the deadline was missed).

``--repo`` runs another checkout's code (e.g. one at the commit before EC2 calls left the
loop) with the same inputs: the figure before and after a change.
:func:`private_utilisation` computes the figure for any run directory and window, e.g. from
bench/bench_faults.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

INVENTORY = """\
private:
  - name: local
    local: true
    slots: 2
    speed: 1.0
aws:
  region: us-east-1
  billing: hourly
  types:
    - name: c5.large
      slots: 2
      speed: 1.0
      price: 0.085
      limit: 1
      boot: 3s
"""

BAG = """\
command: "python3 -c 'import time; time.sleep(1.0); print({k})'"
sweep:
  k: [K]
timeout: 60s
retries: 2
"""

TASKS = 160


def private_utilisation(run_dir: Path, start_s: float, end_s: float, node: str = "local",
                        slots: int | None = None) -> float:
    """Busy slot-time of ``node`` inside [start_s, end_s] (journal times, as stored) over
    slots x (end_s - start_s). An attempt is busy from its journaled start for its runtime
    (the agent's wall seconds times the run's time scale), or to its journaled end when it
    has no runtime (cancelled, lost)."""
    with sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True) as db:
        scale = float(json.loads(db.execute("SELECT options FROM run").fetchone()[0]).get("time_scale", 1.0))
        if slots is None:
            row = db.execute("SELECT slots FROM private_nodes WHERE name = ?", (node,)).fetchone()
            slots = int(row[0]) if row else 1
        busy = 0.0
        for started, ended, runtime in db.execute(
                "SELECT started_at, ended_at, runtime_s FROM attempts WHERE node = ? AND started_at IS NOT NULL",
                (node,)):
            end = started + runtime * scale if runtime is not None else (ended if ended is not None else end_s)
            busy += max(0.0, min(end, end_s) - max(started, start_s))
    return busy / (slots * (end_s - start_s))


def _journal(run_dir: Path, sql: str, args: tuple = ()) -> list[tuple]:
    with sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True) as db:
        return db.execute(sql, args).fetchall()


def _journal_now(run_dir: Path) -> float:
    """The journal's time now (``epoch_anchor + run time``), as ``broker status`` reads it."""
    from broker.shells.journal import Journal
    from broker.shells.metrics import run_now_s

    with Journal.open(run_dir, readonly=True) as j:
        return run_now_s(j.run(), time.time())


def _wait(proc: subprocess.Popen, what: str, ready, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before {what}: exit {proc.returncode}")
        try:
            if ready():
                return
        except (sqlite3.Error, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def run_once(repo: Path, outage_s: float, scale: float, workdir: Path) -> dict:
    inv, bag, run_dir = workdir / "inv.yaml", workdir / "bag.yaml", workdir / "run"
    inv.write_text(INVENTORY)
    bag.write_text(BAG.replace("[K]", json.dumps(list(range(TASKS)))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONPATH"] = str(repo)
    # Its output goes to files: a pipe nobody reads during the outage fills up and stalls the
    # daemon's own writes (a first version of this bench measured that, not EC2).
    out, err = open(workdir / "stdout.txt", "w"), open(workdir / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "broker", "run", "--dry-run", "--yes", "--deadline", "25m",
                             "--time-scale", f"{scale:g}", "--inventory", str(inv), str(bag), "--run-dir",
                             str(run_dir)], cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    try:
        _wait(proc, "an instance ready",
              lambda: _journal(run_dir, "SELECT count(*) FROM instances WHERE ready_at IS NOT NULL")[0][0] > 0)
        pid = json.loads((run_dir / "moto.json").read_text())["pid"]
        start = _journal_now(run_dir)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(outage_s / scale)
        finally:
            end = _journal_now(run_dir)
            os.kill(pid, signal.SIGCONT)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
    calls = _journal(run_dir, "SELECT kind, count(*) FROM actions WHERE created_at < ? AND "
                              "coalesce(completed_at, 1e300) > ? GROUP BY kind", (end, start))
    done = _journal(run_dir, "SELECT count(*) FROM tasks WHERE state = 'done'")[0][0]
    first = _journal(run_dir, "SELECT min(started_at) FROM attempts WHERE node = 'local'")[0][0]
    return {"repo": str(repo), "outage_run_s": round(end - start, 1), "time_scale": scale,
            "private_utilisation": round(private_utilisation(run_dir, start, end), 3),
            "private_utilisation_before": round(private_utilisation(run_dir, first, start), 3),
            "ec2_calls_in_outage": dict(calls), "tasks_done": done, "tasks": TASKS, "exit": proc.returncode}


def main(argv: list[str] | None = None) -> int:
    from broker.core.units import parse_duration

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outage", default="10m", help="how long EC2 is out, in run time (default 10m)")
    p.add_argument("--scale", type=float, default=20.0, help="dry-run time scale (default 20)")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the run here (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    outage_s = parse_duration(args.outage)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run_once(args.repo.resolve(), outage_s, args.scale, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-outage-") as tmp:
            result = run_once(args.repo.resolve(), outage_s, args.scale, Path(tmp))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"EC2 out for {result['outage_run_s']:.0f} s of run time (moto frozen), time scale {args.scale:g}, "
              f"code from {result['repo']}")
        print(f"  private node utilisation during the outage: {100 * result['private_utilisation']:.1f}% "
              f"(before it: {100 * result['private_utilisation_before']:.1f}%)")
        print(f"  EC2 calls in flight during it: {result['ec2_calls_in_outage'] or 'none'}")
        print(f"  tasks done: {result['tasks_done']} of {result['tasks']}, exit status {result['exit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
