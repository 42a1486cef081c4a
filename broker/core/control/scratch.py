"""Per-decision working state, shared by the passes of one ``Controller.decide`` call."""

from __future__ import annotations

from dataclasses import dataclass, field

from .actions import Action
from .snapshot import NodeView


@dataclass
class Scratch:
    """What the passes of one decision have done so far (never leaves ``decide``)."""

    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    used_slots: set[tuple[str, int]] = field(default_factory=set)  # slots given work in this decision
    release: dict[str, float] = field(default_factory=dict)  # releases changed by this decision
    launched_usd: float = 0.0
    remaining: object | None = None  # the decision's RemainingWork: tick decisions only (None: not computed)

    def release_of(self, node: NodeView) -> float | None:
        return self.release.get(node.id, node.release_at_s)
