"""Nothing left billing: terminations confirmed by EC2, and every instance under the run's
tag accounted for.

- A termination is done only when EC2 says so (:meth:`Ec2Actuator.terminate_all`). One that
  failed (retries spent, a describe that did not list the instance yet) keeps the instance
  ``terminating`` in the journal; it is asked again every tick and in the final sweep.
- Every tick's describe by the run's tag (:meth:`Ec2Actuator.survey`) finds instances the
  ledger does not know: a launch whose answer was lost and whose retries ran out after EC2
  carried it out. One whose client token names a launch intent of this run is adopted under
  it (journaled, then used or released by the ledger's rules like any other); one that no
  intent launched is terminated.
- The final sweep, when the run ends, surveys once more, releases what it finds, and retries
  unconfirmed terminations for a few ticks; what EC2 still has not confirmed is named in the
  report (the run exits 1 and says to run ``broker down``).
"""

from __future__ import annotations

import time

from broker.shells.aws.fleet import TOKEN_TAG
from broker.shells.aws.records import InstanceRecord

from .types import BootDone

FINAL_SWEEPS = 3  # rounds of termination retries when the run ends, one tick apart


class SweepMixin:
    """Part of :class:`~broker.shells.run.loop.Daemon` (its state is the daemon's)."""

    def _terminate(self, instance_id: str, cause: str) -> None:
        """TerminateInstances for a node the ledger has released; ``instance.terminated``
        only once EC2 confirmed it."""
        error = self.ec2.terminate(instance_id, cause)
        if error is not None:
            self._emit("instance.terminate_failed", instance_id=instance_id, error=error,
                       retry="every tick until EC2 confirms")
            return
        self._emit_terminated(instance_id, cause)

    def _emit_terminated(self, instance_id: str, cause: str) -> None:
        node = self.ledger.nodes[instance_id]
        now = node.terminated_at_s
        self._emit("instance.terminated", instance_id=instance_id, type=node.type.name, cause=cause,
                   launched_at_s=round(node.launched_at_s, 3), at_s=round(now, 3),
                   paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, now), 3),
                   cost_usd=round(node.cost_usd(now), 6), committed_usd=round(self._committed_usd(), 6))

    def _retry_terminations(self) -> None:
        """Ask EC2 again about every termination it has not confirmed."""
        causes = dict(self.ec2.unconfirmed)
        if not causes:
            return
        errors = self.ec2.terminate_all(causes)
        for instance_id, cause in causes.items():
            if instance_id in errors:
                self._emit("instance.terminate_failed", instance_id=instance_id, error=errors[instance_id],
                           retry="every tick until EC2 confirms")
            else:
                self._emit_terminated(instance_id, cause)

    def _known_instances(self) -> set[str]:
        return set(self.ledger.nodes) | set(self.ec2.unconfirmed)

    def _survey_fleet(self) -> bool:
        """The fleet against EC2, every tick: an instance terminated from outside (or gone for
        any reason) is lost, its tasks re-queued now; one the ledger does not know is adopted
        or terminated. True when something changed."""
        self._retry_terminations()
        alive = [(n.id, n.launched_at_s) for n in self.ledger.live_nodes() if n.type is not None and n.alive]
        gone, unknown = self.ec2.survey(alive, self._known_instances(), self.clock.now_s(), self.config.tick_s)
        changed = False
        for instance_id, reason in gone:
            changed |= self._on_node_lost(instance_id, reason, reattach=False, gone=True)
        for record in unknown:
            changed |= self._adopt_unknown(record, closing=False)
        return changed

    def _adopt_unknown(self, record: InstanceRecord, closing: bool) -> bool:
        """An instance under the run's tag the ledger does not know: adopted under the launch
        intent its client token names (released at once when ``closing``), else terminated."""
        token = record.tags.get(TOKEN_TAG)
        act = next((a for a in self.journal.actions("launch") if a.payload.get("client_token") == token), None)
        t = self.types.get(record.type_name)
        now = self.clock.now_s()
        if act is None or t is None:
            outcome = self.fleet.terminate([record.id])
            self._emit("instance.stray_terminated", instance_id=record.id, type=record.type_name,
                       reason="tagged with this run but launched by no intent in its journal",
                       terminated=bool(outcome.terminated or outcome.already_terminated))
            return False
        at = act.created_at_s if self.clock.time_scale != 1.0 else self.clock.to_run_s(record.launched_at_s)
        at = min(at, now)
        self.journal.record_launch(record.id, t.name, launched_at_s=at, price_per_hour=t.price_per_hour,
                                   billing=t.billing, client_token=f"{token}-adopted-{record.id}", action_seq=act.seq)
        release = self.ledger.on_launched(record.id, t.name, at, now)
        self._emit("instance.launch", instance_id=record.id, type=t.name, cause="adopted", launched_at_s=round(at, 3),
                   boot_s=t.boot_s, client_token=token,
                   reason="EC2 carried out a launch whose answer was lost after its retries ran out")
        if closing:
            self.ledger.on_released(record.id, now, "bag_done")
            self._terminate(record.id, "bag_done")
            return True
        self.timers.at(at + t.boot_s, BootDone(record.id), f"boot-{record.id}")
        self._release_timer(release)
        return True

    def _final_sweep(self) -> tuple[str, ...]:
        """When the run ends: survey the run's tag once more (releasing any unknown instance)
        and retry unconfirmed terminations for up to :data:`FINAL_SWEEPS` ticks. Returns the
        instances EC2 has still not confirmed terminated (they may still bill)."""
        if self.ec2.launch_seq == 0 and not self.ec2.unconfirmed:
            return ()  # nothing was ever launched under this run's tag
        _, unknown = self.ec2.survey([], self._known_instances(), self.clock.now_s(), 0.0, force=True)
        for record in unknown:
            self._adopt_unknown(record, closing=True)
        for _ in range(FINAL_SWEEPS):
            if not self.ec2.unconfirmed:
                break
            time.sleep(min(self.clock.wall_delay_s(self.config.tick_s), 60.0))
            self._retry_terminations()
        left = tuple(sorted(self.ec2.unconfirmed))
        if left:
            self._emit("run.instances_unconfirmed", instance_ids=list(left),
                       reason="EC2 has not confirmed their termination: they may still bill; run `broker down`")
        return left
