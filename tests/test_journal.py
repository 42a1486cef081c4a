"""The journal's rules, case by case: schema versioning, the intent log, the task life cycle,
committed spend against hand-checked bills, and the status summary."""

import hashlib
import json
import sqlite3

import pytest

from broker.core.billing import Billing
from broker.core.model import Task
from broker.shells.journal import (
    JournalReader,
    JOURNAL_FILE,
    SCHEMA_VERSION,
    AttemptResult,
    Journal,
    JournalError,
    JournalNotFound,
)

OK = AttemptResult(exit_code=0, runtime_s=10.0)
BAD = AttemptResult(exit_code=3, runtime_s=10.0, stderr_tail="boom")


def new_journal(tmp_path, n_tasks=3, retries=1, budget_usd=5.0, at_s=0.0):
    journal = Journal.open(tmp_path / "run")
    journal.create_run("r1", goal_kind="budget", goal_value=budget_usd, budget_usd=budget_usd,
                       retries=retries, at_s=at_s)
    journal.add_tasks(Task(f"t{i}", f"echo {i}") for i in range(n_tasks))
    return journal


def failures(journal, task_id):
    return journal._db.execute("SELECT failures FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]


def task_state(journal, task_id):
    return journal._db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]


# -- opening and versioning ----------------------------------------------------------------

def test_open_uses_wal_normal_sync_and_foreign_keys(tmp_path):
    journal = Journal.open(tmp_path)
    db = journal._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL; intents: FULL (test_journal_group.py)
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert (tmp_path / JOURNAL_FILE).is_file()


def test_reopening_keeps_the_data(tmp_path):
    new_journal(tmp_path).close()
    again = Journal.open(tmp_path / "run")
    assert again.status(0.0)["tasks"]["total"] == 3
    assert again.run().id == "r1"


def test_a_journal_from_a_newer_broker_is_refused_with_the_versions_named(tmp_path):
    new_journal(tmp_path).close()
    raw = sqlite3.connect(tmp_path / "run" / JOURNAL_FILE)
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    for readonly in (False, True):
        with pytest.raises(JournalError, match=rf"newer broker.*v{SCHEMA_VERSION + 1}.*up to v{SCHEMA_VERSION}"):
            Journal.open(tmp_path / "run", readonly=readonly)


def test_a_foreign_sqlite_file_or_garbage_is_not_taken_for_a_journal(tmp_path):
    raw = sqlite3.connect(tmp_path / JOURNAL_FILE)
    raw.execute("CREATE TABLE other (x)")
    raw.commit()
    raw.close()
    with pytest.raises(JournalError, match="not a broker journal"):
        Journal.open(tmp_path)
    garbage = tmp_path / "g"
    garbage.mkdir()
    (garbage / JOURNAL_FILE).write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(JournalError, match="not a readable broker journal"):
        Journal.open(garbage)


def test_read_only_open_needs_a_journal_and_refuses_writes(tmp_path):
    with pytest.raises(JournalNotFound, match="no journal"):
        Journal.open(tmp_path, readonly=True)
    assert not (tmp_path / JOURNAL_FILE).exists()  # a reader never creates one
    new_journal(tmp_path).close()
    reader = Journal.open(tmp_path / "run", readonly=True)
    assert reader.status(0.0)["tasks"]["total"] == 3
    # The read side has no write methods, and its connection is read-only underneath.
    assert isinstance(reader, JournalReader) and not hasattr(reader, "intend")
    with pytest.raises(JournalError, match="read-only"):
        with reader.batch():
            pass
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._db.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")


def test_one_run_per_journal_and_its_inputs_are_hashed(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("private: []\n")
    journal = Journal.open(tmp_path / "run")
    run = journal.create_run("r1", goal_kind="deadline", goal_value=3600, deadline_s=3600,
                             inventory_path=inventory, options={"margin_s": 120})
    assert run.inventory_sha256 == hashlib.sha256(b"private: []\n").hexdigest()
    assert run.options == {"margin_s": 120} and run.state == "running"
    with pytest.raises(JournalError, match="already holds run 'r1'"):
        journal.create_run("r2", goal_kind="budget", budget_usd=1.0)
    with pytest.raises(JournalError, match="goal kind"):
        Journal.open(tmp_path / "other").create_run("x", goal_kind="cheapest")


def test_duplicate_task_ids_roll_back_the_whole_batch(tmp_path):
    journal = new_journal(tmp_path, n_tasks=2)
    with pytest.raises(JournalError, match="unique"):
        journal.add_tasks([Task("new", "true"), Task("t0", "again")])
    assert journal.status(0.0)["tasks"]["total"] == 2


# -- the intent/outcome log -------------------------------------------------------------------

def test_pending_intents_are_exactly_those_without_outcome(tmp_path):
    journal = new_journal(tmp_path)
    a = journal.intend("launch", {"type": "c5.xlarge", "token": "tok-1"}, "deadline_at_risk", at_s=1.0)
    b = journal.intend("terminate", {"instance": "i-1"}, "surplus_at_billing_boundary", at_s=2.0)
    c = journal.intend("assign", {"task": "t0"}, "dispatch", at_s=3.0)
    assert journal.complete(a, {"instances": ["i-1"]}, at_s=4.0)
    assert journal.fail(c, "agent unreachable", at_s=5.0)
    pending = journal.pending_intents()
    assert [(i.seq, i.kind, i.payload, i.cause) for i in pending] == [
        (b, "terminate", {"instance": "i-1"}, "surplus_at_billing_boundary")
    ]
    # closing twice is a replay: refused, outcome unchanged
    assert not journal.complete(a, {"instances": ["other"]})
    assert not journal.fail(a, "late")
    outcome = journal._db.execute("SELECT state, outcome FROM actions WHERE seq = ?", (a,)).fetchone()
    assert outcome[0] == "done" and json.loads(outcome[1]) == {"instances": ["i-1"]}
    with pytest.raises(JournalError, match="no action 999"):
        journal.complete(999)


# -- tasks ------------------------------------------------------------------------------------

def test_start_and_result_are_recorded_once(tmp_path):
    journal = new_journal(tmp_path)
    assert journal.task_started("t0", 1, "n1")
    assert not journal.task_started("t0", 1, "n1")
    assert task_state(journal, "t0") == "running"
    assert journal.task_finished("t0", 1, OK)
    assert not journal.task_finished("t0", 1, BAD)  # a replayed (even contradictory) result
    assert task_state(journal, "t0") == "done"
    row = journal._db.execute(
        "SELECT outcome, exit_code FROM attempts WHERE task_id = 't0' AND attempt = 1").fetchone()
    assert row == ("ok", 0)
    assert journal.status(0.0)["tasks"] == {"total": 3, "done": 1, "running": 0, "failed": 0, "left": 2}


def test_a_turns_starts_in_one_statement_keep_task_starteds_rules(tmp_path):
    """Issue 20: the daemon journals a turn's starts with tasks_started (one INSERT and one
    UPDATE for all). Same rows as task_started one by one: running or sampling, the attempt
    counted; a replayed start among them changes nothing (taken one by one after a rollback);
    an unknown task is refused as task_started refuses it."""
    journal = new_journal(tmp_path, n_tasks=5)
    journal.record_sample_draws(["t1"])
    journal.tasks_started([("t0", 1, "n1"), ("t1", 1, "n2"), ("t2", 1, "n1")], at_s=4.0)
    assert [task_state(journal, t) for t in ("t0", "t1", "t2", "t3")] == ["running", "sampling", "running", "pending"]
    rows = journal._db.execute("SELECT task_id, attempt, node, outcome FROM attempts ORDER BY task_id").fetchall()
    assert rows == [("t0", 1, "n1", "running"), ("t1", 1, "n2", "running"), ("t2", 1, "n1", "running")]
    assert journal.task_finished("t0", 1, BAD)
    assert task_state(journal, "t0") == "pending"
    journal.tasks_started([("t0", 1, "n1"), ("t3", 1, "n2")])  # t0's attempt 1 again: a replay
    assert task_state(journal, "t0") == "pending" and task_state(journal, "t3") == "running"
    assert journal._db.execute("SELECT attempts FROM tasks WHERE id = 't3'").fetchone() == (1,)
    with pytest.raises(JournalError, match="unknown task"):
        journal.tasks_started([("t4", 1, "n1"), ("nope", 1, "n1")])
    with journal.batch():  # inside a batch (the daemon's turn): a savepoint
        journal.tasks_started([("t0", 2, "n1"), ("t4", 1, "n2")])
    assert task_state(journal, "t0") == "running" and task_state(journal, "t4") == "running"


def _rows(journal):
    return (journal._db.execute("SELECT * FROM attempts ORDER BY task_id, attempt").fetchall(),
            journal._db.execute("SELECT * FROM tasks ORDER BY id").fetchall())


def test_a_turns_results_in_two_statements_leave_the_rows_task_finished_leaves(tmp_path):
    """Issue 20: the daemon journals a turn's successful results with tasks_finished (about
    six statements a result before: a savepoint, a look-up, two updates). The rows are those
    task_finished leaves one by one: for running attempts and a replica pair (the task done
    once, by the first), and, taken one by one after a rollback, for a replay, a result whose
    start was never journaled and a failure among them."""
    turns = [
        [("t0", 1, OK, "n1", 5.0), ("t1", 1, OK, "n1", 5.5), ("t2", 2, OK, "n2", 6.0), ("t2", 1, OK, "n1", 6.0)],
        [("t0", 1, OK, "n1", 7.0), ("t3", 1, OK, "n2", 7.0)],  # a replay; then a start never journaled
        [("t4", 1, OK, "n1", 8.0), ("t5", 1, BAD, "n2", 8.0)],  # a failure among them
    ]
    batched, single = (new_journal(tmp_path / name, n_tasks=6) for name in ("batched", "single"))
    for journal in (batched, single):
        journal.tasks_started([("t0", 1, "n1"), ("t1", 1, "n1"), ("t2", 1, "n1"), ("t2", 2, "n2"),
                               ("t4", 1, "n1"), ("t5", 1, "n2")], at_s=1.0)
    statements = traced(batched)
    with batched.batch():
        batched.tasks_finished(turns[0])
    # one call: one savepoint, no look-up a result (the trace shows each row of an executemany)
    assert [s for s in statements if s.startswith(("SAVEPOINT", "SELECT"))] == ["SAVEPOINT call"]
    for results in turns[1:]:
        batched.tasks_finished(results)
    for results in turns:
        for task_id, attempt, result, node, at_s in results:
            single.task_finished(task_id, attempt, result, node=node, at_s=at_s)
    assert _rows(batched) == _rows(single)
    assert [task_state(batched, t) for t in ("t0", "t2", "t3", "t5")] == ["done", "done", "done", "pending"]
    assert batched._db.execute("SELECT done_attempt FROM tasks WHERE id = 't2'").fetchone() == (2,)


def traced(journal):
    statements = []
    journal._db.set_trace_callback(statements.append)
    return statements


def test_a_replica_result_is_recorded_but_the_task_counts_once(tmp_path):
    journal = new_journal(tmp_path)
    journal.task_started("t0", 1, "n1")
    journal.task_started("t0", 2, "n2")  # replica
    assert journal.status(0.0)["tasks"]["running"] == 1
    assert journal.task_finished("t0", 2, OK)
    assert journal.task_finished("t0", 1, OK)
    done_attempt = journal._db.execute("SELECT done_attempt FROM tasks WHERE id = 't0'").fetchone()[0]
    assert done_attempt == 2  # the first result wins
    outcomes = journal._db.execute("SELECT count(*) FROM attempts WHERE task_id = 't0' AND outcome = 'ok'")
    assert outcomes.fetchone()[0] == 2
    assert journal.status(0.0)["tasks"]["done"] == 1


def test_a_failing_replica_does_not_requeue_a_task_still_running_elsewhere(tmp_path):
    journal = new_journal(tmp_path, retries=0)
    journal.task_started("t0", 1, "n1")
    journal.task_started("t0", 2, "n2")
    journal.task_finished("t0", 2, BAD)
    assert task_state(journal, "t0") == "running"
    journal.task_finished("t0", 1, BAD)
    assert task_state(journal, "t0") == "pending"  # the journal records; giving up is the ledger's call
    assert failures(journal, "t0") == 2


def test_failures_are_counted_and_only_the_caller_gives_a_task_up(tmp_path):
    # The retry rule is the run ledger's (tests/test_ledger.py); the journal's SQL keeps no
    # copy of it: every unsuccessful end counts, the task waits until it is quarantined.
    journal = new_journal(tmp_path, retries=2)
    for attempt in (1, 2):
        journal.task_started("t0", attempt, "n1")
        journal.task_finished("t0", attempt, BAD)
        assert task_state(journal, "t0") == "pending"
        assert {p.id: p.next_attempt for p in journal.pending_tasks()}["t0"] == attempt + 1
    journal.task_started("t0", 3, "n1")
    journal.task_finished("t0", 3, AttemptResult(exit_code=None, runtime_s=60.0, timed_out=True))
    assert task_state(journal, "t0") == "pending" and failures(journal, "t0") == 3
    assert journal.quarantine("t0", "failed 3 times (retries: 2)")
    assert task_state(journal, "t0") == "quarantined"
    assert journal.status(0.0)["tasks"]["failed"] == 1
    assert journal.rows().tasks[0].note == "failed 3 times (retries: 2)"


def test_a_lost_attempt_counts_no_failure_and_frees_its_task(tmp_path):
    journal = new_journal(tmp_path)
    journal.task_started("t0", 1, "n1")
    assert journal.attempt_lost("t0", 1, "the agent on n1 no longer knows this attempt")
    assert not journal.attempt_lost("t0", 1, "again")
    assert task_state(journal, "t0") == "pending" and failures(journal, "t0") == 0
    assert [(a.outcome, a.error) for a in journal.rows().attempts] == [
        ("lost", "the agent on n1 no longer knows this attempt")]


def test_a_lost_node_requeues_its_running_tasks_with_the_next_attempt(tmp_path):
    journal = new_journal(tmp_path, n_tasks=4, retries=1)
    journal.task_started("t0", 1, "lost")
    journal.task_started("t1", 1, "lost")
    journal.task_started("t2", 1, "kept")
    journal.task_started("t3", 1, "lost")
    journal.task_finished("t3", 1, OK)
    assert journal.requeue_running("lost") == ["t0", "t1"]
    assert {p.id: p.next_attempt for p in journal.pending_tasks()} == {"t0": 2, "t1": 2}
    assert [(a.task_id, a.node) for a in journal.running_attempts()] == [("t2", "kept")]
    # a loss is no failure of the task; giving the task up is the caller's decision
    journal.task_started("t0", 2, "lost-again")
    assert journal.requeue_running("lost-again") == ["t0"]
    assert failures(journal, "t0") == 0
    # a late result from the lost node is not recorded again
    assert not journal.task_finished("t1", 1, OK)


def test_a_result_without_a_recorded_start_is_accepted_once(tmp_path):
    journal = new_journal(tmp_path)
    assert journal.task_finished("t1", 4, OK, node="i-9")
    assert not journal.task_finished("t1", 4, OK, node="i-9")
    assert task_state(journal, "t1") == "done"
    assert {p.id: p.next_attempt for p in journal.pending_tasks()} == {"t0": 1, "t2": 1}


def test_quarantine_counts_as_failed_and_cancelled_tasks_are_left(tmp_path):
    journal = new_journal(tmp_path, n_tasks=4)
    assert journal.quarantine("t0", "kills its node")
    assert not journal.quarantine("t0", "again")
    assert journal.cancel_pending(["t1", "t2"], "budget_cap") == 2
    assert journal.status(0.0)["tasks"] == {"total": 4, "done": 0, "running": 0, "failed": 1, "left": 3}
    with pytest.raises(JournalError, match="unknown task 'nope'"):
        journal.quarantine("nope", "x")


def test_samples_run_as_sampling_in_draw_order(tmp_path):
    journal = new_journal(tmp_path, n_tasks=4)
    assert journal.record_sample_draws(["t2", "t0"]) == [1, 2]
    assert journal.record_sample_draws(["t3"]) == [3]
    with pytest.raises(JournalError, match="already drawn"):
        journal.record_sample_draws(["t0"])
    journal.task_started("t2", 1, "n1")
    assert task_state(journal, "t2") == "sampling"
    assert journal.status(0.0)["tasks"]["running"] == 1


# -- instances and committed spend ---------------------------------------------------------------

def test_hourly_spend_charges_every_started_hour(tmp_path):
    journal = new_journal(tmp_path)
    journal.record_launch("i-1", "c5.xlarge", launched_at_s=1000.0, price_per_hour=0.17,
                          billing=Billing.hourly(), client_token="tok-1")
    assert journal.committed_usd(1000.0) == pytest.approx(0.17)  # the first hour at launch
    assert journal.committed_usd(1000.0 + 3600.0) == pytest.approx(0.17)  # boundary: still one hour
    assert journal.committed_usd(1000.0 + 3601.0) == pytest.approx(0.34)
    journal.record_instance_state("i-1", "running", at_s=1090.0)
    journal.record_instance_state("i-1", "terminated", at_s=1000.0 + 7000.0)
    # terminated after 1h56m40s: two hours, forever after
    assert journal.committed_usd(1e6) == pytest.approx(0.34)
    assert not journal.record_instance_state("i-1", "running", at_s=9000.0)  # stale describe
    inst = journal.instances(1e6)[0]
    assert (inst.state, inst.ready_at_s, inst.paid_until_s) == ("terminated", 1090.0, 1000.0 + 7200.0)


def test_an_interrupted_spot_instance_is_charged_only_for_what_ran(tmp_path):
    """EC2 does not bill the hour it interrupted: the journal's spend (status, report, a
    resume's ledger) charged it until this mark existed."""
    journal = new_journal(tmp_path)
    journal.record_launch("i-1", "c5.xlarge@spot", launched_at_s=0.0, price_per_hour=0.06,
                          billing=Billing.hourly())
    journal.record_instance_state("i-1", "terminated", at_s=5400.0)
    assert journal.committed_usd(1e6) == pytest.approx(0.12)
    assert journal.mark_interrupted("i-1") and not journal.mark_interrupted("i-1")
    assert journal.committed_usd(1e6) == pytest.approx(0.06)  # the first hour only
    assert journal.instances(1e6)[0].interrupted
    assert journal.rows().instances[0].interrupted


def test_a_journal_without_the_interrupted_column_gets_it_on_a_writable_open(tmp_path):
    journal = new_journal(tmp_path)
    journal.record_launch("i-1", "c5", launched_at_s=0.0, price_per_hour=0.1, billing=Billing.hourly())
    journal.close()
    raw = sqlite3.connect(tmp_path / "run" / JOURNAL_FILE)
    raw.execute("ALTER TABLE instances DROP COLUMN interrupted")  # as written before the column
    raw.commit()
    raw.close()
    old = Journal.open(tmp_path / "run", readonly=True)
    assert not old.instances(10.0)[0].interrupted  # read as not interrupted
    old.close()
    again = Journal.open(tmp_path / "run")
    assert again.mark_interrupted("i-1") and again.instances(10.0)[0].interrupted


def _indexes(path) -> set[str]:
    raw = sqlite3.connect(path)
    try:
        return {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        raw.close()


def test_the_tasks_have_no_state_index_and_an_older_journal_loses_it_on_a_writable_open(tmp_path):
    """Each start and result moved two entries of an index on tasks.state (random pages: tasks
    go out in random order) for counts that read the table anyway: a new journal has none, an
    older one loses it when a run resumes, and the counts are the same either way."""
    journal = new_journal(tmp_path)
    journal.task_started("t0", 1, "n1")
    journal.task_finished("t0", 1, OK)
    journal.task_started("t1", 1, "n1")
    before = journal.status()["tasks"]
    journal.close()
    path = tmp_path / "run" / JOURNAL_FILE
    assert "tasks_by_state" not in _indexes(path)
    raw = sqlite3.connect(path)
    raw.execute("CREATE INDEX tasks_by_state ON tasks (state)")  # as journals were written before
    raw.commit()
    raw.close()
    reader = Journal.open(tmp_path / "run", readonly=True)
    assert reader.status()["tasks"] == before == {"total": 3, "done": 1, "running": 1, "failed": 0, "left": 2}
    reader.close()
    assert "tasks_by_state" in _indexes(path)  # a reader changes nothing
    Journal.open(tmp_path / "run").close()
    assert "tasks_by_state" not in _indexes(path)


def test_per_second_spend_has_a_minute_minimum_then_prorates(tmp_path):
    journal = new_journal(tmp_path)
    journal.record_launch("i-2", "m5.large", launched_at_s=0.0, price_per_hour=0.36,
                          billing=Billing.per_second())
    assert journal.committed_usd(30.0) == pytest.approx(0.36 * 60 / 3600)  # 0.006: the minimum
    assert journal.committed_usd(61.2) == pytest.approx(0.36 * 62 / 3600)  # 0.0062
    assert journal.committed_usd(3600.0) == pytest.approx(0.36)


def test_spend_adds_instances_and_private_nodes_until_the_run_ends(tmp_path):
    journal = new_journal(tmp_path, at_s=0.0)
    journal.record_private_node("lab-a", slots=40, speed=10, cost_per_hour=0.32, at_s=1000.0)
    journal.record_launch("i-1", "c5.xlarge", launched_at_s=1000.0, price_per_hour=0.17,
                          billing=Billing.hourly())
    journal.record_launch("i-2", "m5.large", launched_at_s=1000.0, price_per_hour=0.36,
                          billing=Billing.custom(600, 600))
    # at 1000 + 1800: lab-a 0.32 * 0.5 = 0.16; i-1 one hour 0.17; i-2 three 10-min units 0.18
    assert journal.committed_usd(2800.0) == pytest.approx(0.16 + 0.17 + 0.18)
    journal.record_instance_state("i-2", "terminated", at_s=2800.0)
    journal.finish_run("finished", at_s=4600.0)
    # private cost stops at the run's end (0.32), i-1 still alive pays 2 hours at 1000+3700
    assert journal.committed_usd(4700.0) == pytest.approx(0.32 + 0.34 + 0.18)
    assert journal.status(4700.0)["committed_usd"] == pytest.approx(0.84)


def test_launches_are_idempotent_and_client_tokens_unique(tmp_path):
    journal = new_journal(tmp_path)
    kw = dict(launched_at_s=0.0, price_per_hour=0.1, billing=Billing.hourly())
    assert journal.record_launch("i-1", "t", client_token="tok-1", **kw)
    assert not journal.record_launch("i-1", "t", client_token="tok-1", **kw)
    with pytest.raises(sqlite3.IntegrityError):
        journal.record_launch("i-2", "t", client_token="tok-1", **kw)
    with pytest.raises(JournalError, match="unknown instance"):
        journal.record_instance_state("i-404", "running")
    with pytest.raises(JournalError, match="instance state must be"):
        journal.record_instance_state("i-1", "stopped")


def test_release_times_are_kept_and_cleared(tmp_path):
    journal = new_journal(tmp_path)
    journal.record_launch("i-1", "t", launched_at_s=0.0, price_per_hour=0.1, billing=Billing.hourly())
    assert journal.set_release("i-1", 3480.0)
    assert journal.instances(10.0)[0].release_at_s == 3480.0
    assert journal.set_release("i-1", None)
    assert journal.instances(10.0)[0].release_at_s is None


# -- summaries ---------------------------------------------------------------------------------

def test_status_has_exactly_the_documented_shape(tmp_path):
    journal = new_journal(tmp_path, n_tasks=5, budget_usd=2.5)
    journal.task_started("t0", 1, "n")
    journal.task_started("t1", 1, "n")
    journal.task_finished("t1", 1, OK)
    journal.quarantine("t2", "poison")
    journal.record_launch("i-1", "t", launched_at_s=0.0, price_per_hour=0.5, billing=Billing.hourly())
    journal.record_launch("i-2", "t", launched_at_s=0.0, price_per_hour=0.5, billing=Billing.hourly())
    journal.record_instance_state("i-2", "terminated", at_s=10.0)
    assert journal.status(100.0) == {
        "tasks": {"total": 5, "done": 1, "running": 1, "failed": 1, "left": 3},
        "instances": {"running": 1, "terminated": 1},
        "committed_usd": 1.0,
        "budget_usd": 2.5,
    }


def test_overview_gives_the_last_plan_and_its_eta(tmp_path):
    journal = new_journal(tmp_path, at_s=100.0)
    journal.record_plan(makespan_s=5000.0, cost_usd=1.2, fleet={"c5": 2}, chosen={"deadline": 5000},
                        reason="initial", at_s=200.0)
    journal.record_plan(makespan_s=4000.0, cost_usd=1.5, fleet={"c5": 3}, chosen={"deadline": 5000},
                        reason="deadline_at_risk", confidence=0.9, at_s=300.0)
    overview = journal.overview(400.0)
    assert overview.last_plan.reason == "deadline_at_risk" and overview.last_plan.fleet == {"c5": 3}
    assert overview.eta_at_s == 100.0 + 4000.0


def test_events_are_kept_in_order_and_filterable(tmp_path):
    journal = new_journal(tmp_path)
    journal.record_event("plan.solved", {"makespan_s": 10}, at_s=1.0)
    journal.record_event("task.done", {"task_id": "t0"}, at_s=2.0)
    journal.record_event("plan.solved", {"makespan_s": 8}, at_s=3.0)
    assert [f["makespan_s"] for _, _, f in journal.events("plan.solved")] == [10, 8]
    assert [name for _, name, _ in journal.events()] == ["plan.solved", "task.done", "plan.solved"]


# -- batches -----------------------------------------------------------------------------------

def test_a_batch_is_one_transaction_invisible_to_readers_until_it_ends(tmp_path):
    journal = new_journal(tmp_path, n_tasks=3)
    reader = Journal.open(tmp_path / "run", readonly=True)
    with journal.batch():
        journal.task_started("t0", 1, "n")
        journal.task_finished("t0", 1, OK)
        assert journal.status(0.0)["tasks"]["done"] == 1  # the batch sees its own writes
        assert reader.status(0.0)["tasks"]["done"] == 0  # nobody else does yet
        with pytest.raises(JournalError, match="do not nest"):
            with journal.batch():
                pass
    assert reader.status(0.0)["tasks"]["done"] == 1


def test_a_failing_call_in_a_batch_is_undone_alone_and_an_escaping_error_undoes_all(tmp_path):
    journal = new_journal(tmp_path, n_tasks=3)
    with journal.batch():
        journal.task_finished("t0", 1, OK)
        with pytest.raises(JournalError):
            journal.add_tasks([Task("fresh", "true"), Task("t1", "duplicate")])
        journal.task_finished("t1", 1, OK)
    assert journal.status(0.0)["tasks"] == {"total": 3, "done": 2, "running": 0, "failed": 0, "left": 1}
    with pytest.raises(RuntimeError):
        with journal.batch():
            journal.task_finished("t2", 1, OK)
            journal.intend("launch", {}, "test")
            raise RuntimeError("daemon bug")
    assert journal.status(0.0)["tasks"]["done"] == 2
    assert journal.pending_intents() == []


def test_a_journal_opened_with_an_anchor_speaks_run_seconds_and_stores_epoch_seconds(tmp_path):
    anchor = 1_700_000_000.0
    run_now = [50.0]
    journal = Journal.open(tmp_path, clock=lambda: run_now[0], anchor_s=anchor)
    journal.create_run("r", goal_kind="deadline", deadline_s=600, tasks=[Task("t0", "true")])
    journal.record_launch("i-1", "c5", launched_at_s=10.0, price_per_hour=3.6, billing=Billing.hourly())
    journal.set_release("i-1", 3480.0)
    journal.task_started("t0", 1, "i-1", at_s=20.0)
    journal.task_finished("t0", 1, OK, at_s=30.0)
    run_now[0] = 100.0
    assert journal.run().created_at_s == 50.0
    (inst,) = journal.instances()
    assert (inst.launched_at_s, inst.release_at_s, inst.paid_until_s) == (10.0, 3480.0, 3610.0)
    assert [(a.started_at_s, a.ended_at_s) for a in journal.rows().attempts] == [(20.0, 30.0)]
    assert journal.latest_time_s() == 30.0 and journal.committed_usd() == pytest.approx(3.6)
    journal.close()
    with Journal.open(tmp_path, readonly=True) as reader:  # an outside reader: epoch seconds
        assert reader.run().created_at_s == anchor + 50.0
        assert reader.instances()[0].launched_at_s == anchor + 10.0


def test_a_run_and_its_tasks_are_created_in_one_transaction(tmp_path):
    journal = Journal.open(tmp_path)
    with pytest.raises(JournalError, match="unique"):
        journal.create_run("r", goal_kind="budget", budget_usd=1.0, tasks=[Task("t", "a"), Task("t", "b")])
    assert journal.run() is None  # no run without its tasks
    journal.create_run("r", goal_kind="budget", budget_usd=1.0, tasks=[Task("t", "a")])
    assert journal.status(0.0)["tasks"]["total"] == 1
