"""The run ledger under random sequences of events (hypothesis): whatever happens, every task
is in exactly one place (pending, running, done, given up), is done at most once, is given
up exactly when the failure rules say so (past its retries, or poison), and the counters
the snapshot shows add up."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.core.billing import Billing
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import Ledger, Quarantine
from broker.core.model import MachineType, PrivateNode

TASKS = ("a", "b", "c", "d")
C5 = MachineType("c5", 2, 1.0, 3.6, 4, 10.0, Billing.hourly())

events = st.lists(st.one_of(
    st.tuples(st.just("start"), st.sampled_from(TASKS), st.sampled_from(("p", "q", "i-1")), st.integers(0, 1),
              st.booleans()),
    st.tuples(st.just("ok"), st.integers(0, 5)),
    st.tuples(st.just("fail"), st.integers(0, 5), st.sampled_from(("exit code 1", "exit code 2", "timed out", None))),
    st.tuples(st.just("lost"), st.integers(0, 5)),
    st.tuples(st.just("node_lost"), st.sampled_from(("p", "q", "i-1")), st.booleans()),
    st.tuples(st.just("back"), st.sampled_from(("p", "q"))),
    st.tuples(st.just("release"), st.just("i-1")),
), max_size=60)


def where(led: Ledger, task: str) -> list[str]:
    places = []
    if task in led.pool:
        places.append("pending")
    if led.copies(task):
        places.append("running")
    if task in led.done:
        places.append("done")
    if task in led.quarantined:
        places.append("given up")
    return places


@settings(max_examples=300, deadline=None)
@given(script=events, retries=st.integers(0, 2))
# Found by hypothesis: a node lost with two copies of one task on it, whose first failure
# quarantined the task and cancelled the second copy: stopping that copy again was a KeyError.
@example(script=[("start", "a", "p", 0, False), ("fail", 0, "exit code 1"), ("start", "a", "i-1", 1, False),
                 ("start", "a", "p", 0, False), ("start", "a", "i-1", 0, True), ("node_lost", "i-1", False)],
         retries=1)
def test_every_task_is_in_exactly_one_place_and_given_up_only_by_the_rules(script, retries):
    policy = FailurePolicy(retries=retries, distinct_nodes=2, node_strikes=3)
    led = Ledger({"c5": C5}, policy)
    led.add_tasks([(t, None) for t in TASKS])
    for name in ("p", "q"):
        led.add_private(PrivateNode(name, 2, 1.0))
        led.on_node_ready(name, 0.0)
    led.on_launched("i-1", "c5", 0.0, 0.0, math.inf)
    led.on_node_ready("i-1", 10.0)
    done_count: dict[str, int] = {}
    failures: dict[str, int] = {}
    now = 10.0
    for event in script:
        now += 1.0
        running = [a for t in TASKS for a in led.copies(t)]
        kind = event[0]
        if kind == "start":
            _, task, node, slot, replica = event
            led.start(task, node, slot, now, replica=replica)
        elif kind in ("ok", "fail", "lost") and running:
            a = running[event[1] % len(running)]
            if kind == "ok":
                e = led.on_result(a.node, a.task_id, a.attempt, now)
                if e.outcome == "done":
                    done_count[a.task_id] = done_count.get(a.task_id, 0) + 1
            else:
                e = (led.on_attempt_failed(a.node, a.task_id, a.attempt, now, event[2]) if kind == "fail"
                     else led.on_attempt_lost(a.node, a.task_id, a.attempt, now))
                if e.verdict is not None and not e.verdict.lost:
                    failures[a.task_id] = failures.get(a.task_id, 0) + 1
                if e.verdict is not None:
                    assert e.verdict.failures == failures.get(a.task_id, 0)
                    given_up = [f for f in e.followups if isinstance(f, Quarantine)]
                    if failures.get(a.task_id, 0) > retries:
                        assert given_up, "past its retries a task is given up"
                    if given_up:
                        assert (failures.get(a.task_id, 0) > retries or "nodes" in given_up[0].reason
                                or "lost_attempts" in given_up[0].reason)
        elif kind == "node_lost":
            ended, _ = led.on_node_lost(event[1], now, comes_back=event[2] and event[1] != "i-1")
            for e in ended:  # lost with the node: no failure of the task
                assert e.verdict is None or (e.verdict.lost and e.verdict.failures == failures.get(
                    e.attempt.task_id, 0))
        elif kind == "back":
            led.on_node_back(event[1], now)
        elif kind == "release":
            led.on_released("i-1", now)
        for task in TASKS:
            assert len(where(led, task)) == 1, (task, where(led, task))
        assert all(n <= 1 for n in done_count.values())
        snap = led.snapshot(now)
        assert snap.count_running() == sum(len(v.running) for v in snap.nodes)
        assert snap.tasks_done + snap.tasks_failed + len(snap.pending) + len(
            {a.task_id for t in TASKS for a in led.copies(t)}) == len(TASKS)
        assert all(len(n.running) <= n.slots for n in led.nodes.values())
