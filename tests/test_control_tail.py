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

from broker.core.billing import Billing
from broker.core.control.actions import Launch, Replicate, ScheduleRelease
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.pool import TaskPool
from broker.core.control.snapshot import Goal, Memory, NodeView, Observations, RunningTask, Snapshot
from broker.core.model import MachineType

SLOW = MachineType("slow", 1, 1.0, 0.10, 10, 0.0, Billing.hourly())
FAST = MachineType("fast", 1, 20.0, 1.00, 10, 0.0, Billing.hourly())
TYPES = {"slow": SLOW, "fast": FAST}
MARGIN = ControllerConfig().margin_s


def _observations(n: int = 60) -> Observations:
    obs = Observations()
    for k in range(n):
        obs = obs.add(400.0 + 400.0 * (k % 3), None)  # mean 800 ref-s, sd ~330
    return obs


def _instance(name: str, t: MachineType, launched: float, running=(), release: float | None = None) -> NodeView:
    paid = launched + 3600.0
    return NodeView(name, 1, t.speed, tuple(running), t.name, launched, launched, paid,
                    paid - MARGIN if release is None else release)


def _decide(nodes, now: float, pending=(), memory: Memory | None = None, goal=Goal("deadline", 4 * 3600.0),
            types=TYPES):
    pool = TaskPool()
    pool.extend(pending)
    snap = Snapshot(now_s=now, types=types, nodes=tuple(nodes), pending=pool, tasks_total=100,
                    tasks_done=60, observations=_observations(), committed_usd=0.0)
    if memory is None:  # a plan was made a moment ago: this tick only dispatches and keeps
        memory = Memory(deadline_at_s=4 * 3600.0, last_plan_at_s=now - 10.0, planned_makespan_s=4 * 3600.0,
                        planned_cost_usd=1.0)
    return Controller(goal).decide(snap, memory, now, None, tick=True)


def test_an_overdue_task_keeps_its_machine_past_the_boundary():
    # started at 0 on a speed-1 machine, mean 800 ref-s: at 3,400 s it is long overdue, and
    # the release at 3,480 s would throw 3,400 s of work away
    slow = _instance("i-slow", SLOW, 0.0, [RunningTask("t1", 1, 0, 0.0, None)])
    d = _decide([slow], now=3400.0)
    kept = [a for a in d.actions if isinstance(a, ScheduleRelease) and a.instance_id == "i-slow"]
    assert kept and kept[0].at_s == 7200.0 - MARGIN and kept[0].cause == "running_task_needs_longer", d.actions


def test_a_task_expected_to_end_before_the_boundary_does_not_extend():
    # 20 s old on a speed-20 machine: a task of the mean plus 1.28 sd ends in about a minute
    fast = _instance("i-fast", FAST, 0.0, [RunningTask("t1", 1, 0, 3380.0, None)])
    d = _decide([fast], now=3400.0)
    assert not [a for a in d.actions if isinstance(a, ScheduleRelease)], d.actions


def test_an_overdue_task_is_copied_to_a_much_faster_idle_paid_slot():
    slow = _instance("i-slow", SLOW, 0.0, [RunningTask("t1", 1, 0, 0.0, None)])
    fast = _instance("i-fast", FAST, 1000.0)  # idle, paid to 4,600 s
    d = _decide([slow, fast], now=3000.0)
    copies = [a for a in d.actions if isinstance(a, Replicate)]
    assert [(c.task_id, c.slot.node) for c in copies] == [("t1", "i-fast")], d.actions


def test_no_copy_to_a_machine_less_than_twice_as_fast():
    slow = _instance("i-slow", SLOW, 0.0, [RunningTask("t1", 1, 0, 0.0, None)])
    other = _instance("i-slow2", SLOW, 1000.0)
    d = _decide([slow, other], now=3000.0)
    assert not [a for a in d.actions if isinstance(a, Replicate)], d.actions


def test_only_the_copy_on_the_machine_kept_longest_holds_a_machine():
    # t1 runs on the slow machine (release at 3,480 s) and as a copy on the fast one (paid to
    # 4,600 s): the slow one may go at its boundary, the copy carries on
    slow = _instance("i-slow", SLOW, 0.0, [RunningTask("t1", 1, 0, 0.0, None)])
    fast = _instance("i-fast", FAST, 1000.0, [RunningTask("t1", 2, 0, 3000.0, None)])
    d = _decide([slow, fast], now=3400.0)
    assert not [a for a in d.actions if isinstance(a, ScheduleRelease) and a.instance_id == "i-slow"], d.actions


def test_never_more_new_slots_than_pending_tasks():
    # Three long tasks (10 h each on a speed-1 slot) and a two-hour deadline: the planner,
    # seeing divisible work, wants all 40 machines; three can take the three tasks.
    pending = [(f"t{k}", 36_000.0) for k in range(3)]
    types = {"slow": MachineType("slow", 1, 1.0, 0.10, 40, 0.0, Billing.hourly())}
    d = _decide([], now=0.0, pending=pending, memory=Memory(), goal=Goal("deadline", 2 * 3600.0), types=types)
    launched = sum(a.count for a in d.actions if isinstance(a, Launch))
    assert launched == 3, d.actions
