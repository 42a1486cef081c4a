"""Attempts and agent messages: the loop's half that talks to the worker agents.

Each agent message becomes one ledger event (``on_result``, ``on_attempt_failed``,
``on_attempt_lost``, ``on_node_lost``); what the ledger answers is written to the journal
and the event log, and carried out on the agents (:meth:`AttemptsMixin._carry_out`). A
result whose attempt the ledger does not run (a replay, a cancelled copy) changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from broker.core.control.actions import Assign, Cancel, Replicate, ScheduleRelease
from broker.core.control.causes import Ending, WorkCause
from broker.core.control.failures import AGENT_STOPPING, signature
from broker.core.control.ledger import Ended, Followup, NodeQuarantined, Quarantine, Requeue
from broker.shells.agent_client import NodeLost, TaskLost
from broker.shells.journal import AttemptResult
from broker.shells.logging import mask_secrets, write_event
from workers.protocol import Interruption, Progress, Result, Run, Started

from .spot import is_spot_cancel
from .types import SETUP_TASK, Reconnected, ReleaseDue


def failure_reason(result: Result, node: str | None = None) -> str:
    """Why an attempt failed, in words: the agent's error, a timeout, or the exit code and what
    the shell's 126/127 mean (``exit code 127: command not found on node-a (see stderr_tail)``)."""
    if result.error:
        return result.error
    if result.timed_out:
        return "timed out"
    meaning = {126: "command found but not executable", 127: "command not found"}.get(result.exit_code or 0)
    if meaning is None:
        return f"exit code {result.exit_code}"
    return f"exit code {result.exit_code}: {meaning}" + (f" on node {node}" if node else "") + " (see stderr_tail)"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class AttemptsMixin:
    """Part of :class:`~broker.shells.run.loop.Daemon` (its state is the daemon's)."""

    # -- starting ----------------------------------------------------------------------------
    def _run_of(self, task_id: str, attempt: int) -> Run:
        task = self.tasks[task_id]
        return Run(task.id, attempt, task.command, timeout_s=self.bag.timeout_s, env=dict(self.bag.env),
                   cwd=self.bag.workdir)

    def _start_attempts(self, starts: list[Assign | Replicate]) -> None:
        now = self.clock.now_s()
        runs: dict[str, list[Run]] = defaultdict(list)
        started: list[tuple[str, int, str]] = []  # journaled in one statement of each kind
        with self.journal.batch():
            for a in starts:
                node = a.slot.node
                attempt = None
                if self.clients.get(node) is not None:
                    attempt = self.ledger.start(a.task_id, node, a.slot.index, now,
                                                replica=isinstance(a, Replicate), cause=a.cause)
                if attempt is None:
                    self.log.warning("dispatch.refused", task=a.task_id, node=node, slot=a.slot.index,
                                     reason="the slot is busy or its node is gone")
                    continue
                if (a.task_id, attempt.attempt) in self.ledger.sample_keys:
                    self.journal.record_sample_draws([a.task_id])
                started.append((a.task_id, attempt.attempt, node))
                runs[node].append(self._run_of(a.task_id, attempt.attempt))
                write_event("task.start", {"task": a.task_id, "attempt": attempt.attempt, "node": node,
                                           "slot": a.slot.index, "cause": a.cause}, context={"run_id": self.opt.run_id})
            self.journal.tasks_started(started, at_s=now)
        for node, batch in runs.items():  # only once the starts are durable (the turn committed)
            client = self.clients[node]
            self.journal.after_commit(lambda n=node, c=client, b=batch: self.clients.get(n) is c and c.submit(b))

    # -- agent messages ----------------------------------------------------------------------
    def _on_agent_message(self, node: str, message: Any, acks: dict[str, list[tuple[str, int]]]) -> bool:
        if node not in self.ledger.nodes:
            return False
        if isinstance(message, Result):
            acks[node].append((message.task, message.attempt))
            if message.task == SETUP_TASK:
                self._journal_finished()
                return self._on_setup(node, message)
            return self._on_result(node, message)
        if isinstance(message, (Started, Progress)):
            return False  # nothing the ledger keeps: the turn's results stay one batch (Journal.tasks_finished)
        self._journal_finished()  # the turn's results so far before anything else, in their order
        if isinstance(message, NodeLost):
            return self._on_node_lost(node, message.reason)
        if isinstance(message, Interruption):
            return self._on_interruption_notice(node, message)  # spot.py
        if isinstance(message, TaskLost):
            now = self.clock.now_s()
            e = self.ledger.on_attempt_lost(node, message.task, message.attempt, now)
            return self._lost(e, mask_secrets(message.reason))
        return False

    def _on_setup(self, node: str, result: Result) -> bool:
        now = self.clock.now_s()
        if result.ok:
            self._mark_ready(node)
            return True
        self._emit("node.setup_failed", node=node, reason=failure_reason(result, node),
                   stderr_tail=result.stderr_tail[-500:])
        self._carry_out(self.ledger.on_setup_failed(node, now))
        return True

    def _on_result(self, node: str, r: Result) -> bool:
        now = self.clock.now_s()
        if r.cancelled or (r.error and AGENT_STOPPING in r.error):
            # The agent cancels or refuses work without being asked (ours were written off when
            # we cancelled them): it is stopping (SIGTERM, a node rebooting).
            self._journal_finished()
            return self._agent_stopping(node, r)
        outcome = AttemptResult(exit_code=r.exit_code, runtime_s=r.runtime_s, timed_out=r.timed_out,
                                stdout_tail=mask_secrets(r.stdout_tail), stderr_tail=mask_secrets(r.stderr_tail),
                                error=mask_secrets(r.error))
        if not outcome.ok:
            self._journal_finished()
            sig = signature(r.exit_code, r.timed_out, r.error)
            e = self.ledger.on_attempt_failed(node, r.task, r.attempt, now, sig)
            if not e.changed:
                return False  # a cancelled copy, or an attempt already written off
            self.journal.task_finished(r.task, r.attempt, outcome, node=node, at_s=now)
            self._failed(e, failure_reason(r, node), outcome.stderr_tail)
            return True
        runtime_s = r.runtime_s * self.clock.time_scale
        e = self.ledger.on_result(node, r.task, r.attempt, now, runtime_s)
        if not e.changed:
            return False
        self._finished.append((r.task, r.attempt, outcome, node, now))  # journaled with the turn's others
        if e.outcome == Ending.DONE:
            self._done(node, r, e)
        return True

    def _journal_finished(self) -> None:
        """Journal the successful results :meth:`_on_result` held, in one call (two statements):
        before any other write of the turn that concerns attempts, and at the end of its batch."""
        if self._finished:
            finished, self._finished = self._finished, []
            self.journal.tasks_finished(finished)

    def _agent_stopping(self, node: str, r: Result) -> bool:
        """A stopping agent cancels what it runs and takes nothing new: the node is down until
        its agent is re-attached (its connection ends soon); its attempts are lost (no
        failure of their tasks) and re-run elsewhere."""
        record = self.ledger.nodes[node]
        if not any(a.task_id == r.task and a.attempt == r.attempt for a in record.running.values()):
            return False  # an attempt already written off
        reason = f"cancelled on {node}: its agent is stopping"
        ended, _ = self.ledger.on_node_lost(node, self.clock.now_s(), comes_back=True)
        self._emit("node.down", node=node, reason="its agent is stopping", attempts=len(ended))
        for e in ended:
            self.journal.attempt_lost(e.attempt.task_id, e.attempt.attempt, reason)
            self._failed(e, reason)
        return True

    def _done(self, node: str, r: Result, e: Ended) -> None:
        if self.bag.outputs is not None:
            self._to_fetch.append((node, r.task))
        self._emit("task.done", task=r.task, attempt=r.attempt, node=node, runtime_s=round(r.runtime_s, 4),
                   exit_code=r.exit_code, runtime_ref_s=round(e.runtime_ref_s, 3))
        if (r.task, r.attempt) in self.ledger.sample_keys:
            obs = self.ledger.obs
            self._emit("sample.done", task=r.task, runtime_ref_s=round(e.runtime_ref_s, 3), samples=obs.count,
                       mean_ref_s=round(obs.mean_ref_s, 3))
        self._carry_out(e.followups)
        if self.on_progress is not None:
            led = self.ledger
            self.on_progress(len(led.done), len(led.quarantined), led.tasks_total, self._committed_usd())

    def _lost(self, e: Ended, reason: str) -> bool:
        """A lost attempt (or one a dead daemon started that never reached its agent)."""
        if not e.changed:
            return False
        a = e.attempt
        if e.outcome == Ending.CANCELLED:
            self.journal.attempt_cancelled(a.task_id, a.attempt)
            self.log.info("task.requeued", task=a.task_id, attempt=a.attempt, node=a.node, reason=reason)
            self._carry_out(e.followups)
            return True
        self.journal.attempt_lost(a.task_id, a.attempt, reason)
        self._failed(e, reason)
        return True

    def _failed(self, e: Ended, why: str, stderr_tail: str = "") -> None:
        """An attempt ended without a result (journaled): say so, then carry out the ledger's
        verdict (retry, quarantine and cancel the copies, stop using a bad node)."""
        a, v = e.attempt, e.verdict
        self._emit("task.failed", task=a.task_id, attempt=a.attempt, node=a.node, error=why,
                   stderr_tail=stderr_tail[-500:], final=bool(v and v.quarantined),
                   retries_left=v.retries_left if v else 0, lost=bool(v and v.lost))
        self._carry_out(e.followups, why=why, stderr_tail=stderr_tail[-500:])

    def _carry_out(self, followups: tuple[Followup, ...] | list[Followup], *, why: str = "",
                   stderr_tail: str = "") -> None:
        """Journal and carry out what the ledger answered an event with."""
        if followups:
            self._journal_finished()
        for f in followups:
            if isinstance(f, Cancel):
                if is_spot_cancel(f):
                    self._interrupted_attempt(f)  # spot.py: journaled interrupted, no failure
                else:
                    self.journal.attempt_cancelled(f.task_id, f.attempt)
                client = self.clients.get(f.node)
                if client is not None:
                    client.cancel([(f.task_id, f.attempt)])
            elif isinstance(f, Quarantine):
                self.journal.quarantine(f.task_id, f"{f.reason}; last stderr: {stderr_tail}" if stderr_tail else f.reason)
                self._emit("task.quarantined", task=f.task_id, reason=f.reason, failures=f.failures, node=f.node,
                           stderr_tail=stderr_tail)
            elif isinstance(f, NodeQuarantined):
                self._emit("node.quarantined", node=f.node, reason=f"tasks keep failing there ({why})")
            elif isinstance(f, ScheduleRelease):
                self._release_timer(f, deferred=True)
            elif not isinstance(f, Requeue):  # a requeue is the journal's pending state already
                raise TypeError(f"unknown follow-up {f!r}")

    # -- nodes lost and re-attached ----------------------------------------------------------
    def _reattach(self, node: str, reason: str) -> bool:
        """The connection to the node's agent broke: open a new one and re-handshake. The
        agent replays results finished meanwhile; attempts it does not know come back as
        TaskLost (or as failed Results, if the agent was restarted)."""
        client = self.clients.get(node)
        if client is None or not self.ledger.reattach_allowed(node):
            return False
        try:
            self.nodes.reattach(node, self.ledger.nodes[node].slots, client)
        except Exception as exc:  # noqa: BLE001 - the node is then lost, which is reported
            self._emit("agent.reattach_failed", node=node, reason=reason, error=str(exc))
            return False
        self.ledger.on_node_back(node, self.clock.now_s())  # if it was down (its agent stopping)
        self._emit("agent.reattached", node=node, reason=reason, running=len(self.ledger.nodes[node].running),
                   attempt=self.ledger.nodes[node].reattaches)
        return True

    def _reconnect_in_background(self, node: str, reason: str) -> bool:
        """A private node reached over SSH that stopped answering is *away*: its attempts are
        held (its agent runs them on), it takes no new work, and its link is reconnected on a
        thread of its own, with backoff, for the node's grace; :meth:`_on_reconnected` then
        re-attaches its agent or, the grace past, gives the node up. False when the node is
        not one reconnected that way (local agents, instances) or may not be re-attached again."""
        reconnecting = self.__dict__.setdefault("_reconnecting", set())
        if node in reconnecting:
            return True  # already under way
        start = getattr(self.nodes, "reconnect_in_background", None)
        grace_s = getattr(self.nodes, "grace_s", lambda _node: None)(node)
        if start is None or grace_s is None or not self.ledger.reattach_allowed(node):
            return False
        reconnecting.add(node)
        self.ledger.on_node_away(node, self.clock.now_s())
        self._emit("node.away", node=node, reason=reason, running=len(self.ledger.nodes[node].running),
                   grace_s=round(grace_s, 3))
        start(node, lambda transport, error: self._post(Reconnected(node, transport, error)))
        return True

    def _on_reconnected(self, m: Reconnected) -> bool:
        self.__dict__.setdefault("_reconnecting", set()).discard(m.node)
        record, client = self.ledger.nodes.get(m.node), self.clients.get(m.node)
        if record is None or not record.alive or client is None:  # given up or released meanwhile
            if m.transport is not None:
                m.transport.close()
            return False
        error = m.error
        if error is None:
            try:
                client.reattach(m.transport)  # the agent replays what finished while it was away
            except Exception as exc:  # noqa: BLE001 - the node is then lost, which is reported
                error = exc
        if error is not None:
            self._emit("agent.reattach_failed", node=m.node, reason="not reached again within its grace",
                       error=str(error))
            return self._on_node_lost(m.node, f"not reached again within its grace: {error}", reattach=False)
        self.ledger.on_node_back(m.node, self.clock.now_s())
        self._emit("agent.reattached", node=m.node, reason="its link is back", running=len(record.running),
                   attempt=record.reattaches)
        return True

    def _on_node_lost(self, node: str, reason: str, *, reattach: bool = True, gone: bool = False) -> bool:
        """``reattach``: try to reach the node's agent again first (not for an instance EC2
        says is gone, ``gone``): in the background for a private node over SSH, else at once."""
        record = self.ledger.nodes.get(node)
        if record is None or record.terminated_at_s is not None or (record.lost and not gone):
            return False
        if reattach and self._reconnect_in_background(node, reason):
            return True
        if reattach and self._reattach(node, reason):
            return True
        now = self.clock.now_s()
        ended, followups = self.ledger.on_node_lost(node, now, gone=gone)
        self._emit("node.lost", node=node, reason=reason)
        for e in ended:
            if e.outcome == Ending.INTERRUPTED:  # a spot instance under notice gone: no failure
                self._interrupted_attempt(Cancel(e.attempt.task_id, e.attempt.attempt, WorkCause.SPOT_INTERRUPTED,
                                                 node))
                self._carry_out(e.followups)
                continue
            self.journal.attempt_lost(e.attempt.task_id, e.attempt.attempt, f"node {node} lost: {reason}")
            self._failed(e, f"node {node} lost: {reason}")
        self._carry_out(followups)
        return True

    # -- outputs -----------------------------------------------------------------------------
    def _fetch_all_outputs(self) -> None:
        """Fetch each finished task's ``outputs`` into ``run_dir/outputs/<task>/``; a failure is
        reported (``task.outputs_failed``), the task stays done."""
        from urllib.parse import quote

        from broker.config.bag import output_path

        fetches, self._to_fetch = self._to_fetch, []
        for node, task_id in fetches:
            path = output_path(self.bag, self.tasks[task_id])
            dest = Path(self.opt.run_dir) / "outputs" / quote(task_id, safe="")
            try:
                files = self.nodes.fetch(node, self.bag.workdir, path, dest, dict(self.bag.env))
            except Exception as exc:  # noqa: BLE001 - a missing output is reported, never fatal
                self._emit("task.outputs_failed", task=task_id, node=node, path=path, error=str(exc))
                continue
            self._emit("task.outputs", task=task_id, node=node, path=path, dest=str(dest), files=len(files),
                       bytes=sum(f.stat().st_size for f in files))

    def _deferred_release(self, instance_id: str) -> None:
        """A release the ledger asked for while a journal batch is open: the loop carries it
        out once the batch has committed (never an EC2 call inside a batch)."""
        self._post(ReleaseDue(instance_id, self.ledger.nodes[instance_id].release_version))
