"""Whether a run may rent EC2 instances at all: the one rule every part asks.

``broker run`` asks it to decide whether the run needs an AWS section, credentials and the
preflight (``broker/shells/aws/preflight.py``), ``broker down`` and a resume whether there
can be anything on EC2 to look at. A run may rent when the inventory lists a type it may
run (``limit`` above 0) and the goal can pay for one: a budget smaller than the first
billing unit of every such type never begins one (the controller never begins a unit the
budget cannot pay). Any other goal may rent, even one whose first plan runs on the private
nodes alone: re-plans defend the promise with EC2 when the work turns out longer.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from broker.core.goal import Goal
from broker.core.model import Inventory, MachineType


def first_unit_usd(machine: MachineType) -> float:
    """What beginning one instance of ``machine`` commits: its first billed time."""
    return machine.billing.cost_usd(0.0, machine.price_per_hour)


def why_no_ec2(inventory: Inventory, goal: Goal | None = None) -> str | None:
    """Why a run of ``inventory`` towards ``goal`` can never rent an instance (a sentence), or
    ``None`` when it may. ``goal=None``: any goal (``broker validate``)."""
    rentable = [t for t in inventory.types if t.limit > 0]
    if not rentable:
        return ("the inventory lists no EC2 type" if not inventory.types
                else "every EC2 type of the inventory has limit 0")
    if goal is not None and goal.kind == "budget" and goal.value is not None:
        cheapest = min(first_unit_usd(t) for t in rentable)
        if goal.value < cheapest:
            return (f"a budget of ${goal.value:g} cannot pay the first billing unit of any EC2 type "
                    f"(the cheapest costs ${cheapest:.4g})")
    return None


def ec2_needed(inventory: Inventory, goal: Goal | None = None) -> bool:
    """Whether a run of ``inventory`` towards ``goal`` may rent EC2 instances (see the module)."""
    return why_no_ec2(inventory, goal) is None
