"""Invariants of the task journal under random sequences of events (hypothesis).

Events: starts (replicas included), results good and bad (replayed ones too), failures
without a result, lost nodes, cancelled attempts, quarantines. After every event:

- a task is done exactly when some attempt of it succeeded, and never stops being done;
- ``status()`` counts add up and match the task table;
- running tasks have a running attempt, pending ones none; the journal never gives a task up
  by itself (no ``failed`` state: past its retries is the run ledger's call, which then
  quarantines it; tests/test_ledger_properties.py holds that rule);
- a replayed start or result returns False and changes no row of any table.
"""

import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from broker.core.model import Task
from broker.shells.journal import AttemptResult, Journal

TASKS = ("a", "b", "c")
NODES = ("n0", "n1", "n2")

task_ids = st.sampled_from(TASKS)
attempts = st.integers(min_value=1, max_value=4)
nodes = st.sampled_from(NODES)
results = st.sampled_from(
    [
        AttemptResult(exit_code=0, runtime_s=5.0),
        AttemptResult(exit_code=1, runtime_s=5.0, stderr_tail="error"),
        AttemptResult(exit_code=None, runtime_s=30.0, timed_out=True),
    ]
)
events = st.one_of(
    st.tuples(st.just("start"), task_ids, attempts, nodes),
    st.tuples(st.just("finish"), task_ids, attempts, results, nodes),
    st.tuples(st.just("fail"), task_ids, attempts),
    st.tuples(st.just("lose"), nodes),
    st.tuples(st.just("cancel"), task_ids, attempts),
    st.tuples(st.just("quarantine"), task_ids),
    st.tuples(st.just("replay"), st.integers(min_value=0, max_value=1000), results),
)


def dump(journal):
    db = journal._db
    return {
        table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        for table in ("tasks", "attempts", "actions", "instances")
    }


def check_invariants(journal, retries, done_before):
    db = journal._db
    tasks = {
        tid: (state, failures, done_attempt)
        for tid, state, failures, done_attempt in db.execute(
            "SELECT id, state, failures, done_attempt FROM tasks")
    }
    by_task = {tid: [] for tid in TASKS}
    for tid, attempt, outcome in db.execute("SELECT task_id, attempt, outcome FROM attempts"):
        by_task[tid].append((attempt, outcome))

    done = {tid for tid, (state, _, _) in tasks.items() if state == "done"}
    succeeded = {tid for tid, rows in by_task.items() if any(o == "ok" for _, o in rows)}
    assert done == succeeded
    assert done_before <= done
    for tid, (state, failures, done_attempt) in tasks.items():
        outcomes = dict(by_task[tid])
        running = [a for a, o in by_task[tid] if o == "running"]
        unsuccessful = sum(o in ("failed", "timed_out") for o in outcomes.values())  # lost: no failure
        if state == "done":
            assert outcomes[done_attempt] == "ok"
            assert failures <= unsuccessful
        else:
            assert failures == unsuccessful
        if state in ("running", "sampling"):
            assert running
        if state == "pending":
            assert not running
        assert state != "failed"  # only quarantine() gives a task up

    status = journal.status(0.0)["tasks"]
    states = [state for state, _, _ in tasks.values()]
    assert status["total"] == len(TASKS)
    assert status["done"] == len(done)
    assert status["running"] == sum(s in ("running", "sampling") for s in states)
    assert status["failed"] == sum(s in ("failed", "quarantined") for s in states)
    # "left" is everything neither done nor failed: running tasks are part of it
    assert status["done"] + status["failed"] + status["left"] == status["total"]
    assert status["running"] <= status["left"]
    assert min(status.values()) >= 0
    return done


@settings(max_examples=100, deadline=None)
@given(retries=st.integers(min_value=0, max_value=2), script=st.lists(events, max_size=40))
def test_random_event_sequences_keep_every_invariant(retries, script):
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.open(Path(tmp))
        journal.create_run("prop", goal_kind="deadline", deadline_s=3600, retries=retries, at_s=0.0)
        journal.add_tasks(Task(tid, f"run {tid}") for tid in TASKS)
        known: set[tuple[str, int]] = set()  # attempts the journal has heard of
        ended: list[tuple[str, int]] = []  # attempts with a recorded end, in order
        done: set[str] = set()
        for clock_s, event in enumerate(script, start=1):
            kind = event[0]
            if kind == "start":
                _, tid, attempt, node = event
                assert journal.task_started(tid, attempt, node, at_s=clock_s) == ((tid, attempt) not in known)
                known.add((tid, attempt))
            elif kind == "finish":
                _, tid, attempt, result, node = event
                fresh = (tid, attempt) not in ended
                assert journal.task_finished(tid, attempt, result, node=node, at_s=clock_s) == fresh
                known.add((tid, attempt))
                if fresh:
                    ended.append((tid, attempt))
            elif kind == "fail":
                _, tid, attempt = event
                fresh = (tid, attempt) not in ended
                assert journal.task_failed(tid, attempt, "could not start", at_s=clock_s) == fresh
                known.add((tid, attempt))
                if fresh:
                    ended.append((tid, attempt))
            elif kind == "lose":
                running = [(t, a) for t, a, n in journal._db.execute(
                    "SELECT task_id, attempt, node FROM attempts WHERE outcome = 'running'") if n == event[1]]
                journal.requeue_running(event[1], at_s=clock_s)
                ended.extend(running)
            elif kind == "cancel":
                _, tid, attempt = event
                was_running = (tid, attempt) in known and (tid, attempt) not in ended
                assert journal.attempt_cancelled(tid, attempt, at_s=clock_s) == was_running
                if was_running:
                    ended.append((tid, attempt))
            elif kind == "quarantine":
                journal.quarantine(event[1], "poison")
            elif kind == "replay" and ended:
                _, pick, result = event
                tid, attempt = ended[pick % len(ended)]
                before = dump(journal)
                assert not journal.task_finished(tid, attempt, result, at_s=clock_s)
                assert not journal.task_started(tid, attempt, "elsewhere", at_s=clock_s)
                assert dump(journal) == before
            done = check_invariants(journal, retries, done)
        journal.close()


@settings(max_examples=30, deadline=None)
@given(script=st.lists(events, max_size=25))
def test_driving_every_open_task_to_success_ends_with_each_done_exactly_once(script):
    """Whatever happened before, finishing what is left makes done + failed = total."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.open(Path(tmp))
        journal.create_run("prop", goal_kind="deadline", deadline_s=3600, retries=1, at_s=0.0)
        journal.add_tasks(Task(tid, f"run {tid}") for tid in TASKS)
        for event in script:
            if event[0] == "start":
                journal.task_started(*event[1:])
            elif event[0] == "finish":
                journal.task_finished(event[1], event[2], event[3], node=event[4])
            elif event[0] == "lose":
                journal.requeue_running(event[1])
        for attempt in journal.running_attempts():
            journal.task_finished(attempt.task_id, attempt.attempt, AttemptResult(0, 1.0))
        for pending in journal.pending_tasks():
            assert journal.task_started(pending.id, pending.next_attempt, "n0")
            assert journal.task_finished(pending.id, pending.next_attempt, AttemptResult(0, 1.0))
        status = journal.status(0.0)["tasks"]
        assert status["left"] == 0 and status["running"] == 0
        assert status["done"] + status["failed"] == len(TASKS)
        per_task = journal._db.execute(
            "SELECT count(*) FROM tasks WHERE state = 'done' AND done_attempt IS NOT NULL").fetchone()[0]
        assert per_task == status["done"]
        journal.close()
