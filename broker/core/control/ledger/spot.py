"""Spot interruptions in the ledger (part of :class:`~.ledger.Ledger`; its state is the
ledger's). Both shells feed the same two events:

- :meth:`SpotMixin.on_interruption_notice` ``(node_id, now, terminate_at_s)``: EC2's
  two-minute notice (the agent reads ``/latest/meta-data/spot/instance-action``; the
  simulator draws it). The node takes no more work from now on (it is *lost* to the
  controller, so the next plan replaces its capacity). Each running attempt that cannot end
  by ``terminate_at_s`` is stopped now and its task re-queued (cause ``spot_notice``): it
  would only be lost two minutes later. An attempt is expected to end at its start plus its
  size at the node's speed; its size is its estimate, else the mean runtime seen so far (or
  the prior); an attempt already past that needs as long again as it has run (the rule tail
  replication uses). An attempt whose size nothing tells is left to run: it may still end.
- :meth:`SpotMixin.on_interrupted` ``(instance_id, now)``: EC2 terminated the instance. The
  attempts still running there are lost, their tasks re-queued (cause ``spot_interrupted``);
  the instance ends in the ledger as released (cause ``spot_interrupted``: the shell need
  not terminate it). It is charged only for what ran: the unit EC2 interrupted is free
  (per-second billing: the seconds run; hourly: the whole hours before the interruption,
  :meth:`~broker.core.billing.Billing.interrupted_billed_s`).

An interrupted attempt is no failure of its task (the :class:`FailureBook` never sees it:
no retry spent, no ``lost_attempts``, no strike against a node). It is counted per task
(``interruptions``); a task interrupted ``FailurePolicy.max_spot_attempts`` times (default
2) joins ``spot_barred``: dispatch (``dispatch.py``) gives it to on-demand and private
slots only. The operator's counters are :class:`SpotCounts` (``Ledger.spot_counts``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..actions import Cancel
from ..causes import ReleaseCause, WorkCause
from .records import Attempt, Followup, NodeRecord


@dataclass(slots=True)
class SpotCounts:
    """What spot interruptions did to a run (status, report, metrics)."""

    notices: int = 0  # two-minute notices received
    interruptions: int = 0  # spot instances EC2 took back
    attempts_interrupted: int = 0  # attempts stopped by a notice or lost with their instance
    requeued_at_notice: int = 0  # ... of which stopped at the notice (they could not end in time)
    lost_work_ref_s: float = 0.0  # work those attempts had done, thrown away (reference seconds)
    fallback_tasks: int = 0  # tasks barred from spot (interrupted max_spot_attempts times)
    fallback_attempts: int = 0  # attempts of barred tasks started on on-demand or private nodes

    def to_json(self) -> dict:
        out = asdict(self)
        out["lost_work_ref_s"] = round(self.lost_work_ref_s, 3)
        return out


def is_spot(node: NodeRecord) -> bool:
    return node.type is not None and node.type.is_spot


class SpotMixin:
    def _init_spot(self) -> None:
        self.spot_counts = SpotCounts()
        self.interruptions: dict[str, int] = {}  # task -> attempts interrupted on spot
        self.spot_barred: set[str] = set()  # tasks dispatched to on-demand and private slots only
        # per spot type: [interruptions, instance-seconds of its ended instances] (spotrates.py)
        self.spot_seen: dict[str, list[float]] = {}

    def on_interruption_notice(self, node_id: str, now: float, terminate_at_s: float) -> list[Followup]:
        """EC2's notice that it takes the spot instance back at ``terminate_at_s`` (see the
        module docstring). Returns ``Cancel`` and ``Requeue`` followups for the attempts stopped
        now; nothing for an unknown or ended instance, or a notice already received."""
        node = self.nodes.get(node_id)
        if node is None or node.type is None or node.terminated_at_s is not None or node.notice_at_s is not None:
            return []
        node.notice_at_s, node.terminate_at_s = now, terminate_at_s
        self.spot_counts.notices += 1
        self._set_lost(node)
        out: list[Followup] = []
        for a in list(node.running.values()):
            if a.slot < node.slots and self._expected_end_s(a, node, now) <= terminate_at_s:
                continue  # (a task queued at the agent has not started: it goes elsewhere)
            self._stop(a, now)
            self.spot_counts.requeued_at_notice += 1
            out += self._interrupted(a, node, now, WorkCause.SPOT_NOTICE)
        return out

    def on_interrupted(self, instance_id: str, now: float) -> list[Followup]:
        """EC2 terminated the spot instance (with or without a notice seen): its attempts are
        lost as interrupted, their tasks re-queued, and it ends as released, charged for what
        ran only. Nothing for an unknown or already ended instance."""
        node = self.nodes.get(instance_id)
        if node is None or node.type is None or node.terminated_at_s is not None:
            return []
        self.count_instance_interrupted(node)
        if node.alive:
            self._set_lost(node)
        out: list[Followup] = []
        for a in list(node.running.values()):
            if node.running.get(a.slot) is not a:
                continue
            self._stop(a, now)
            out += self._interrupted(a, node, now, WorkCause.SPOT_INTERRUPTED)
        return out + self.on_released(instance_id, now, ReleaseCause.SPOT_INTERRUPTED)

    def count_instance_interrupted(self, node: NodeRecord) -> None:
        """EC2 took ``node`` back (now, or in a journal a resume reads): charged for what ran,
        one more interruption for the run and for its type's learned rate (``spotrates.py``)."""
        self.spot_counts.interruptions += 1
        node.interrupted = True
        if node.type is not None and node.type.is_spot:
            self.spot_seen.setdefault(node.type.name, [0, 0.0])[0] += 1

    def _interrupted(self, a: Attempt, node: NodeRecord, now: float, cause: WorkCause) -> list[Followup]:
        """An attempt (already stopped) ends with its spot instance: counted, not a failure."""
        c = self.spot_counts
        c.attempts_interrupted += 1
        c.lost_work_ref_s += max(0.0, now - a.started_at_s) * node.speed
        self.count_interruption(a.task_id)
        out: list[Followup] = [Cancel(a.task_id, a.attempt, cause, node.id)]
        r = self._requeue(a.task_id, False, cause)
        return out + ([r] if r is not None else [])

    def count_interruption(self, task_id: str) -> None:
        """One more attempt of the task interrupted on spot (also a resume's journaled one):
        at ``max_spot_attempts`` it is barred from spot."""
        n = self.interruptions.get(task_id, 0) + 1
        self.interruptions[task_id] = n
        if n >= self.policy.max_spot_attempts and task_id not in self.spot_barred:
            self.spot_barred.add(task_id)
            self.spot_counts.fallback_tasks += 1

    def _ended(self, node: NodeRecord, now: float) -> float:
        """An instance ended (``on_released``): returns its cost, for the closed spend; a spot
        instance's exposure (launch to now) joins its type's (``spotrates.py``)."""
        if is_spot(node) and node.launched_at_s is not None:
            self.spot_seen.setdefault(node.type.name, [0, 0.0])[1] += max(0.0, now - node.launched_at_s)
        return node.cost_usd(now)

    def _expected_end_s(self, a: Attempt, node: NodeRecord, now: float) -> float:
        size = self.estimates.get(a.task_id)
        if size is None:
            size = self.obs.sum_ref_s / self.obs.count if self.obs.count else self.prior_mean_ref_s
        if size is None:
            return -math.inf  # nothing tells: let it run, it may end
        size = max(size, 2.0 * (now - a.started_at_s) * node.speed) if a.started_at_s + size / node.speed <= now \
            else size
        return a.started_at_s + size / node.speed

    def _spot_started(self, task_id: str, node: NodeRecord) -> None:
        """An attempt of a task barred from spot started: the fallback at work (or, when no
        on-demand or private slot was there, spot once more)."""
        if task_id in self.spot_barred and not is_spot(node):
            self.spot_counts.fallback_attempts += 1

    def spot_rates(self, now: float) -> dict[str, dict]:
        """Per spot type launched: the interruptions seen, its instance-hours, the declared rate
        and the rate learned from them (the posterior median, ``spotrates.py``; a deadline
        plan uses a higher quantile) - for the operator (report, ``simulate --json``)."""
        from ..spotrates import learned_rate

        hours: dict[str, float] = {}
        for node in self.nodes.values():
            if is_spot(node) and node.launched_at_s is not None and node.terminated_at_s is None:
                hours[node.type.name] = hours.get(node.type.name, 0.0) + max(0.0, now - node.launched_at_s) / 3600
        out = {}
        for name in sorted(set(hours) | set(self.spot_seen)):
            n, closed_s = self.spot_seen.get(name, (0, 0.0))
            h = hours.get(name, 0.0) + closed_s / 3600
            declared = self.types[name].interruptions_per_hour if name in self.types else 0.0
            out[name] = {"interruptions": int(n), "instance_hours": round(h, 4), "declared_per_hour": declared,
                         "learned_per_hour": round(learned_rate(declared, int(n), h), 4)}
        return out

    def spot_cost_usd(self, now: float) -> dict[str, float]:
        """Cloud spend so far by market (``spot``, ``on-demand``): what the fallback cost."""
        out = {"spot": 0.0, "on-demand": 0.0}
        for node in self.nodes.values():
            if node.type is not None:
                out["spot" if node.type.is_spot else "on-demand"] += node.cost_usd(now)
        return out
