"""Spot interruptions in the live daemon: the agent's notice and EC2's termination, told to
the ledger (``broker/core/control/ledger/spot.py``), journaled and carried out.

- An agent on a spot instance reads EC2's two-minute notice from the instance metadata and
  sends ``Interruption`` (``workers/imds.py``); its ``in_s`` (node seconds, wall time) is
  turned into the run clock's ``terminate_at_s``. The ledger stops dispatching there and
  re-queues what cannot end in time (``Cancel`` followups, journaled as ``interrupted``).
- A describe that shows one of our instances ``terminated`` with ``StateReason``
  ``Server.SpotInstanceTermination`` (:attr:`InstanceRecord.interrupted`) is an
  interruption (``Ledger.on_interrupted``): what still ran there is lost without counting
  as a failure, the instance ends released with cause ``spot_interrupted``, its agent
  connection is closed, and TerminateInstances is asked once more so that the end is EC2's
  word (it answers that the instance is terminated already).
- The agent of a noticed instance going silent is the same loss seen first from the
  connection: the ledger ends its attempts as interrupted (``on_node_lost``).

Events: ``instance.interruption_notice``, ``instance.interrupted``, and ``task.interrupted``
for each attempt it ended.
"""

from __future__ import annotations

from broker.core.control.actions import Cancel
from broker.core.control.causes import WorkCause
from workers.protocol import Interruption

_SPOT_CAUSES = (WorkCause.SPOT_NOTICE, WorkCause.SPOT_INTERRUPTED)


class SpotMixin:
    """Part of :class:`~broker.shells.run.loop.Daemon` (its state is the daemon's)."""

    def is_spot_node(self, node: str) -> bool:
        """Whether ``node`` is a spot instance (its agent is told to watch for the notice)."""
        record = self.ledger.nodes.get(node)
        return record is not None and record.type is not None and record.type.is_spot

    def _awaiting_interruption(self) -> bool:
        """Whether an instance had its notice and is not ended yet (every tick's describe
        is then sent, to see EC2 take it back)."""
        return any(n.notice_at_s is not None and n.terminated_at_s is None for n in self.ledger.nodes.values())

    def _on_interruption_notice(self, node: str, m: Interruption) -> bool:
        record = self.ledger.nodes.get(node)
        if record is None or not self.is_spot_node(node):
            self.log.warning("instance.interruption_notice_ignored", node=node, reason="not a spot instance of the run")
            return False
        now = self.clock.now_s()
        terminate_at_s = now + max(0.0, m.in_s) * self.clock.time_scale  # node seconds are wall seconds
        followups = self.ledger.on_interruption_notice(node, now, terminate_at_s)
        if record.notice_at_s != now:
            return False  # a notice replayed on a new connection: known already
        requeued = [f for f in followups if isinstance(f, Cancel)]
        self._emit("instance.interruption_notice", instance_id=node, type=record.type.name, action=m.action,
                   terminate_at_s=round(terminate_at_s, 3), requeued=len(requeued),
                   running=len(record.running))
        self._carry_out(followups)  # inside the loop's batch of agent messages
        return True

    def _on_interrupted(self, instance_id: str) -> bool:
        """EC2 says it took the spot instance back."""
        record = self.ledger.nodes.get(instance_id)
        if record is None or record.type is None or record.terminated_at_s is not None:
            return False
        now = self.clock.now_s()
        noticed = record.notice_at_s is not None
        followups = self.ledger.on_interrupted(instance_id, now)
        self.journal.mark_interrupted(instance_id)  # its cost: what ran (status, report, a resume)
        lost = sum(1 for f in followups if isinstance(f, Cancel))
        self._emit("instance.interrupted", instance_id=instance_id, type=record.type.name, noticed=noticed,
                   attempts_lost=lost, cost_usd=round(record.cost_usd(now), 6))
        self._carry_out(followups)
        client = self.clients.get(instance_id)
        self.nodes.stop(instance_id, client)
        self.clients[instance_id] = None
        self.timers.cancel(f"boot-{instance_id}")
        self.timers.cancel(f"release-{instance_id}")
        self._terminate(instance_id, "spot_interrupted")  # EC2 confirms: terminated already
        return True

    def _interrupted_attempt(self, f: Cancel) -> None:
        """A Cancel the ledger gave for a spot interruption: journaled ``interrupted`` (no failure)."""
        reason = "spot notice: could not end before the instance is taken back" \
            if f.cause == WorkCause.SPOT_NOTICE else "its spot instance was taken back"
        self.journal.attempt_lost(f.task_id, f.attempt, reason, interrupted=True)
        self._emit("task.interrupted", task=f.task_id, attempt=f.attempt, node=f.node, cause=str(f.cause))


def is_spot_cancel(f: Cancel) -> bool:
    return f.cause in _SPOT_CAUSES
