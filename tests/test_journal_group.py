"""Group commit (issue 20 part 3): one transaction per daemon turn, intents fsynced before
their call, what waits for durability run after the commit, a crash inside a group losing
the group and nothing an intent guards.

The daemon-level half (a result lost from an uncommitted group is run again and counted once;
a kill right after a group's commit, before its acks and submits) is at the end: a real dry
run killed at those points and resumed.
"""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from broker.core.model import Task
from broker.shells.journal import AttemptResult, Journal, JournalError

REPO = Path(__file__).resolve().parents[1]
OK = AttemptResult(exit_code=0, runtime_s=1.0)


def new_journal(tmp_path, n_tasks=6):
    journal = Journal.open(tmp_path / "run")
    journal.create_run("g1", goal_kind="deadline", deadline_s=3600.0, retries=1, at_s=0.0)
    journal.add_tasks(Task(f"t{i}", "true") for i in range(n_tasks))
    return journal


def done_seen_by(reader):
    return reader.status(0.0)["tasks"]["done"]


def traced(journal):
    statements = []
    journal._db.set_trace_callback(statements.append)
    return statements


def test_a_group_is_one_commit_and_readers_see_it_only_at_its_end(tmp_path):
    journal = new_journal(tmp_path)
    reader = Journal.open(tmp_path / "run", readonly=True)
    statements = traced(journal)
    with journal.group():
        with journal.batch():  # the daemon's results batch: a savepoint of the turn's group
            for i in range(3):
                journal.task_started(f"t{i}", 1, "n")
                journal.task_finished(f"t{i}", 1, OK)
        journal.record_event("task.done", '{"task":"t0"}')  # already encoded by the log
        journal.record_event("plan.solved", {"makespan_s": 5.0})
        with journal.batch():  # the starts batch
            journal.task_started("t3", 1, "n")
        assert done_seen_by(journal) == 3  # the group reads its own writes
        assert done_seen_by(reader) == 0  # nobody else does until it commits
    assert done_seen_by(reader) == 3
    assert [s for s in statements if s.startswith(("COMMIT", "BEGIN"))] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert [f for _, _, f in reader.events()] == [{"task": "t0"}, {"makespan_s": 5.0}]


def test_an_intent_in_a_group_is_fsynced_before_it_returns_with_everything_written_before_it(tmp_path):
    journal = new_journal(tmp_path)
    reader = Journal.open(tmp_path / "run", readonly=True)
    statements = traced(journal)
    with journal.group():
        journal.task_started("t0", 1, "n")
        journal.task_finished("t0", 1, OK)
        seq = journal.intend("launch", {"type": "c5.large", "count": 1}, "plan")
        # Durable now, before the EC2 call it guards: another connection sees it, and the
        # result written before it (one WAL: the intent's fsync covers the earlier frames).
        assert [a.seq for a in reader.pending_intents()] == [seq]
        assert done_seen_by(reader) == 1
        journal.task_started("t1", 1, "n")
        journal.task_finished("t1", 1, OK)
        assert done_seen_by(reader) == 1  # the rest of the group waits for its end
    assert done_seen_by(reader) == 2
    intent_insert = next(i for i, s in enumerate(statements) if s.startswith("INSERT INTO actions"))
    before, after = statements[:intent_insert], statements[intent_insert:]
    assert before[-2:] == ["PRAGMA synchronous = FULL", "BEGIN IMMEDIATE"], before[-4:]
    assert "COMMIT" in before  # the group so far, committed first
    full_commit = after.index("COMMIT")
    assert after[full_commit + 1] == "PRAGMA synchronous = NORMAL"  # back to NORMAL for results
    assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_a_result_commits_with_normal_sync_and_an_intent_outside_a_group_with_full(tmp_path):
    journal = new_journal(tmp_path)
    seen = []
    journal._db.set_trace_callback(
        lambda s: seen.append((s, journal._db.execute("PRAGMA synchronous").fetchone()[0]))
        if s == "COMMIT" else None)
    journal.task_finished("t0", 1, OK)
    journal.intend("terminate", {"instance_id": "i-1"}, "release")
    assert [level for _, level in seen] == [1, 2]  # NORMAL for the result, FULL for the intent


def test_after_commit_runs_after_the_commit_in_order_and_never_after_a_rollback(tmp_path):
    journal = new_journal(tmp_path)
    reader = Journal.open(tmp_path / "run", readonly=True)
    calls = []
    journal.after_commit(lambda: calls.append("now"))  # no group open: at once
    assert calls == ["now"]
    with journal.group():
        journal.task_finished("t0", 1, OK)
        journal.after_commit(lambda: calls.append(("ack", done_seen_by(reader))))
        with journal.batch():
            journal.task_started("t1", 1, "n")
        journal.after_commit(lambda: calls.append(("submit", done_seen_by(reader))))
        assert calls == ["now"]
    assert calls == ["now", ("ack", 1), ("submit", 1)]  # what they wait for was durable
    with pytest.raises(RuntimeError):
        with journal.group():
            journal.task_finished("t2", 1, OK)
            journal.after_commit(lambda: calls.append("never"))
            raise RuntimeError("a bug in the turn")
    assert calls == ["now", ("ack", 1), ("submit", 1)]
    assert done_seen_by(reader) == 1  # t2's result rolled back with its group


def test_an_after_commit_action_that_raises_keeps_the_others_and_its_error_is_raised_after(tmp_path):
    journal = new_journal(tmp_path)
    calls = []

    def broken_pipe():
        calls.append("agent a")
        raise BrokenPipeError("agent a is gone")

    with pytest.raises(BrokenPipeError):
        with journal.group():
            journal.task_finished("t0", 1, OK)
            journal.after_commit(broken_pipe)
            journal.after_commit(lambda: calls.append("agent b"))
    assert calls == ["agent a", "agent b"]
    assert done_seen_by(journal) == 1  # committed before the actions ran


def test_groups_do_not_nest_nor_open_inside_a_batch(tmp_path):
    journal = new_journal(tmp_path)
    with journal.group():
        with pytest.raises(JournalError):
            with journal.group():
                pass
    with journal.batch():
        with pytest.raises(JournalError):
            with journal.group():
                pass


def test_a_failing_batch_inside_a_group_rolls_back_alone(tmp_path):
    journal = new_journal(tmp_path)
    with journal.group():
        journal.task_finished("t0", 1, OK)
        with pytest.raises(RuntimeError):
            with journal.batch():
                journal.task_finished("t1", 1, OK)
                raise RuntimeError("daemon bug in one batch")
        journal.task_finished("t2", 1, OK)
    assert done_seen_by(journal) == 2
    assert journal._db.execute("SELECT state FROM tasks WHERE id = 't1'").fetchone()[0] == "pending"


class _CountingConnection:
    """The journal's connection, counting the statements that insert events."""

    def __init__(self, db):
        self._db, self.inserts = db, 0

    def __getattr__(self, name):
        return getattr(self._db, name)

    def execute(self, sql, *args):
        self.inserts += sql.startswith("INSERT INTO events")
        return self._db.execute(sql, *args)

    def executemany(self, sql, rows):
        self.inserts += sql.startswith("INSERT INTO events")
        return self._db.executemany(sql, rows)


def test_a_groups_events_go_in_one_statement_in_order_and_a_failed_batch_takes_its_own(tmp_path):
    """A turn's events (a task.done a result) are held and inserted in one statement before it
    commits, not one INSERT each (half their cost in the daemon's turn); the group reads them in
    their order; a batch that fails drops its own and keeps the others; an error out of the
    group drops them all; outside a group an event is stored at once."""
    journal = new_journal(tmp_path)
    reader = Journal.open(tmp_path / "run", readonly=True)
    journal._db = counting = _CountingConnection(journal._db)
    with journal.group():
        for i in range(50):
            journal.record_event("task.done", f'{{"task":"t{i}"}}')
        with pytest.raises(RuntimeError):
            with journal.batch():
                journal.record_event("task.done", '{"task":"lost"}')
                raise RuntimeError("daemon bug in one batch")
        journal.record_event("plan.solved", {"makespan_s": 5.0})
        assert [f.get("task", "plan") for _, _, f in journal.events()] == [f"t{i}" for i in range(50)] + ["plan"]
        journal.record_event("task.done", '{"task":"t50"}')
        with pytest.raises(RuntimeError):  # what was held before a batch outlives the batch's failure
            with journal.batch():
                journal.events()  # (a read inside it inserts what is held)
                raise RuntimeError("daemon bug after a read")
        assert reader.events() == []
    names = [f.get("task", "plan") for _, _, f in reader.events()]
    assert names == [f"t{i}" for i in range(50)] + ["plan", "t50"]
    assert counting.inserts == 3  # the 50 before the batch, the one before the read, the one before the last batch
    with pytest.raises(RuntimeError):
        with journal.group():
            journal.record_event("task.done", '{"task":"never"}')
            raise RuntimeError("daemon bug in a turn")
    journal.record_event("run.done", {"state": "finished"})
    assert [f.get("task", f.get("state")) for _, _, f in reader.events()][-2:] == ["t50", "finished"]


KILLED_IN_A_GROUP = """
import os, signal, sys
from broker.core.model import Task
from broker.shells.journal import AttemptResult, Journal

journal = Journal.open(sys.argv[1])
journal.create_run("k", goal_kind="deadline", deadline_s=3600, retries=1)
journal.add_tasks(Task(f"t{i}", "true") for i in range(9))
ok = AttemptResult(0, 1.0)
with journal.group():  # a turn that commits
    for i in range(3):
        journal.task_started(f"t{i}", 1, "n")
        journal.task_finished(f"t{i}", 1, ok)
with journal.group():  # a turn killed before its commit, after an intent
    for i in range(3, 5):
        journal.task_started(f"t{i}", 1, "n")
        journal.task_finished(f"t{i}", 1, ok)
    journal.intend("launch", {"type": "c5.large"}, "plan")
    for i in range(5, 9):
        journal.task_started(f"t{i}", 1, "n")
        journal.task_finished(f"t{i}", 1, ok)
    journal.record_event("task.done", {"task": "t8"})
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_inside_a_group_loses_the_group_after_its_last_intent_and_nothing_before(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", KILLED_IN_A_GROUP, str(run_dir)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert done.returncode == -9, done.stderr
    db = sqlite3.connect(run_dir / "journal.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    states = dict(db.execute("SELECT id, state FROM tasks"))
    assert [t for t, s in sorted(states.items()) if s == "done"] == ["t0", "t1", "t2", "t3", "t4"]
    assert all(states[f"t{i}"] == "pending" for i in range(5, 9))  # lost with the group: run again
    assert db.execute("SELECT count(*) FROM attempts WHERE task_id IN ('t5','t6','t7','t8')").fetchone()[0] == 0
    assert db.execute("SELECT kind, state FROM actions").fetchall() == [("launch", "intended")]
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("points", [("group:3", "batch:3"), ("batch:2", "group:6")])
def test_a_dry_run_killed_inside_and_right_after_groups_runs_every_task_once(tmp_path, points):
    """The daemon killed inside a turn's group (``batch``: its results and starts lost,
    never acknowledged nor sent) and right after a group's commit (``group``: results
    durable but not acknowledged, started attempts durable but never sent), then resumed:
    every task done, each counted once, none re-run after its counted attempt, no orphan."""
    sys.path.insert(0, str(REPO / "bench"))
    import bench_crash as bc

    bc.use_fork_server()
    saved = bc.PHASES
    bc.PHASES = {"sampling": (points[0],), "dispatching": (points[1],)}
    try:
        chain = bc.run_chain(0, tmp_path)
    finally:
        bc.PHASES = saved
    assert chain.error is None, chain.error
    assert [p for _, p in chain.kills] == list(points), (chain.kills, chain.not_reached)
    assert chain.tasks == 10 and chain.lost == 0
    assert chain.duplicates == 0 and chain.reruns == 0
    assert chain.orphans == 0


class _WatchingFleet:
    """An EC2 fleet that, when called (on the actuator's worker thread), looks at the journal
    from another connection, as a crash right then would leave it, then refuses the call."""

    def __init__(self, run_dir):
        self.run_dir, self.seen = run_dir, []

    def _look(self, call):
        reader = Journal.open(self.run_dir, readonly=True)
        try:
            self.seen.append((call, [(a.kind, a.payload) for a in reader.pending_intents()],
                              reader.status(0.0)["tasks"]["done"]))
        finally:
            reader.close()
        raise RuntimeError("refused by the test")

    def launch(self, type_name, count, client_token):
        return self._look(("launch", client_token))

    def terminate(self, instance_ids):
        return self._look(("terminate", tuple(instance_ids)))


def test_an_intent_written_in_the_daemons_turn_is_durable_before_its_ec2_call(tmp_path):
    """The daemon's actuator inside a turn's group: when the EC2 call runs (off the loop), the
    intent that guards it, and the turn's results before it, are already committed."""
    import queue

    from broker.core.billing import Billing
    from broker.core.model import MachineType
    from broker.shells.clock import RunClock
    from broker.shells.run.actuator import Ec2Actuator

    journal = new_journal(tmp_path)
    journal.record_launch("i-1", "c5.large", launched_at_s=0.0, price_per_hour=0.1, billing=Billing.hourly())
    fleet, answers = _WatchingFleet(tmp_path / "run"), queue.Queue()
    ec2 = Ec2Actuator(fleet, journal, RunClock(), "g1", post=answers.put)
    t = MachineType("c5.large", slots=2, speed=1.0, price_per_hour=0.1, limit=3)
    try:
        with journal.group():
            journal.task_finished("t0", 1, OK)
            token = ec2.launch(t, 1, "plan")
            answers.get(timeout=30)  # the call ran while the group is still open
            journal.task_finished("t1", 1, OK)
            ec2.terminate_all({"i-1": "release"})
            answers.get(timeout=30)
    finally:
        ec2.shutdown()
    launch, terminate = fleet.seen
    assert launch[0] == ("launch", token) and launch[2] == 1
    assert ("launch", {"type": "c5.large", "count": 1, "client_token": token}) in launch[1]
    assert terminate[0] == ("terminate", ("i-1",)) and terminate[2] == 2
    assert ("terminate", {"instance_id": "i-1"}) in terminate[1]
