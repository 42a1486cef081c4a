"""The broker's rules that the league measures (replan.py), decided directly on a snapshot.

- hedge later: at a deadline, buy for the work's point value (lean allowance) while the upper
  value can still be covered by capacity bought at the next re-plan; buy the hedge now when it
  cannot wait.
- an allowance that cannot be met buys no more than the deadline needs: when no plan meets the
  planning deadline (the user's pulled in by the tail allowance) or it has passed, the cheapest
  plan by the user's own deadline, not the fastest plan.
- a paid slot re-runs a task rather than a whole billing unit keeping it: with nothing pending,
  a task at its instance's release is left to a slot that stays (dispatch.RerunSlots).
"""

from __future__ import annotations

from builders import launches, machine, snapshot

from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.snapshot import Goal, Memory

EFF = machine("eff", speed=10.0, price_per_hour=0.30, limit=2)  # 120 reference-hours per dollar
SLOW = machine("slow", speed=1.0, price_per_hour=0.10, limit=10)  # 36
DEADLINE_S = 4 * 3600.0


def _first_plan(tasks: int, *, slow_limit: int = 10, goal=Goal("deadline", DEADLINE_S), **config):
    types = {"eff": EFF, "slow": machine("slow", speed=1.0, price_per_hour=0.10, limit=slow_limit)}
    snap = snapshot(pending=[(f"t{k}", 1000.0) for k in range(tasks)], types=types, tasks_done=0)
    memory = Memory(deadline_at_s=DEADLINE_S if goal.kind == "deadline" else None)
    return Controller(goal, ControllerConfig(**config)).decide(snap, memory, 0.0, None, tick=True)


def test_a_deadline_buys_the_efficient_type_for_the_point_value_and_defers_the_hedge():
    # 275 tasks of 1,000 ref-s: the two eff instances do them in 3.8 h; the upper confidence
    # value (estimates not yet checked against any finished task) needs more than they have
    assert launches(_first_plan(275)) == {"eff": 2}
    assert launches(_first_plan(275, hedge_later=False)).get("slow", 0) > 0


def test_the_hedge_is_bought_now_when_it_cannot_wait():
    # a larger bag: the one slow instance the limit allows, bought a re-plan later, no longer
    # covers the upper value (+6%: nothing finished yet to check the estimates against), so
    # the plan for it is bought at once
    assert launches(_first_plan(284, slow_limit=1)).get("slow", 0) == 1
    assert launches(_first_plan(276, slow_limit=1)) == {"eff": 2}


# -- an allowance that cannot be met buys no more than the deadline needs -------------------
def _near_boundary(memory_deadline_s: float):
    """Ten speed-1 instances paid to 3,600 s (released 120 s before), at t = 3,000 s; 60 tasks
    of 100 ref-s left (6,000 ref-s: 1,200 more than the fleet has before its releases). The
    user's deadline is 4,000 s; the planning deadline, pulled in by a tail allowance, is
    ``memory_deadline_s``."""
    from builders import node, observations, planned_memory, pool

    from broker.core.plan import Plan

    nodes = [node(f"i-{k}") for k in range(10)]
    snap = snapshot(now_s=3000.0, nodes=nodes, pending=pool([(f"p{k}", 100.0) for k in range(60)]),
                    observations=observations(60, 100.0))
    memory = planned_memory(3000.0, memory_deadline_s, tail_allowance_s=4000.0 - memory_deadline_s,
                            last_plan_at_s=2100.0, planned_makespan_s=4000.0,
                            last_plan=Plan(makespan_s=1900.0, cost_usd=1.0, fleet={"m": 10}))
    return snap, memory


def _extended(d) -> int:
    from builders import releases

    return sum(at > 3600.0 for at, _ in releases(d).values())


def test_a_passed_planning_deadline_extends_only_what_the_users_deadline_needs():
    # the planning deadline (2,000 s) has passed: the fastest plan extended every instance into
    # its second hour (thesis LM20 at List's makespan: 55 instances for 14 s of work); the
    # cheapest plan by the user's deadline extends the few the remainder needs
    from builders import decide

    snap, memory = _near_boundary(2000.0)
    d = decide(snap, goal=Goal("deadline", 4000.0), memory=memory)
    assert 1 <= _extended(d) <= 5 and launches(d) == {}


def test_an_unreachable_planning_deadline_extends_only_what_the_users_deadline_needs():
    # the planning deadline (3,400 s) is still ahead but no plan meets it
    from builders import decide

    snap, memory = _near_boundary(3400.0)
    d = decide(snap, goal=Goal("deadline", 4000.0), memory=memory)
    assert 1 <= _extended(d) <= 5 and launches(d) == {}


# -- a paid slot re-runs a task rather than a whole billing unit keeping it -----------------
def _task_at_release(b_paid_until_s: float | None):
    """Instance a (paid to 3,600 s, released at 3,480 s) runs a task of 1,000 ref-s started at
    3,000 s (expected end 4,000 s); nothing is pending; now 3,400 s. Instance b, idle, is paid to
    ``b_paid_until_s`` (None: no b)."""
    from builders import decide, node, running

    nodes = [node("a", running=[running("t1", 3000.0, estimate_ref_s=1000.0)])]
    if b_paid_until_s is not None:
        nodes.append(node("b", paid_until_s=b_paid_until_s))
    snap = snapshot(now_s=3400.0, nodes=nodes, pending=0, tasks_done=10)
    return decide(snap, goal=Goal("deadline", 4 * 3600.0))


def test_a_task_at_its_release_is_rerun_on_a_paid_idle_slot_instead_of_a_new_unit():
    # b is paid to 7,200 s and idle: re-running the task there (1,000 s from the next decision)
    # costs nothing; keeping a costs another hour
    from builders import releases

    assert "a" not in releases(_task_at_release(7200.0))


def test_a_task_at_its_release_keeps_its_instance_when_no_paid_slot_can_rerun_it():
    from builders import releases

    assert releases(_task_at_release(None))["a"][0] > 3600.0  # kept another unit
    assert releases(_task_at_release(4500.0))["a"][0] > 3600.0  # b leaves too soon


def _task_at_release_with_private(b_paid_until_s: float | None, private_speed: float = 1.0):
    """``_task_at_release`` with an idle private node (1 slot, ``private_speed``) next to a and b."""
    from builders import decide, node, running

    nodes = [node("a", running=[running("t1", 3000.0, estimate_ref_s=1000.0)]),
             node("own", private=True, speed=private_speed)]
    if b_paid_until_s is not None:
        nodes.append(node("b", type=machine("slow", speed=0.01), paid_until_s=b_paid_until_s))
    snap = snapshot(now_s=3400.0, nodes=nodes, pending=0, tasks_done=10)
    return decide(snap, goal=Goal("deadline", 4 * 3600.0))


def test_a_task_at_its_release_is_not_rerun_on_a_private_node_past_the_paid_fleets_end():
    # Bounded by the deadline alone, a private node re-ran from scratch the tasks of every
    # instance at its release: on lognormal sigma 1.5 (bench/promises.py) tasks 2.4 ref-h into
    # their run on a speed-2.5 instance were re-run at speed 1, the run ended at 14.4 h instead
    # of 8.5 h (seed 3) and past the 16.5 h deadline on seeds 14 and 20. With no paid instance
    # staying, a re-run there (1,000 ref-s from 3,400 s) would end after a's task would have.
    from builders import releases

    assert releases(_task_at_release_with_private(None))["a"][0] > 3600.0  # kept another unit


def test_a_private_node_reruns_a_task_that_ends_before_the_paid_fleet_leaves():
    # b (too slow to re-run anything) is paid to 7,200 s: the private node's re-run ends by then
    from builders import releases

    assert "a" not in releases(_task_at_release_with_private(7200.0))


def test_a_fast_private_node_reruns_a_task_that_ends_before_it_would_where_it_runs():
    # no paid instance stays, but at speed 10 the re-run (100 s from the next decision) ends
    # before a's task would (4,000 s): no unit bought, the run no longer
    from builders import releases

    assert "a" not in releases(_task_at_release_with_private(None, private_speed=10.0))


def test_thesis_lm20_at_lists_makespan_costs_no_more_than_list():
    # issue 15's league, LM20 --quick (2,000 tasks, estimates within 10%, seed 1): List_eta on the
    # 41 efficient machines takes 1.11 h for $33.36; given that makespan as its deadline the broker
    # used to run the fastest plan once the tail allowance could not be met, keeping all 55
    # instances a second hour for 14 s of work ($45.64)
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from scenarios import LeagueScenario

    from broker.core.control.controller import ControllerConfig
    from broker.sim.engine import SimOptions, Simulation

    scn = LeagueScenario("LM20", "thesis", "LM", 2000, 20)

    def simulate(goal, **config):
        return Simulation(scn.inventory(), scn.workload(1), goal, ControllerConfig(tick_s=scn.tick_s, **config),
                          SimOptions(seed=1)).run()

    listed = simulate(Goal("none", None), policy="list", eta=41)
    broker = simulate(Goal("deadline", round(listed.makespan_s, 1)))
    assert broker.tasks_done == 2000 and broker.makespan_s <= round(listed.makespan_s, 1)
    assert broker.cost_usd <= 1.01 * listed.cost_usd, (broker.cost_usd, listed.cost_usd)


def test_a_passed_deadline_buys_the_cheapest_plan_ending_within_a_replan_gap_of_the_fastest():
    # the deadline passed a minute ago; 40 tasks of about 100 ref-s are left and 20 speed-1
    # instances may be bought. The fastest plan buys all 20 (two tasks each, about 200 s); an
    # end 5 minutes later (the controller's shortest re-plan gap) needs 8-10 (four or five
    # tasks each), for half the money. It used to buy all 20 (thesis LM20 at the knee without
    # its promise: 76 instances for 6 reference-hours left, $23, to end a minute sooner)
    from builders import DEADLINE_S, decide, observations, planned_memory

    snap = snapshot(now_s=DEADLINE_S + 60.0, nodes=[], pending=40, observations=observations(60, 100.0),
                    types={"m": machine(limit=20)})
    d = decide(snap, memory=planned_memory(DEADLINE_S + 60.0, last_plan_at_s=0.0))
    bought = launches(d)
    assert 8 <= bought.get("m", 0) <= 10, bought
    # with no slack asked for, the fastest plan as before
    d = decide(snap, memory=planned_memory(DEADLINE_S + 60.0, last_plan_at_s=0.0), min_replan_gap_s=0.0)
    assert launches(d).get("m", 0) == 20
