"""Resume after an edit (issue 19, item 6): tasks are known by command, environment and
working directory; a resume with an edited bag keeps what is done, runs the new and changed
tasks, drops the removed ones (kept in the journal as ``dropped``) and says so.

The end-to-end tests run the real ``broker run --dry-run`` in a subprocess, kill it with
``BROKER_CRASH_AT`` right after its last task is done (so the run is unfinished but nothing is
left to do), edit the bag and resume; what ran after the resume is read from the journal.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from broker.core.model import Bag, Task
from broker.shells.run.bagedit import BagEditRefused, match_bag, task_context
from tests.test_dryrun import query
from tests.test_resume import INVENTORY, broker, journal_events, run_dir  # noqa: F401 - run_dir is a fixture

COMMANDS = [f"python3 -c 'import time; time.sleep(0.2); print({k})'" for k in range(1, 11)]

BAG = """\
tasks_file: tasks.txt
timeout: 30s
retries: 1
env: {E: "1"}
"""


def write_inputs(tmp_path: Path, commands: list[str], bag: str = BAG) -> tuple[Path, Path]:
    inv, bag_file = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(INVENTORY)
    bag_file.write_text(bag)
    (tmp_path / "tasks.txt").write_text("\n".join(commands) + "\n")
    return inv, bag_file


def run_args(inv: Path, bag: Path, run_dir: Path, *goal: str) -> list[str]:
    # The deadline is not what these tests check: a generous one, so that a loaded machine
    # (the dry run's clock runs 60x wall time) cannot make a run miss it and exit 1.
    return ["run", "--dry-run", "--yes", *(goal or ("--deadline", "1h")), "--tick", "10s", "--inventory", str(inv),
            str(bag), "--run-dir", str(run_dir)]


def killed_when_all_done(inv: Path, bag: Path, run_dir: Path, n: int, *goal: str) -> list[str]:
    """Run the bag and kill the daemon right after its n-th (last) task is done: the run is
    unfinished in its journal, with no task left to start (the last results, in a batch the
    kill cut short, are still running there: their agent holds them and replays them to the
    resumed daemon). Returns the commands of the tasks done."""
    killed = broker(*run_args(inv, bag, run_dir, *goal), crash=f"event:task.done:{n}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    states = dict(query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state"))
    assert set(states) <= {"done", "running"} and states.get("done", 0) >= n - 2, states
    assert query(run_dir, "SELECT state FROM run") == [("running",)]
    return [c for (c,) in query(run_dir, "SELECT command FROM tasks WHERE state = 'done'")]


def started_after_resume(run_dir: Path) -> list[str]:
    return sorted(c for (c,) in query(run_dir, "SELECT t.command FROM attempts a JOIN tasks t ON t.id = a.task_id "
                                               "WHERE a.started_at >= (SELECT max(at) FROM events WHERE name = "
                                               "'run.resume')"))


@pytest.mark.slow
def test_resume_after_adding_5_tasks_and_changing_1_runs_exactly_those_6(tmp_path, run_dir):  # noqa: F811
    """Issue 19's must-show. Regression too: an edit of a bag's tasks_file passed the resume's
    check (the SHA-256 of the bag YAML alone), the tasks were matched by their place, so the
    new lines' places counted as done, and the resume died on `unknown task 't000012'`."""
    inv, bag = write_inputs(tmp_path, COMMANDS)
    done = killed_when_all_done(inv, bag, run_dir, 10)
    old_ids = dict(query(run_dir, "SELECT command, id FROM tasks"))
    k = next(k for k, c in enumerate(COMMANDS) if c in done)  # change a task that is done
    changed = COMMANDS[k].replace(f"print({k + 1})", f"print({k + 1}00)")
    added = [f"python3 -c 'print({k})'" for k in range(101, 106)]
    # Two new lines before the others (every old task changes its place), one changed, three at the end.
    edited = added[:2] + COMMANDS[:k] + [changed] + COMMANDS[k + 1:] + added[2:]
    (tmp_path / "tasks.txt").write_text("\n".join(edited) + "\n")

    resumed = broker(*run_args(inv, bag, run_dir))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert "6 new, 1 dropped, 0 redone" in resumed.stdout + resumed.stderr
    [event] = journal_events(run_dir, "run.bag_changed")
    assert (event["kept"], event["kept_done"], event["new"], event["dropped"], event["redone"]) == \
        (9, len(done) - 1, 6, 1, 0)
    # Exactly the 6 new and changed tasks ran after the resume, each once.
    assert started_after_resume(run_dir) == sorted(added + [changed])
    # The kept tasks kept their ids (inserting lines shifted nothing) and their one attempt.
    for command in COMMANDS[:k] + COMMANDS[k + 1:]:
        [(state, attempts)] = query(run_dir, f"SELECT state, attempts FROM tasks WHERE id = '{old_ids[command]}'")
        assert (state, attempts) == ("done", 1)
    # The changed task's old row stays, dropped, with its history; no id was reused.
    [(state, note)] = query(run_dir, f"SELECT state, note FROM tasks WHERE id = '{old_ids[COMMANDS[k]]}'")
    assert state == "dropped" and "was done" in note
    assert query(run_dir, f"SELECT outcome FROM attempts WHERE task_id = '{old_ids[COMMANDS[k]]}'") == [("ok",)]
    assert query(run_dir, "SELECT count(*), count(DISTINCT id) FROM tasks") == [(16, 16)]
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state ORDER BY state") == \
        [("done", 15), ("dropped", 1)]
    assert "15 done, 0 failed, 0 left of 15" in resumed.stdout
    status = broker("status", str(run_dir), "--json")
    tasks = json.loads(status.stdout)["tasks"]
    assert (tasks["total"], tasks["done"], tasks["left"], tasks["dropped"]) == (15, 15, 0, 1)


def _bag(commands: list[str], env: dict | None = None, workdir: str | None = None, setup: str | None = None) -> Bag:
    tasks = tuple(Task(id=f"t{k:06d}", command=c) for k, c in enumerate(commands, start=1))
    return Bag(tasks=tasks, timeout_s=30.0, env=env or {}, workdir=workdir, setup=setup)


def _journal_of(bag: Bag, states: list[str]) -> list[tuple[str, str, str]]:
    return [(t.id, t.command, s) for t, s in zip(bag.tasks, states)]


def test_match_bag_keeps_unchanged_tasks_by_key_whatever_their_place():
    then = _bag(["a", "b", "c"])
    live = _journal_of(then, ["done", "running", "pending"])
    edit = match_bag(live, {"t000001", "t000002", "t000003"}, task_context(then), _bag(["x", "c", "a", "b"]),
                     same_file=False)
    assert [t.id for t in edit.bag.tasks] == ["t000001-2", "t000003", "t000001", "t000002"]
    assert (edit.kept, edit.kept_done, edit.new, edit.dropped, edit.redone) == (3, 1, ("t000001-2",), (), 0)
    assert "3 tasks kept (1 done), 1 new, 0 dropped, 0 redone" == edit.summary()


def test_match_bag_never_reuses_a_dropped_id_and_counts_a_done_command_run_again_as_redone():
    then = _bag(["a", "b"])
    live = _journal_of(then, ["done", "pending"])
    # b removed; a twice (one copy done: the second runs it again); a new task lands on place 2,
    # an id the dropped b still holds.
    edit = match_bag(live, {"t000001", "t000002", "t000002-2"}, task_context(then), _bag(["a", "a"]),
                     same_file=False)
    assert [t.id for t in edit.bag.tasks] == ["t000001", "t000002-3"]
    assert edit.dropped == ("t000002",) and edit.new == ("t000002-3",) and edit.redone == 1


def test_match_bag_prefers_the_done_copy_of_a_duplicated_command():
    then = _bag(["a", "a"])
    live = _journal_of(then, ["pending", "done"])
    edit = match_bag(live, {"t000001", "t000002"}, task_context(then), _bag(["a"]), same_file=False)
    assert [t.id for t in edit.bag.tasks] == ["t000002"] and edit.dropped == ("t000001",) and edit.kept_done == 1


def test_a_changed_environment_or_working_directory_makes_every_task_new():
    then = _bag(["a", "b"], env={"E": "1"})
    live = _journal_of(then, ["done", "done"])
    for now in (_bag(["a", "b"], env={"E": "2"}), _bag(["a", "b"], env={"E": "1"}, workdir="/tmp")):
        edit = match_bag(live, {"t000001", "t000002"}, task_context(then), now, same_file=False)
        assert (edit.kept, len(edit.new), edit.dropped, edit.redone) == (0, 2, ("t000001", "t000002"), 0)
        assert edit.context_changed
    same = match_bag(live, {"t000001", "t000002"}, task_context(then), _bag(["a", "b"], env={"E": "1"}),
                     same_file=True)
    assert not same.changed and same.kept_done == 2


def test_refused_edits_say_why():
    then = _bag(["a"], setup="make")
    live = _journal_of(then, ["done"])
    with pytest.raises(BagEditRefused, match="setup changed"):
        match_bag(live, {"t000001"}, task_context(then), _bag(["a"], setup="make all"), same_file=False)
    with pytest.raises(BagEditRefused, match="did not record what its tasks ran with"):
        match_bag(live, {"t000001"}, None, _bag(["a", "b"]), same_file=False)
    # A journal without the context, resumed with the file it started with, resumes as it is.
    assert not match_bag(live, {"t000001"}, None, _bag(["a"], setup="make"), same_file=True).changed


@pytest.mark.slow
def test_resume_with_another_goal_replans_for_it_and_promises_from_its_first_plan(tmp_path, run_dir):  # noqa: F811
    from tests.test_resume import run_args as resume_args
    from tests.test_resume import write_inputs as resume_inputs

    inv, bag = resume_inputs(tmp_path)
    killed = broker(*resume_args(inv, bag, run_dir), crash="event:instance.ready:1")  # --deadline 2m
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    plans_before = query(run_dir, "SELECT max(seq) FROM plans")[0][0]
    assert plans_before >= 1

    resumed = broker("run", "--dry-run", "--yes", "--deadline", "1h", "--tick", "10s", "--inventory", str(inv),
                     str(bag), "--run-dir", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    [event] = journal_events(run_dir, "run.goal_changed")
    assert event == {"before": "deadline 2m00s", "after": "deadline 1h00m"}
    assert query(run_dir, "SELECT goal_kind, goal_value, deadline_s FROM run") == [("deadline", 3600.0, 3600.0)]
    # The promise the report holds the run to is the first plan made for the new goal.
    first_new = query(run_dir, f"SELECT makespan_s, cost_usd FROM plans WHERE seq > {plans_before} ORDER BY seq")
    assert first_new, "the resumed run made no plan for its new goal"
    report = json.loads(broker("report", str(run_dir), "--json").stdout)
    assert (report["planned"]["makespan_s"], report["planned"]["cost_usd"]) == pytest.approx(first_new[0], abs=0.01)
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state") == [("done", 10)]


@pytest.mark.slow
def test_a_task_dropped_while_it_runs_is_cancelled_and_the_rest_finish(tmp_path, run_dir):  # noqa: F811
    commands = [f"python3 -c 'import time; time.sleep(1.0); print({k})'" for k in range(1, 11)]
    inv, bag = write_inputs(tmp_path, commands)
    killed = broker(*run_args(inv, bag, run_dir), crash="event:task.done:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    running = {c for (c,) in query(run_dir, "SELECT t.command FROM attempts a JOIN tasks t ON t.id = a.task_id "
                                            "WHERE a.outcome = 'running'")}
    assert running, "the kill should land while attempts run"
    (tmp_path / "tasks.txt").write_text("\n".join(c for c in commands if c not in running) + "\n")

    resumed = broker(*run_args(inv, bag, run_dir))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    [event] = journal_events(run_dir, "run.bag_changed")
    assert (event["new"], event["dropped"], event["redone"]) == (0, len(running), 0)
    left = 10 - len(running)
    assert query(run_dir, "SELECT state, count(*) FROM tasks GROUP BY state ORDER BY state") == \
        [("done", left), ("dropped", len(running))]
    for (note,) in query(run_dir, "SELECT note FROM tasks WHERE state = 'dropped'"):
        assert "was running" in note
    # Their attempts were cancelled, none ran again, and nothing is left running.
    assert query(run_dir, "SELECT DISTINCT a.outcome FROM attempts a JOIN tasks t ON t.id = a.task_id "
                          "WHERE t.state = 'dropped'") == [("cancelled",)]
    assert query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'running'") == [(0,)]
    assert f"{left} done, 0 failed, 0 left of {left}" in resumed.stdout


def test_a_private_node_that_costs_money_cannot_leave_or_change_price_on_resume(tmp_path):
    """Its spend is counted from when it joined to the run's end: removing it or changing its
    price would miscount the run's spend. A free node may come and go; another goal is fine."""
    import argparse

    from broker.cli import UsageError
    from broker.cli.run_resume import prepare_resume
    from broker.config.bag import load_bag
    from broker.config.inventory import load_inventory
    from broker.core.goal import Goal
    from broker.shells.journal import Journal

    inv_text = "private:\n  - {name: paid, local: true, slots: 1, cost_per_hour: 0.5}\n" \
               "  - {name: free, local: true, slots: 1}\n"
    inv, bag_file = write_inputs(tmp_path, COMMANDS[:2])
    inv.write_text(inv_text)
    bag = load_bag(str(bag_file))
    run_dir = tmp_path / "r"
    with Journal.open(run_dir) as journal:
        record = journal.create_run("r", goal_kind="deadline", goal_value=3600.0, deadline_s=3600.0, retries=1,
                                    bag_path=str(bag_file), options={"dry_run": True, "time_scale": 60.0},
                                    tasks=bag.tasks, task_context=task_context(bag))
        for name, cost in (("paid", 0.5), ("free", 0.0)):
            journal.record_private_node(name, slots=1, cost_per_hour=cost)
    args = argparse.Namespace(dry_run=True, time_scale=None, bag=str(bag_file), inventory=str(inv))

    def resume_with(text: str, goal: Goal = Goal("deadline", 3600.0)):
        inv.write_text(text)
        with Journal.open(run_dir, readonly=True) as journal:
            return prepare_resume(args, record, journal, goal, 60.0, load_inventory(str(inv), live=False), bag,
                                  run_dir)

    plan = resume_with(inv_text.replace("  - {name: free, local: true, slots: 1}\n", ""), Goal("deadline", 7200.0))
    assert plan.goal_change == ("deadline 1h00m", "deadline 2h00m") and not plan.edit.changed
    with pytest.raises(UsageError, match="private node paid costs \\$0.50/h and .* no longer lists it"):
        resume_with(inv_text.replace("  - {name: paid, local: true, slots: 1, cost_per_hour: 0.5}\n", ""))
    with pytest.raises(UsageError, match="private node paid is billed at \\$0.50/h, and .* now says \\$0.75/h"):
        resume_with(inv_text.replace("0.5}", "0.75}"))
