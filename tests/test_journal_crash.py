"""Crash safety and concurrent reading, with real processes.

- A writer process is SIGKILLed at random points, several times on the same journal; after
  each kill the journal re-opens sound (integrity check), shows no partial transaction, keeps
  every write the writer saw committed, and ``pending_intents()`` lists exactly the intents
  left without an outcome (give or take the one call in flight when the kill landed).
- A reader process (this one) polls a journal that another process is writing: every
  snapshot is consistent, and progress never goes backwards.
"""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from broker.shells.journal import JOURNAL_FILE, Journal

REPO = Path(__file__).resolve().parents[1]
BATCH = 200  # tasks added per transaction by the crash writer

CRASH_WRITER = f"""
import random, sys
from broker.core.model import Task
from broker.shells.journal import AttemptResult, Journal

run_dir, cycle, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
journal = Journal.open(run_dir)
if journal.run() is None:
    journal.create_run("crash", goal_kind="deadline", deadline_s=3600, retries=1)
open_tasks = [p.id for p in journal.pending_tasks()]
i = 0
while True:
    i += 1
    key = f"{{cycle}}-{{i}}"
    seq = journal.intend("launch", {{"key": key}}, "crash_test")
    print("I", seq, key, flush=True)
    r = rng.random()
    if r < 0.45:
        journal.complete(seq, {{"key": key}})
        print("C", seq, flush=True)
    elif r < 0.6:
        journal.fail(seq, "refused")
        print("C", seq, flush=True)
    if i % 4 == 0:
        batch = [Task(f"{{key}}-{{k}}", "true") for k in range({BATCH})]
        journal.add_tasks(batch)
        open_tasks += [t.id for t in batch]
        print("B", key, flush=True)
    for _ in range(3):
        if open_tasks:
            task_id = open_tasks.pop(rng.randrange(len(open_tasks)))
            attempt = int(cycle) + 1  # a fresh attempt number per writer
            journal.task_started(task_id, attempt, "n")
            ok = rng.random() < 0.8
            journal.task_finished(task_id, attempt, AttemptResult(0 if ok else 1, 1.0))
"""

READ_WRITER = """
import sys
from broker.core.model import Task
from broker.core.billing import Billing
from broker.shells.journal import AttemptResult, Journal

run_dir, n = sys.argv[1], int(sys.argv[2])
journal = Journal.open(run_dir)
journal.create_run("rw", goal_kind="budget", budget_usd=10.0, retries=0, at_s=0.0)
journal.add_tasks(Task(f"t{k:05d}", "true") for k in range(n))
print("ready", flush=True)
for k in range(n):
    journal.task_started(f"t{k:05d}", 1, "node-a", at_s=k)
    with journal.batch():  # as the daemon does: the result and the ledger's verdict together
        journal.task_finished(f"t{k:05d}", 1, AttemptResult(0 if k % 10 else 1, 1.0), at_s=k + 0.5)
        if k % 10 == 0:  # retries 0: the ledger gives the task up
            journal.quarantine(f"t{k:05d}", "failed 1 times (retries: 0)")
    if k % 100 == 0:
        journal.record_launch(f"i-{k}", "c5", launched_at_s=k, price_per_hour=0.1, billing=Billing.hourly())
journal.finish_run("finished", at_s=n)
"""


def spawn(script, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def consistent_snapshot_problems(path):
    """Cross-table facts every committed transaction preserves, read in one snapshot."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        db.execute("BEGIN")
        done = db.execute("SELECT count(*) FROM tasks WHERE state = 'done'").fetchone()[0]
        ok_tasks = db.execute("SELECT count(DISTINCT task_id) FROM attempts WHERE outcome = 'ok'").fetchone()[0]
        running = db.execute("SELECT count(*) FROM tasks WHERE state IN ('running', 'sampling')").fetchone()[0]
        running_attempts = db.execute(
            "SELECT count(DISTINCT task_id) FROM attempts WHERE outcome = 'running'").fetchone()[0]
        db.execute("COMMIT")
    finally:
        db.close()
    problems = []
    if done != ok_tasks:
        problems.append(f"{done} tasks done but {ok_tasks} with a successful attempt")
    if running != running_attempts:
        problems.append(f"{running} tasks running but {running_attempts} with a running attempt")
    return problems


def test_sigkill_at_random_points_leaves_a_consistent_journal(tmp_path):
    rng = random.Random(20261122)
    run_dir = tmp_path / "run"
    known_actions: dict[int, str] = {}  # every intent the writers reported, across cycles
    closed: set[int] = set()
    batches: set[str] = set()
    for cycle in range(6):
        child = spawn(CRASH_WRITER, run_dir, cycle, rng.randrange(1 << 30))
        lines = []
        wanted = rng.randint(3, 150)
        while len(lines) < wanted:
            line = child.stdout.readline()
            assert line, f"writer died early: {child.stderr.read()}"
            lines.append(line)
        time.sleep(rng.uniform(0.0, 0.01))
        child.send_signal(signal.SIGKILL)
        # the rest through the same buffered reader: communicate() reads the pipe's file
        # descriptor directly, and would drop the lines readline() had already buffered
        rest = child.stdout.read()
        child.wait(timeout=30)
        child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        lines += rest.splitlines(keepends=True)

        reported_intents = {}
        for line in lines:
            if not line.endswith("\n"):
                continue  # cut by the kill
            tag, *fields = line.split()
            if tag == "I":
                reported_intents[int(fields[0])] = fields[1]
            elif tag == "C":
                closed.add(int(fields[0]))
            elif tag == "B":
                batches.add(fields[0])
        known_actions.update(reported_intents)
        last_reported = max(reported_intents)

        journal = Journal.open(run_dir)  # what a resume does
        assert journal.integrity_problems() == []
        assert consistent_snapshot_problems(run_dir / JOURNAL_FILE) == []

        pending = {intent.seq: intent.payload["key"] for intent in journal.pending_intents()}
        # an outcome the writer saw committed is never lost
        assert not closed & pending.keys()
        # every intent reported and not closed is pending, except the one whose outcome
        # committed just before the kill could print it
        assert (set(known_actions) - closed) - pending.keys() <= {last_reported}
        # every pending intent was reported, except one committed but not yet printed
        unreported = pending.keys() - known_actions.keys()
        assert unreported <= {last_reported + 1}
        for seq, key in pending.items():
            assert known_actions.get(seq, key) == key
        # that one is known from now on (the next cycles must not count it as unreported)
        known_actions.update({seq: pending[seq] for seq in unreported})
        # the journal is now the truth about the action cut by the kill
        closed |= set(known_actions) - pending.keys()
        all_actions = journal._db.execute("SELECT count(*) FROM actions").fetchone()[0]
        assert all_actions >= len(known_actions)

        # task batches are all-or-nothing, and every reported batch is there in full
        n_tasks = journal.status(0.0)["tasks"]["total"]
        assert n_tasks % BATCH == 0
        for key in batches:
            count = journal._db.execute(
                "SELECT count(*) FROM tasks WHERE id LIKE ?", (f"{key}-%",)).fetchone()[0]
            assert count == BATCH
        status = journal.status(0.0)["tasks"]
        assert status["done"] + status["failed"] + status["left"] == status["total"]
        journal.close()
    assert len(closed) > 0 and len(known_actions) > len(closed)  # both cases were exercised


def test_a_reader_process_sees_consistent_counts_while_a_writer_writes(tmp_path):
    n = 1500
    run_dir = tmp_path / "run"
    writer = spawn(READ_WRITER, run_dir, n)
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        reader = Journal.open(run_dir, readonly=True)
        previous_done = 0
        intermediate = 0
        while True:
            finished = writer.poll() is not None
            status = reader.status(n + 10.0)
            tasks = status["tasks"]
            assert tasks["total"] == n
            assert tasks["done"] + tasks["failed"] + tasks["left"] == n
            assert tasks["running"] in (0, 1)
            assert tasks["done"] >= previous_done
            processed = tasks["done"] + tasks["failed"]  # task k fails when k % 10 == 0
            assert tasks["failed"] == (processed + 9) // 10
            previous_done = tasks["done"]
            assert consistent_snapshot_problems(run_dir / JOURNAL_FILE) == []
            if 0 < tasks["done"] < n - n // 10:
                intermediate += 1
            if finished:
                break
        assert writer.returncode == 0, writer.stderr.read()
        final = reader.overview(n + 10.0)
        assert final.run.state == "finished"
        assert final.status["tasks"] == {"total": n, "done": n - n // 10, "running": 0, "failed": n // 10, "left": 0}
        assert intermediate >= 3, "the reader never overlapped the writer"
        reader.close()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
