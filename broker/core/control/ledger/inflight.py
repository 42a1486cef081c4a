"""Launches in flight: a RunInstances sent whose answer has not come back yet (part of
:class:`~.ledger.Ledger`; its state is the ledger's).

The shell calls EC2 off its loop, so a launch is decided at one moment and answered at
another. In between, the launch holds one *placeholder* node per instance asked for
(``<client token>#<k>``): booting, of its type, charged its first billing unit and given
the launch's planned release, exactly as a launched instance would be. So, for every rule
that reads the snapshot, a launch in flight is committed spend (the budget cap counts it)
and part of the fleet (a plan does not order it a second time); nothing is ever dispatched
to it (it never becomes ready). When EC2 answers, the placeholders are voided: their charge
is refunded and they vanish from the ledger; the instances EC2 did launch are then added by
:meth:`~.ledger.Ledger.on_launched` with the placeholders' release (which a re-plan may have
moved meanwhile), and a failure is told to :meth:`~.ledger.Ledger.on_launch_failed`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from ..actions import ScheduleRelease
from ..causes import ReleaseCause
from .records import NodeRecord

PLACEHOLDER_SEP = "#"


def is_placeholder(node_id: str) -> bool:
    """Whether ``node_id`` names a launch in flight rather than an instance."""
    return PLACEHOLDER_SEP in node_id


@dataclass(frozen=True, slots=True)
class Voided:
    """A placeholder given up when its launch was answered: the release it carried."""

    node_id: str
    launched_at_s: float  # when the launch was sent
    release_at_s: float | None
    release_cause: str | None
    released: bool  # the controller released it while it was in flight (stop, bag done)


class InflightMixin:
    # -- launches in flight ------------------------------------------------------------------
    def on_launch_sent(self, token: str, type_name: str, count: int, now: float,
                       release_after_s: float = math.inf) -> list[ScheduleRelease]:
        """A RunInstances for ``count`` instances went out under ``token``: one placeholder
        each, as if launched ``now`` (see the module docstring). Returns their planned
        releases (none without a planned life)."""
        from .ledger import planned_life_s

        t = self.types[type_name]
        out = []
        for k in range(1, count + 1):
            node = NodeRecord(f"{token}{PLACEHOLDER_SEP}{k}", t.slots, t.speed, type=t, launched_at_s=now,
                              expected_ready_s=now + t.boot_s)
            self._add(node)
            self._refresh_billing(node, now)
            heapq.heappush(self._booting, (node.expected_ready_s, node.id))  # overdue: late, never dispatched to
            if math.isfinite(release_after_s):
                release = self.schedule_release(node.id, now + planned_life_s(t, release_after_s),
                                                 ReleaseCause.PLANNED_LIFE, now)
                if release is not None:
                    out.append(release)
        self.inflight[token] = count
        return out

    def on_launch_answered(self, token: str) -> list[Voided]:
        """EC2 answered the launch under ``token``: its placeholders are voided (their charge
        refunded), in order; what each carried is returned for the instances that replace
        them."""
        count = self.inflight.pop(token, 0)
        out = []
        for k in range(1, count + 1):
            node = self.nodes.pop(f"{token}{PLACEHOLDER_SEP}{k}", None)
            if node is None:
                continue
            released = node.terminated_at_s is not None
            if not released:
                self._live.pop(node.id, None)
                self._cloud_live.pop(node.id, None)
                self._live_by_type[node.type.name] -= 1
                self._live_usd -= node.charged_usd
                if node.alive:
                    self._alive -= 1
            else:
                self._closed_usd -= node.cost_usd(node.terminated_at_s)
            for index in (self._late, self._dirty, self._views, self._free):
                index.pop(node.id, None)
            self._free_index.drop(node.id)
            if not self._cloud_live:
                self._live_usd = 0.0
            out.append(Voided(node.id, node.launched_at_s, node.release_at_s, node.release_cause, released))
        return out

    def on_pending_timeout(self, instance_id: str, now: float) -> tuple[float | None, list]:
        """EC2 still shows the instance ``pending`` past its type's ``pending_timeout``: a
        launch failure. It counts towards the type's :data:`~.ledger.BROKEN_AFTER` (when it
        never came up) and puts the type on the timeout cooldown; the instance is lost and
        released now (its attempts, if any, re-queued). Returns the cooldown's end and the
        followups (its release)."""
        node = self.nodes.get(instance_id)
        if node is None or node.type is None or node.terminated_at_s is not None:
            return None, []
        self._never_came_up(node, now)
        until = self.on_launch_failed(node.type.name, now, "timeout")
        followups = list(self.cancel_running(instance_id, "pending_timeout", now)) if node.running else []
        self._set_lost(node)
        return until, followups + [self._release_now(node, now, ReleaseCause.PENDING_TIMEOUT)]

    @property
    def launches_in_flight(self) -> int:
        return len(self.inflight)
