"""The end of a run, decided directly (no simulator): a task that has outrun its expected
size is neither killed at a release nor left alone on a slow machine, and the fleet never
grows past the tasks there are to run.

These are the rules that, on the thesis's LM bag without estimates (100,000 tasks, 200
machines, best-makespan point), took the run from 20.1 h / $1,219 (promised 18.7 h /
$1,170; 238-338 launches) to 19.3 h / $1,170 (200 launches): before, all 200 machines went
at a billing boundary with 28 long tasks still on them, and 50 fresh c1.xlarge were bought
for the 23 tasks that came back.
"""

from __future__ import annotations

from broker.core.control.snapshot import Goal, Memory
from tests.builders import MARGIN_S, copies, decide, launches, machine, node, releases, running, snapshot

SLOW = machine("slow", speed=1.0, price_per_hour=0.10)
FAST = machine("fast", speed=20.0, price_per_hour=1.00)
TYPES = {"slow": SLOW, "fast": FAST}


def _decide(nodes, now: float, pending=(), memory: Memory | None = None, goal=Goal("deadline", 4 * 3600.0),
            types=TYPES):
    """A tick a moment after a plan (unless ``memory`` says otherwise): dispatch and keep."""
    snap = snapshot(now_s=now, types=types, nodes=nodes, pending=list(pending), tasks_total=100)
    return decide(snap, goal=goal, memory=memory)


def test_an_overdue_task_keeps_its_machine_past_the_boundary():
    # started at 0 on a speed-1 machine, mean 800 ref-s: at 3,400 s it is long overdue, and
    # the release at 3,480 s would throw 3,400 s of work away
    slow = node("i-slow", type=SLOW, running=[running("t1", 0.0)])
    d = _decide([slow], now=3400.0)
    assert releases(d) == {"i-slow": (7200.0 - MARGIN_S, "running_task_needs_longer")}, d.actions


def test_a_task_expected_to_end_before_the_boundary_does_not_extend():
    # 20 s old on a speed-20 machine: a task of the mean plus 1.28 sd ends in about a minute
    fast = node("i-fast", type=FAST, running=[running("t1", 3380.0)])
    d = _decide([fast], now=3400.0)
    assert releases(d) == {}, d.actions


def test_an_overdue_task_is_copied_to_a_much_faster_idle_paid_slot():
    slow = node("i-slow", type=SLOW, running=[running("t1", 0.0)])
    fast = node("i-fast", type=FAST, launched_at_s=1000.0)  # idle, paid to 4,600 s
    d = _decide([slow, fast], now=3000.0)
    assert copies(d) == {"t1": "i-fast"}, d.actions


def test_no_copy_to_a_machine_less_than_twice_as_fast():
    slow = node("i-slow", type=SLOW, running=[running("t1", 0.0)])
    other = node("i-slow2", type=SLOW, launched_at_s=1000.0)
    d = _decide([slow, other], now=3000.0)
    assert copies(d) == {}, d.actions


def test_only_the_copy_on_the_machine_kept_longest_holds_a_machine():
    # t1 runs on the slow machine (release at 3,480 s) and as a copy on the fast one (paid to
    # 4,600 s): the slow one may go at its boundary, the copy carries on
    slow = node("i-slow", type=SLOW, running=[running("t1", 0.0)])
    fast = node("i-fast", type=FAST, launched_at_s=1000.0, running=[running("t1", 3000.0, attempt=2)])
    d = _decide([slow, fast], now=3400.0)
    assert "i-slow" not in releases(d), d.actions


def test_never_more_new_slots_than_pending_tasks():
    # Three long tasks (10 h each on a speed-1 slot) and a two-hour deadline: the planner,
    # seeing divisible work, wants all 40 machines; three can take the three tasks.
    pending = [(f"t{k}", 36_000.0) for k in range(3)]
    types = {"slow": machine("slow", limit=40)}
    d = _decide([], now=0.0, pending=pending, memory=Memory(), goal=Goal("deadline", 2 * 3600.0), types=types)
    assert launches(d) == {"slow": 3}, d.actions
