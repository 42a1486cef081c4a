"""Spot interruptions in the simulator: the world's side of ``ledger/spot.py``.

- **Independent interruptions.** Each spot instance is interrupted after a time drawn from
  an exponential law of rate ``interruptions_per_hour x rate_scale`` from its launch (a
  Poisson process per instance, at its type's rate; the first event ends it). EC2's
  two-minute notice (``notice_s``) comes that long before the instance goes: the ledger is
  told the notice (``on_interruption_notice``) and then the termination
  (``on_interrupted``). An instance the broker released before its time is not interrupted.
- **Correlated loss.** A whole spot type is lost at once: at ``loss_at_s``, and/or at the
  times of a Poisson process of ``loss_rate_per_hour`` over the run. Every live instance of
  the type (``loss_type``; default: the spot type with the most live instances then) gets
  its notice at that moment and goes ``notice_s`` later, and EC2 has no capacity for the
  type for ``capacity_back_after_s``: every launch of it is refused for capacity meanwhile
  (the ledger cools the type down, the plan goes around it).

Draws come from a generator of their own (seeded from the run's seed), so turning spot
interruptions on shifts no other draw of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.model import MachineType

if TYPE_CHECKING:
    from .engine import Simulation

NOTICE, INTERRUPT, TYPE_LOSS = 8, 9, 10  # event kinds, after the engine's own
SPOT_FAULT_KINDS = ("spot_notice", "spot_interruption", "spot_type_loss", "spot_capacity")


@dataclass(frozen=True, slots=True)
class SpotFaults:
    rate_scale: float = 1.0  # x each spot type's interruptions_per_hour (0: no independent interruptions)
    notice_s: float = 120.0  # EC2's notice before it takes the instance
    loss_at_s: float | None = None  # a whole spot type is lost at this virtual time
    loss_rate_per_hour: float = 0.0  # ... or at the events of a Poisson process of this rate
    loss_type: str | None = None  # which type (None: the spot type with the most live instances)
    capacity_back_after_s: float = 3600.0  # launches of a lost type are refused this long

    def __post_init__(self) -> None:
        for name in ("rate_scale", "notice_s", "loss_rate_per_hour", "capacity_back_after_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.loss_at_s is not None and not self.loss_at_s >= 0:
            raise ValueError(f"loss_at_s must be >= 0, got {self.loss_at_s!r}")


class SpotWorld:
    """The spot market as one simulation plays it (see the module docstring)."""

    def __init__(self, sim: Simulation, faults: SpotFaults, seed: int) -> None:
        self.sim, self.faults = sim, faults
        self.rng = np.random.default_rng(seed + 3_000_017)
        self.refused_until: dict[str, float] = {}  # type -> no capacity before this time
        self.active = any(t.is_spot for t in sim.types.values())

    def start(self) -> None:
        """Schedule the correlated losses (the run starts at 0)."""
        if not self.active:
            return
        f = self.faults
        if f.loss_at_s is not None:
            self.sim._push(f.loss_at_s, TYPE_LOSS, f.loss_type)
        self._next_loss(0.0)

    def _next_loss(self, now: float) -> None:
        rate = self.faults.loss_rate_per_hour
        if rate > 0:
            self.sim._push(now + self.rng.exponential(3600.0 / rate), TYPE_LOSS, ("rate", self.faults.loss_type))

    def launched(self, node_id: str, t: MachineType) -> None:
        """A spot instance started: draw when EC2 interrupts it."""
        rate = t.interruptions_per_hour * self.faults.rate_scale
        if not t.is_spot or rate <= 0:
            return
        now = self.sim.now
        at = now + self.rng.exponential(3600.0 / rate)
        self.sim._push(at, NOTICE, (node_id, at + self.faults.notice_s))

    def refuses(self, type_name: str, now: float) -> bool:
        """Whether EC2 has no capacity for the type now (a correlated loss)."""
        return self.refused_until.get(type_name, -math.inf) > now

    # -- events --------------------------------------------------------------------------
    def on_notice(self, data) -> bool:
        node_id, terminate_at = data
        sim = self.sim
        node = sim.ledger.nodes.get(node_id)
        if node is None or node.terminated_at_s is not None or node.notice_at_s is not None:
            return False
        sim.result.faults["spot_notice"] += 1
        sim._carry_out(sim.ledger.on_interruption_notice(node_id, sim.now, terminate_at))
        sim._push(terminate_at, INTERRUPT, node_id)
        return True

    def on_interrupt(self, node_id: str) -> bool:
        sim = self.sim
        node = sim.ledger.nodes.get(node_id)
        if node is None or node.terminated_at_s is not None:
            return False  # the broker released it first
        sim.result.faults["spot_interruption"] += 1
        sim.result.releases.append({
            "instance": node.id, "type": node.type.name, "at_s": sim.now,
            "paid_until_s": node.type.billing.paid_until(node.launched_at_s, sim.now),
            "cause": "spot_interrupted", "launched_at_s": node.launched_at_s,
        })
        sim._carry_out(sim.ledger.on_interrupted(node_id, sim.now))
        return True

    def on_type_loss(self, data) -> bool:
        sim = self.sim
        if isinstance(data, tuple):  # from the Poisson process: schedule the next one
            self._next_loss(sim.now)
            data = data[1]
        name = data if data is not None else self._most_used()
        if name is None or name not in sim.types or not sim.types[name].is_spot:
            return False
        sim.result.faults["spot_type_loss"] += 1
        self.refused_until[name] = sim.now + self.faults.capacity_back_after_s
        changed = False
        for node in list(sim.ledger.live_nodes()):
            if node.type is not None and node.type.name == name:
                changed |= self.on_notice((node.id, sim.now + self.faults.notice_s))
        return changed

    def _most_used(self) -> str | None:
        counts = {name: self.sim.ledger.live_count(name) for name, t in self.sim.types.items() if t.is_spot}
        return max(sorted(counts), key=lambda n: counts[n], default=None)

    def report(self) -> dict:
        """What ``SimResult.spot`` carries: the ledger's counts and the spend by market."""
        ledger = self.sim.ledger
        out = ledger.spot_counts.to_json()
        out["cost_usd_by_market"] = {k: round(v, 4) for k, v in ledger.spot_cost_usd(self.sim.now).items()}
        out["rates"] = ledger.spot_rates(self.sim.now)  # interruptions seen, declared and learned rates
        return out
