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
- The same describe shows which instances EC2 still has ``pending``: a boot waits until one
  is no longer pending, and one pending past its type's ``pending_timeout`` is terminated
  and counted as a launch failure of the type.
- The calls run off the loop (:mod:`.actuator`): what EC2 answered reaches this module as
  an :class:`~.actuator.Ec2Answer` on the inbox (:meth:`SweepMixin._on_ec2`).
- The final sweep, when the run ends, waits for the calls in flight, surveys once more,
  releases what it finds, and retries unconfirmed terminations for a few ticks; what EC2
  still has not confirmed is named in the report (the run exits 1 and says to run ``broker
  down``).
"""

from __future__ import annotations

import time

from broker.shells.aws.fleet import TOKEN_TAG
from broker.shells.aws.records import InstanceRecord, InstanceState

from .actuator import Ec2Answer, Launched, StrayTerminated, Surveyed, Terminated
from .types import BootDone

FINAL_SWEEPS = 3  # rounds of termination retries when the run ends, one tick apart


class SweepMixin:
    """Part of :class:`~broker.shells.run.loop.Daemon` (its state is the daemon's)."""

    # -- EC2's answers (actuator.py: the calls run off the loop) -----------------------------
    def _on_ec2(self, answer: Ec2Answer, closing: bool = False) -> bool:
        """An EC2 call answered: its outcome is journaled (by the actuator) and told to the
        ledger here. True when something changed."""
        return self._on_ec2_result(self.ec2.take(answer), closing)

    def _on_ec2_result(self, result, closing: bool = False) -> bool:
        if isinstance(result, Launched):
            return self._on_launched(result)
        if isinstance(result, Terminated):
            self._on_terminated(result)
        elif isinstance(result, Surveyed):
            return self._on_surveyed(result, closing)
        elif isinstance(result, StrayTerminated):
            self._emit("instance.stray_terminated", instance_id=result.instance_id, type=result.type_name,
                       reason="tagged with this run but launched by no intent in its journal",
                       terminated=result.terminated)
        return False

    def _settle_ec2(self, closing: bool = True) -> None:
        """Wait for every EC2 call in flight and act on its answer (the run is ending)."""
        for result in self.ec2.settle():
            self._on_ec2_result(result, closing)

    # -- terminations ------------------------------------------------------------------------
    def _terminate(self, instance_id: str, cause: str) -> None:
        """TerminateInstances for a node the ledger has released, off the loop;
        ``instance.terminated`` only once EC2 confirmed it (:meth:`_on_terminated`)."""
        self.ec2.terminate(instance_id, cause)

    def _on_terminated(self, t: Terminated) -> None:
        for instance_id, cause in t.confirmed.items():
            self._emit_terminated(instance_id, cause)
        for instance_id, error in t.errors.items():
            self._emit("instance.terminate_failed", instance_id=instance_id, error=error,
                       retry="every tick until EC2 confirms")

    def _emit_terminated(self, instance_id: str, cause: str) -> None:
        node = self.ledger.nodes.get(instance_id)
        if node is None or node.type is None:
            return
        now = node.terminated_at_s if node.terminated_at_s is not None else self.clock.now_s()
        self._emit("instance.terminated", instance_id=instance_id, type=node.type.name, cause=cause,
                   launched_at_s=round(node.launched_at_s, 3), at_s=round(now, 3),
                   paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, now), 3),
                   cost_usd=round(node.cost_usd(now), 6), committed_usd=round(self._committed_usd(), 6))

    def _retry_terminations(self) -> None:
        """Ask EC2 again about every termination it has not confirmed (not one in flight)."""
        if self.ec2.unconfirmed:
            self.ec2.terminate_all(dict(self.ec2.unconfirmed))

    def _known_instances(self) -> set[str]:
        return set(self.ledger.nodes) | set(self.ec2.unconfirmed)

    def _cloud_alive(self) -> list:
        """The instances the ledger holds alive (not a launch in flight's placeholder)."""
        return [n for n in self.ledger.live_nodes() if n.type is not None and n.alive and "#" not in n.id]

    # -- the fleet against EC2, every tick ---------------------------------------------------
    def _survey_fleet(self) -> bool:
        """Every tick: unconfirmed terminations asked again, and one describe by the run's tag
        sent (off the loop; :meth:`_on_surveyed` acts on its answer)."""
        self._retry_terminations()
        # an instance under a spot notice is no longer alive to the ledger, but EC2's taking it
        # back is seen only by a describe: keep asking until it is gone
        self.ec2.survey(force=bool(self._cloud_alive()) or self._awaiting_interruption())
        return False

    def _on_surveyed(self, s: Surveyed, closing: bool) -> bool:
        """An instance terminated from outside (or gone for any reason) is lost, its tasks
        re-queued now; one the ledger does not know is adopted or terminated; one still
        pending past its type's ``pending_timeout`` is a launch failure. True when something
        changed."""
        if s.records is None:
            self._boot_when_running(s)  # EC2 cannot say: try to reach them all the same
            return False
        alive = [] if closing else [(n.id, n.launched_at_s) for n in self._cloud_alive()]
        gone, unknown = self.ec2.gone_and_unknown(s, alive, self._known_instances(), self.config.tick_s,
                                                  self.ec2.launch_tokens())
        changed = False
        interrupted = {r.id for r in s.records if r.interrupted}  # EC2 took a spot instance back
        for instance_id in sorted(interrupted):  # noticed ones too (no longer alive to the ledger)
            changed |= self._on_interrupted(instance_id)  # spot.py
        for instance_id, reason in gone:
            if instance_id not in interrupted:
                changed |= self._on_node_lost(instance_id, reason, reattach=False, gone=True)
        for record in unknown:
            changed |= self._adopt_unknown(record, closing=closing)
        if not closing:
            changed |= self._pending_too_long(s)
            self._boot_when_running(s)
        return changed

    def _pending_too_long(self, s: Surveyed) -> bool:
        """Instances EC2 still shows pending past their type's ``pending_timeout``: terminated
        (confirmed by EC2 as usual) and counted as launch failures of the type."""
        changed = False
        states = {r.id: r.state for r in s.records or ()}
        for node in self._cloud_alive():
            if states.get(node.id) is not InstanceState.PENDING:
                continue
            waited = s.sent_at_s - node.launched_at_s
            if waited < node.type.pending_timeout_s:
                continue
            self._boot_held.discard(node.id)
            until, followups = self.ledger.on_pending_timeout(node.id, self.clock.now_s())
            self._emit("instance.launch_failed", type=node.type.name, requested=1, launched=0, kind="timeout",
                       code="PendingTimeout", cause="pending_timeout", instance_id=node.id,
                       error=f"still pending in EC2 {waited:.0f}s after its launch "
                             f"(pending_timeout {node.type.pending_timeout_s:g}s): terminated")
            if until is not None:
                self._emit("instance.type_avoided", type=node.type.name, kind="timeout", until_s=round(until, 3))
            with self.journal.batch():
                self._carry_out(followups)  # its attempts cancelled; its release, deferred to after the batch
            changed = True
        return changed

    def _boot_when_running(self, s: Surveyed) -> None:
        """Boots held until EC2 shows the instance running (or the describe could not tell:
        failed, or not listing it yet): let through; one still pending stays held."""
        by_id = {r.id: r for r in s.records or ()}
        for instance_id in sorted(self._boot_held):
            record = by_id.get(instance_id)
            if record is not None and record.state is InstanceState.PENDING:
                continue
            self._boot_held.discard(instance_id)
            self._boot_checked.add(instance_id)
            self._post(BootDone(instance_id))

    def _adopt_unknown(self, record: InstanceRecord, closing: bool) -> bool:
        """An instance under the run's tag the ledger does not know: adopted under the launch
        intent its client token names (released at once when ``closing``), else terminated."""
        token = record.tags.get(TOKEN_TAG)
        act = next((a for a in self.journal.actions("launch") if a.payload.get("client_token") == token), None)
        t = self.types.get(record.type_name)
        now = self.clock.now_s()
        if act is None or t is None:
            self.ec2.terminate_stray(record)
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
        """When the run ends: wait for the EC2 calls in flight, survey the run's tag once more
        (releasing any unknown instance) and retry unconfirmed terminations for up to
        :data:`FINAL_SWEEPS` ticks. Returns the instances EC2 has still not confirmed
        terminated (they may still bill)."""
        if self.ec2.launch_seq == 0 and not self.ec2.unconfirmed and not self.ec2.in_flight:
            return ()  # nothing was ever launched under this run's tag
        self._settle_ec2()
        self.ec2.survey(force=True, cause="final_sweep")
        self._settle_ec2()
        for _ in range(FINAL_SWEEPS):
            if not self.ec2.unconfirmed:
                break
            time.sleep(min(self.clock.wall_delay_s(self.config.tick_s), 60.0))
            self._retry_terminations()
            self._settle_ec2()
        left = tuple(sorted(self.ec2.unconfirmed))
        if left:
            self._emit("run.instances_unconfirmed", instance_ids=list(left),
                       reason="EC2 has not confirmed their termination: they may still bill; run `broker down`")
        return left
