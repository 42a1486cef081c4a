"""The stall watch for private nodes not reached yet (issue 18, item 2), with plain objects.

A private node being attached in the background is neither ready nor lost: the run waits
for it however long that takes (its grace is the shell's to count). Once every node of a
private-only inventory is lost, nothing can come (there is no type to rent), so the run
ends after the idle ticks instead of waiting out a re-plan interval for instances it can
never buy.
"""

from __future__ import annotations

from broker.core.control.failures import IDLE_TICKS_TO_GIVE_UP
from broker.core.control.ledger import Ledger
from broker.core.model import PrivateNode
from tests.test_ledger import TYPES


def _private_only(*names: str, types=None) -> Ledger:
    led = Ledger(types or {}, tick_s=2.0, replan_every_s=900.0)
    led.add_tasks([("a", None), ("b", None)])
    for name in names:
        led.add_private(PrivateNode(name, 2, 1.0, 0.0))
    return led


def test_a_run_waits_for_private_nodes_still_being_attached():
    led = _private_only("h0", "h1")  # neither ready nor lost: being tried in the background
    assert not any(led.on_tick(2.0 * k) for k in range(1, 1000))


def test_a_private_only_run_whose_nodes_are_all_lost_ends_after_the_idle_ticks():
    led = _private_only("h0", "h1")
    led.on_node_lost("h0", 1.0)
    assert not led.on_tick(2.0)  # h1 is still being tried
    led.on_node_lost("h1", 3.0)
    ticks = [led.on_tick(2.0 * k) for k in range(2, 2 + IDLE_TICKS_TO_GIVE_UP + 2)]
    assert ticks == [False] * IDLE_TICKS_TO_GIVE_UP + [True, True]


def test_with_a_type_to_rent_the_run_still_waits_a_replan_interval():
    led = _private_only("h0", types=TYPES)
    led.on_node_lost("h0", 1.0)
    assert not any(led.on_tick(2.0 * k) for k in range(1, 400))  # 800 s < 900 s + a tick
    assert any(led.on_tick(2.0 * k) for k in range(400, 460))
