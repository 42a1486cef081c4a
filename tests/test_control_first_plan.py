"""The first plan of a deadline run is carried out as solved: it is what the run promised."""

from __future__ import annotations

from broker.core.control.snapshot import Goal, Memory, Observations
from broker.core.model import PrivateNode
from tests.builders import decide, launches, machine, node, snapshot


def test_the_first_deadline_plan_launches_what_it_needs_even_when_less_work_would_not():
    """Regression (a dry run of 39 quarter-second tasks, --deadline 5m): the first plan
    needed one m5.large, the hysteresis check (would a plan for 10% less work launch too?)
    said no, nothing was launched, and the run missed its deadline with the plan table
    showing the instance. The first plan has no earlier decision to flip-flop against."""
    obs = Observations()
    for k in range(8):
        obs = obs.add(15.0 + 0.01 * k, None)
    m5 = machine("m5.large", slots=2, speed=1.2, price_per_hour=0.096, limit=10, boot_s=5.0)
    private = PrivateNode("local", 2, 1.0, 0.0, local=True)
    snap = snapshot(now_s=134.0, nodes=[node("local", private=True, slots=2)], pending=26, tasks_done=8,
                    types={"m5.large": m5}, observations=obs)
    d = decide(snap, goal=Goal("deadline", 300.0), memory=Memory(), private=[private])
    assert launches(d) == {"m5.large": 1}
