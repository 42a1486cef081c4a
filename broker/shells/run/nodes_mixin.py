"""Nodes coming and going: launches, boots, agents attached, releases and their timers, and
the fleet checked against EC2 every tick. EC2 calls go through :mod:`.actuator`; what they
change is told to the ledger."""

from __future__ import annotations

from broker.core.control.actions import Launch, ScheduleRelease
from broker.core.control.ledger import Followup
from broker.core.control.ledger.inflight import is_placeholder

from broker.shells.aws.records import InstanceState

from .actuator import Launched
from .types import SETUP_TASK, Attached, BootDone, ReleaseDue


class NodesMixin:
    """Part of :class:`~broker.shells.run.loop.Daemon` (its state is the daemon's)."""

    # -- launches ----------------------------------------------------------------------------
    def _launch(self, a: Launch) -> None:
        """RunInstances off the loop (actuator.py); until EC2 answers, the launch holds one
        placeholder per instance in the ledger (committed spend, part of the fleet)."""
        t = self.types[a.type_name]
        token = self.ec2.launch(t, a.count, a.cause)
        self.ledger.on_launch_sent(token, t.name, a.count, self.clock.now_s(), a.release_after_s)

    def _on_launched(self, launched: Launched) -> bool:
        """EC2 answered a launch: its placeholders give way to the instances it launched, each
        with the placeholder's release moved by the time the call took; a failure is told to
        the ledger (a type's cooldown)."""
        t = self.types[launched.type_name]
        now = self.clock.now_s()
        voided = self.ledger.on_launch_answered(launched.token)
        for k, (instance_id, at) in enumerate(launched.instances):
            self.ledger.on_launched(instance_id, t.name, at, now)
            self._emit("instance.launch", instance_id=instance_id, type=t.name, cause=launched.cause,
                       launched_at_s=round(at, 3), boot_s=t.boot_s)
            self.timers.at(at + t.boot_s, BootDone(instance_id), f"boot-{instance_id}")
            v = voided[k] if k < len(voided) else None
            if v is not None and v.release_at_s is not None:
                at_s = now if v.released or v.release_at_s <= now else v.release_at_s + (at - v.launched_at_s)
                self._release_timer(self.ledger.schedule_release(instance_id, at_s, v.release_cause or "planned",
                                                                 now))
        failure = launched.failure
        if failure is not None:
            self._emit("instance.launch_failed", type=t.name, requested=launched.count,
                       launched=len(launched.instances), kind=failure.kind.value, code=failure.code,
                       error=failure.message, cause=launched.cause)
            until = self.ledger.on_launch_failed(t.name, now, failure.kind.value)
            if until is not None:  # no new instance: the controller re-plans, around this type for a while
                self._emit("instance.type_avoided", type=t.name, kind=failure.kind.value, until_s=round(until, 3))
        return True

    # -- releases ----------------------------------------------------------------------------
    def _release_timer(self, release: ScheduleRelease | None, deferred: bool = False) -> None:
        """Journal a (re)scheduled release and set its timer; one due now is carried out at once,
        or, ``deferred`` (inside a journal batch), by the loop once the batch has committed."""
        if release is None or is_placeholder(release.instance_id):
            return  # a launch in flight: its release passes to its instances (_on_launched)
        node = self.ledger.nodes[release.instance_id]
        now = self.clock.now_s()
        self.journal.set_release(node.id, release.at_s)
        self._emit("instance.release_scheduled", instance_id=node.id, at_s=round(release.at_s, 3),
                   paid_until_s=round(node.type.billing.paid_until(node.launched_at_s, max(release.at_s,
                                                                                          node.launched_at_s)), 3),
                   cause=release.cause)
        if release.at_s > now + 1e-6:
            self.timers.at(release.at_s, ReleaseDue(node.id, node.release_version), f"release-{node.id}")
        elif deferred:
            self._post(ReleaseDue(node.id, node.release_version))
        else:
            self._release(node.id, release.cause)

    def _release(self, instance_id: str, cause: str) -> None:
        """Terminate an instance now: its attempts are cancelled and re-queued first."""
        if is_placeholder(instance_id):
            return  # a launch in flight: released when EC2 answers (_on_launched)
        client = self.clients.get(instance_id)
        followups = self.ledger.on_released(instance_id, self.clock.now_s(), cause)
        self._cancel_on_agents(followups)
        self.nodes.stop(instance_id, client)  # also abandons an attach under way
        self.clients[instance_id] = None
        self.timers.cancel(f"boot-{instance_id}")
        self.timers.cancel(f"release-{instance_id}")
        self._terminate(instance_id, cause)  # sweep.py: done only when EC2 confirms

    def _cancel_on_agents(self, followups: list[Followup]) -> None:
        """The attempts of a released node: cancelled (no failure) and journaled in one batch."""
        if not followups:
            return
        with self.journal.batch():
            self._carry_out(followups)

    # -- nodes becoming ready ----------------------------------------------------------------
    def _on_boot(self, instance_id: str) -> bool:
        node = self.ledger.nodes.get(instance_id)
        if node is None or node.terminated_at_s is not None or self.clients.get(instance_id) is not None:
            return False
        if instance_id not in self._boot_checked and self.ec2.states.get(instance_id) is not InstanceState.RUNNING:
            # Reach it only once EC2 no longer shows it pending: one describe, off the loop
            # (sweep.py, _boot_when_running); one stuck pending meets its pending_timeout.
            self._boot_held.add(instance_id)
            self.ec2.survey(force=True)
            return False
        self.journal.record_instance_state(instance_id, "running")
        self.clients[instance_id] = None
        if self.nodes.attach_in_background(instance_id, node.slots,
                                           lambda client, error: self._post(Attached(instance_id, client, error))):
            return False  # reaching a live instance may take minutes: not in the loop
        try:
            client = self.nodes.attach(instance_id, node.slots)
        except Exception as exc:  # noqa: BLE001 - an unreachable instance is released, not fatal
            return self._on_attached(Attached(instance_id, None, exc))
        return self._on_attached(Attached(instance_id, client, None))

    # -- private nodes at start-up ------------------------------------------------------------
    def _attach_private_nodes(self) -> None:
        """Every private node's agent at once, in the background with bounded concurrency
        (local ones tried once, those over SSH retried with backoff for their grace, see
        :class:`~broker.shells.nodes.SshAgents`). A node not reached yet is not lost: it takes no
        work, the run waits for it (it is a node to run on), and it joins when it answers."""
        from .types import AttachRetrying

        background = getattr(self.nodes, "attach_private_in_background", None)
        local = getattr(self.nodes, "attach_local_in_background", None)
        for p in self.inv.private:
            self.clients[p.name] = None
            done = lambda client, error, n=p.name: self._post(Attached(n, client, error))  # noqa: E731
            if local is not None and local(p.name, done):
                continue
            if background is not None and background(
                    p.name, done, lambda error, n=p.name: self._post(AttachRetrying(n, error))):
                continue
            try:
                client = self.nodes.attach(p.name, p.slots)
            except Exception as exc:  # noqa: BLE001 - any failure to reach a node is reported, not fatal
                self._on_attached(Attached(p.name, None, exc))
                continue
            self._on_attached(Attached(p.name, client, None))

    def _on_attach_retrying(self, m) -> bool:
        """A private node's first try at start failed (``AttachRetrying``): say that it is
        tried again, and that the run waits for it."""
        from broker.core.units import format_duration

        from .attempts import _round

        node = self.ledger.nodes.get(m.node)
        if node is None or not node.alive or self.clients.get(m.node) is not None:
            return False
        grace = getattr(self.nodes, "grace_s", lambda _node: None)(m.node)
        self._emit("node.unreachable", node=m.node, reason=str(m.error), grace_s=_round(grace, 3))
        self._notice(f"warning: private node {m.node} did not answer ({m.error}); it is tried again in the "
                     f"background{f' for up to {format_duration(grace)}' if grace else ''}, and the run waits for it")
        return False

    def _private_not_attached(self, node_id: str, error: BaseException) -> bool:
        """A private node's agent could not be started: refused (a host key, our key, the
        inventory: no wait mends it) or not reached within its grace. The run goes on
        without it, and says so on the console."""
        from broker.shells.ssh_errors import is_refusal

        refused = is_refusal(error)
        self.resumed_waiting.pop(node_id, None)
        ended, followups = self.ledger.on_node_lost(node_id, self.clock.now_s())
        self._emit("node.lost", node=node_id, reason=f"could not start its agent: {error}", refused=refused)
        for e in ended:  # attempts a resume held there (resume.py): lost, re-queued, no failure of their tasks
            self.journal.attempt_lost(e.attempt.task_id, e.attempt.attempt, f"node {node_id} lost: {error}")
            self._failed(e, f"node {node_id} lost: {error}")
        self._carry_out(followups)
        what = "refused" if refused else "not reached"
        self._notice(f"warning: private node {node_id} {what}: {error}. The run goes on without it")
        return True

    def _resumed_node_back(self, node: str, client, was_ready: bool) -> bool:
        """A node that did not answer on resume answered (resume.py ``_wait_for``): its agent
        was told the attempts held there; it takes work again."""
        self.clients[node] = client
        now = self.clock.now_s()
        self.ledger.on_node_back(node, now)
        self._reattached(node, client, len(self.ledger.nodes[node].running), was_ready, now)
        return True

    def _reattached(self, node: str, client, attempts: int, was_ready: bool, now: float) -> None:
        """An agent re-attached with ``attempts`` held on it: said, and its node back at work."""
        hello = client.hello
        self._emit("agent.reattached", node=node, attempts=attempts,
                   agent_running=len(hello.running) if hello else 0,
                   pending_results=hello.pending_results if hello else 0)
        if was_ready:
            self.ledger.on_node_ready(node, now)
        else:
            self._node_attached(node)

    def _notice(self, text: str) -> None:
        """A line for the person watching the console (warnings they must see off a terminal too)."""
        if self.on_notice is not None:
            self.on_notice(text)

    def _on_attached(self, m: Attached) -> bool:
        node = self.ledger.nodes.get(m.instance_id)
        if node is None or not node.alive or (self.stopping and node.type is None):  # released meanwhile
            if m.client is not None:
                self.nodes.stop(m.instance_id, m.client)
            return False
        if m.error is not None and node.type is None:
            return self._private_not_attached(node.id, m.error)
        if node.type is None and node.id in self.resumed_waiting:
            return self._resumed_node_back(node.id, m.client, self.resumed_waiting.pop(node.id))
        if m.error is not None:
            self._emit("node.lost", node=node.id, reason=f"could not start its agent: {m.error}")
            _, followups = self.ledger.on_node_lost(node.id, self.clock.now_s())
            for f in followups:  # its release, at once (no journal batch is open here)
                self._release_timer(f)
            return True
        self.clients[node.id] = m.client
        self._node_attached(node.id)
        return True

    def _node_attached(self, node: str) -> None:
        """The agent answered: run the bag's setup first if there is one, else take work."""
        if self.bag.setup:
            from workers.protocol import Run

            self.clients[node].submit([Run(SETUP_TASK, 1, self.bag.setup, timeout_s=self.bag.timeout_s,
                                           env=dict(self.bag.env), cwd=self.bag.workdir)])
            return
        self._mark_ready(node)

    def _mark_ready(self, node_id: str) -> None:
        now = self.clock.now_s()
        self.ledger.on_node_ready(node_id, now)
        node = self.ledger.nodes[node_id]
        if node.type is not None:
            self._emit("instance.ready", instance_id=node_id, type=node.type.name, at_s=round(now, 3),
                       boot_s=round(now - node.launched_at_s, 3), slots=node.slots)
        else:
            self._emit("node.ready", node=node_id, at_s=round(now, 3), slots=node.slots)

    # -- the fleet against EC2, every tick ---------------------------------------------------
    def _reconcile_fleet(self) -> bool:
        """The fleet against EC2 (sweep.py): lost, unknown and unconfirmed instances; and when
        each node's agent was last heard from, for ``broker status``."""
        self._record_heard()
        return self._survey_fleet()

    def _record_heard(self) -> None:
        import time

        now, wall = self.clock.now_s(), time.monotonic()
        heard = {node: now - max(0.0, wall - client.heard_at) * self.clock.time_scale
                 for node, client in self.clients.items() if getattr(client, "heard_at", None) is not None}
        self.journal.record_heard(heard)
