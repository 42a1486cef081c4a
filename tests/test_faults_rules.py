"""The core's failure rules (broker/core/control/failures.py): retry, quarantine, bad nodes,
types avoided after capacity errors."""

import pytest

from broker.core.billing import Billing
from broker.core.control.failures import FailureBook, FailurePolicy, Outcome, TypeCooldown
from broker.core.model import MachineType


def test_a_task_is_retried_exactly_retries_times_then_quarantined():
    book = FailureBook(FailurePolicy(retries=2, distinct_nodes=0))
    verdicts = [book.failed("t1", "n1", "exit code 1") for _ in range(3)]
    assert [v.outcome for v in verdicts] == [Outcome.RETRY, Outcome.RETRY, Outcome.QUARANTINE]
    assert [v.retries_left for v in verdicts] == [2, 1, 0]
    assert verdicts[-1].reason == "failed 3 times (retries: 2)"
    assert book.is_quarantined("t1") and not book.is_quarantined("t2")


def test_zero_retries_quarantines_at_the_first_failure():
    book = FailureBook(FailurePolicy(retries=0))
    assert book.failed("t", "n", None).quarantined


def test_the_same_error_on_two_nodes_quarantines_before_retries_run_out():
    book = FailureBook(FailurePolicy(retries=5, distinct_nodes=2))
    assert not book.failed("t", "a", "exit code 2").quarantined
    assert not book.failed("t", "a", "exit code 2").quarantined  # same node again: not evidence
    assert not book.failed("t", "b", "timed out").quarantined  # another error
    v = book.failed("t", "b", "exit code 2")
    assert v.quarantined and v.reason == "exit code 2 on 2 nodes (a, b)"


def test_lost_attempts_count_against_no_retries_and_have_a_bound_of_their_own():
    book = FailureBook(FailurePolicy(retries=0, distinct_nodes=2, lost_attempts=3))
    verdicts = [book.lost("t", n) for n in "abc"]
    assert [v.quarantined for v in verdicts] == [False, False, False]
    assert all(v.lost and v.failures == 0 and v.retries_left == 1 for v in verdicts)
    assert book.failures.get("t") is None and book.losses["t"] == 3
    v = book.lost("t", "d")  # the fourth: a task that may be what brings its nodes down
    assert v.quarantined and v.reason.startswith("lost with its node or agent 4 times (lost_attempts: 3)")
    assert book.failed("u", "a", "exit code 1").quarantined  # retries: 0 still holds for errors


def test_lost_attempts_neither_make_a_task_poison_nor_a_node_bad():
    book = FailureBook(FailurePolicy(retries=9, distinct_nodes=2, node_strikes=2))
    book.succeeded("b")
    assert not any(book.lost(t, "a").bad_node for t in ("t1", "t2", "t3"))
    assert book.bad_nodes == set() and book.quarantined == {}


def test_a_node_failing_task_after_task_while_others_finish_is_a_bad_node():
    book = FailureBook(FailurePolicy(retries=9, node_strikes=3))
    book.failed("t1", "bad", "exit code 127")
    book.succeeded("good")
    assert not book.failed("t2", "bad", "exit code 127").bad_node
    v = book.failed("t3", "bad", "exit code 127")
    assert v.bad_node and book.bad_nodes == {"bad"}
    assert not book.failed("t4", "bad", "exit code 127").bad_node  # reported once


def test_no_node_is_blamed_when_the_same_tasks_fail_alike_everywhere():
    book = FailureBook(FailurePolicy(retries=9, node_strikes=2))
    for t in range(10):
        book.failed(f"t{t}", "b", "exit code 1")
        book.failed(f"t{t}", "a", "exit code 1")
    assert book.bad_nodes == set()


def test_a_node_failing_fast_before_anything_finished_is_bad_if_its_failures_are_its_own():
    book = FailureBook(FailurePolicy(retries=9, node_strikes=3))
    book.failed("t1", "fast", "exit code 127")
    book.failed("t2", "fast", "exit code 127")
    assert book.failed("t3", "fast", "exit code 127").bad_node


def test_a_success_on_the_node_ends_its_streak():
    book = FailureBook(FailurePolicy(retries=9, node_strikes=2))
    book.succeeded("other")
    book.failed("t0", "other", "exit code 1")  # every failure on n is also seen elsewhere
    book.failed("t2", "other", "exit code 1")
    book.failed("t3", "other", "exit code 1")
    book.failed("t1", "n", "exit code 1")
    book.succeeded("n")
    assert not book.failed("t2", "n", "exit code 1").bad_node
    book.succeeded("other")  # others must finish work *during* the streak
    assert book.failed("t3", "n", "exit code 1").bad_node


@pytest.mark.parametrize("bad", [dict(retries=-1), dict(distinct_nodes=1), dict(node_strikes=-2),
                                 dict(type_cooldown_s=-1.0)])
def test_policy_refuses_meaningless_settings(bad):
    with pytest.raises(ValueError):
        FailurePolicy(**bad)


def test_an_avoided_type_keeps_its_instances_and_gets_no_room_until_the_cooldown_ends():
    types = {"a": MachineType("a", 2, 1.0, 0.1, 5, 0.0, Billing.hourly()),
             "b": MachineType("b", 2, 1.0, 0.2, 5, 0.0, Billing.hourly())}
    cool = TypeCooldown(600.0)
    assert cool.restrict(types, ["a"], 0.0) is types
    cool.refused("a", 100.0)
    seen = cool.restrict(types, ["a", "b", "b"], 200.0)
    assert seen["a"].limit == 1 and seen["b"].limit == 5
    assert cool.restrict(types, {"a": 0}, 699.0)["a"].limit == 0
    assert cool.restrict(types, [], 700.0) is types


def test_the_last_node_is_never_blamed():
    book = FailureBook(FailurePolicy(retries=9, node_strikes=2))
    assert not any(book.failed(f"t{i}", "only", "exit code 1", others=0).bad_node for i in range(5))


def test_a_run_with_nowhere_to_run_gives_up_only_when_nothing_more_can_be_bought():
    from broker.core.control.failures import IDLE_TICKS_TO_GIVE_UP, may_give_up

    rule = dict(tick_s=60.0, replan_every_s=600.0)
    # never within the first ticks, whatever the budget says
    assert not may_give_up(IDLE_TICKS_TO_GIVE_UP, budget_stopped=True, types_avoided=False, **rule)
    # the budget has stopped: at once after them
    assert may_give_up(IDLE_TICKS_TO_GIVE_UP + 1, budget_stopped=True, types_avoided=True, **rule)
    # a re-plan may still buy: wait a whole re-plan interval, and for avoided types to return
    assert not may_give_up(IDLE_TICKS_TO_GIVE_UP + 1, budget_stopped=False, types_avoided=False, **rule)
    assert may_give_up(12, budget_stopped=False, types_avoided=False, **rule)
    assert not may_give_up(100, budget_stopped=False, types_avoided=True, **rule)
