"""Typed, immutable domain objects shared by every part of the broker.

Units live in names: ``*_s`` seconds, ``*_usd`` dollars, ``*_per_hour`` USD per hour.
Work is measured in *reference seconds*: seconds of a task on one slot of speed 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .billing import Billing


ON_DEMAND = "on-demand"
SPOT = "spot"
MARKETS = (ON_DEMAND, SPOT)


def spot_key(ec2_type: str) -> str:
    """The broker's name for the spot offer of ``ec2_type``."""
    return f"{ec2_type}@{SPOT}"


@dataclass(frozen=True, slots=True)
class MachineType:
    """A rentable (public cloud) instance type.

    ``slots`` tasks run at once per instance, each at ``speed`` reference seconds per second.
    ``limit`` caps how many instances of the type may run at once; ``boot_s`` is launch to ready.
    ``pending_timeout_s``: an instance EC2 still shows ``pending`` this long after its launch
    is terminated and counted as a launch failure of the type.

    ``market``: ``on-demand`` or ``spot``. A spot entry's ``name`` is its key everywhere in
    the broker (plans, ledger, journal): the EC2 type with ``@spot`` appended, so that the
    same EC2 type may be offered once per market (:func:`spot_key`); ``ec2_type`` is what
    ``RunInstances`` is asked for (:attr:`instance_type`). ``price_per_hour`` of a spot entry
    is the price the plan counts on (the inventory's ``price``, else its ``max_price``);
    ``max_price_per_hour`` is the cap sent to EC2 (``None``: EC2's default, the on-demand
    price). ``interruptions_per_hour`` is the rate of a Poisson process of interruptions per
    running instance (0 for on-demand).
    """

    name: str
    slots: int
    speed: float
    price_per_hour: float
    limit: int
    boot_s: float = 0.0
    billing: Billing = field(default_factory=Billing.hourly)
    pending_timeout_s: float = 600.0
    market: str = ON_DEMAND
    ec2_type: str = ""
    interruptions_per_hour: float = 0.0
    max_price_per_hour: float | None = None

    @property
    def instance_type(self) -> str:
        """The EC2 instance type to launch (``c5.xlarge`` for the key ``c5.xlarge@spot``)."""
        return self.ec2_type or self.name

    @property
    def is_spot(self) -> bool:
        return self.market == SPOT

    @property
    def capacity_per_s(self) -> float:
        """Reference seconds of work one instance does per wall second (all slots busy)."""
        return self.slots * self.speed

    @property
    def unit_cost_usd(self) -> float:
        return self.billing.unit_cost_usd(self.price_per_hour)

    @property
    def efficiency(self) -> float:
        """Work per dollar (reference seconds per USD); +inf for free machines."""
        if self.price_per_hour <= 0:
            return float("inf")
        return self.capacity_per_s * 3600.0 / self.price_per_hour


@dataclass(frozen=True, slots=True)
class PrivateNode:
    """A machine the user owns: always on, no billing unit, an amortized hourly cost."""

    name: str
    slots: int
    speed: float = 1.0
    cost_per_hour: float = 0.0
    local: bool = False
    host: str | None = None
    user: str | None = None
    key: str | None = None
    port: int = 22
    known_hosts: str | None = None  # the node's host keys (default ~/.ssh/known_hosts)
    # A node that stops answering is reconnected to, its slots held, for this long; then
    # its attempts are re-queued (it still rejoins whenever it answers again).
    grace_s: float = 600.0
    # The node's agent stops its tasks and exits after this long without a master; a
    # finished run's state stays on the node this long once its results are safe.
    lease_s: float = 3600.0
    keep_s: float = 0.0

    @property
    def capacity_per_s(self) -> float:
        return self.slots * self.speed


@dataclass(frozen=True, slots=True)
class Inventory:
    """The nodes and types a run may use. ``aws`` carries the config's connection settings
    (:class:`broker.config.aws.AwsSettings`, always set by the inventory loader) to the shells
    that rent; the core never reads it, so plans and simulations leave it ``None``."""

    private: tuple[PrivateNode, ...] = ()
    types: tuple[MachineType, ...] = ()
    aws: object = None
    source: str | None = None

    def type_named(self, name: str) -> MachineType:
        for t in self.types:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Task:
    """One task of a bag. ``estimates_s`` maps an estimation tool's name to its guess (ref s)."""

    id: str
    command: str
    params: Mapping[str, object] = field(default_factory=dict)
    estimates_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bag:
    tasks: tuple[Task, ...]
    timeout_s: float
    retries: int = 2
    setup: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    outputs: str | None = None
    name: str = "bag"
    source: str | None = None

    def __len__(self) -> int:
        return len(self.tasks)


@dataclass(frozen=True, slots=True)
class ExistingInstance:
    """An instance already running (or booting) that a re-plan must take into account.

    Times are on the same clock as the planner's ``now``.
    """

    id: str
    type_name: str
    launched_at_s: float
    paid_until_s: float
    ready_at_s: float | None = None  # when it can take work; None = already ready
