"""When a goal counts as missed, by how much, and the causes told (broker/cli/verdict.py)."""

from broker.cli.verdict import RunFacts, judge


def facts(**kw):
    base = dict(makespan_s=3600.0, cost_usd=10.0, tasks_total=100, tasks_done=100)
    base.update(kw)
    return RunFacts(**base)


def test_deadline_met_and_missed():
    assert judge("deadline", 4000.0, facts()).met
    v = judge("deadline", 3000.0, facts())
    assert not v.met and v.summary == "deadline 50m00s missed by 10m00s (20.0%)"
    v = judge("deadline", 4000.0, facts(tasks_done=90))
    assert not v.met and "10 of 100 tasks not done" in v.summary


def test_deadline_causes():
    v = judge("deadline", 3000.0, facts(first_planned_makespan_s=3500.0, launches_refused=2,
                                         planned_work_ref_s=100.0, actual_work_ref_s=120.0,
                                         second_last_end_s=2900.0, last_runtime_s=1500.0, tasks_failed=1))
    text = v.text()
    assert "out of reach from the start: the fastest plan took 58m20s" in text
    assert "capacity refused: EC2 refused 2 launches" in text
    assert "estimates wrong: the bag needed 20.0% more work" in text
    assert "a straggler: all but the last task were done by 48m20s (it ran 25m00s)" in text
    assert "tasks failed: 1 never succeeded" in text
    quiet = judge("deadline", 3000.0, facts(planned_work_ref_s=120.0, actual_work_ref_s=100.0,
                                             second_last_end_s=3100.0))
    assert quiet.causes == ()  # the work was less than planned, the end was no single task


def test_budget_exceeded_or_run_out():
    assert judge("budget", 10.0, facts()).met
    v = judge("budget", 9.0, facts())
    assert not v.met and v.summary == "budget $9.00 exceeded by $1.00"
    v = judge("budget", 20.0, facts(tasks_done=70, budget_stopped=True))
    assert not v.met and v.summary == "budget $20.00 ran out with 30 of 100 tasks not done"


def test_other_goals_miss_only_with_tasks_left():
    assert judge("point", 2, facts()).met and judge(None, None, facts()).met
    v = judge("theta", 0.5, facts(tasks_done=99, tasks_failed=1))
    assert not v.met and v.text() == "goal missed: 1 of 100 tasks not done: tasks failed: 1 never succeeded"
