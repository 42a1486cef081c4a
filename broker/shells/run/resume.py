"""Resume: a run rebuilt from its journal after the daemon died (or left).

The run's state is rebuilt by the core (:meth:`Ledger.from_journal`: done and given-up tasks,
counters, observations, the failure rules' memory) from the journal's rows; this module does
what needs the world: EC2 reconciled with the journal by the run's tag (adopt what an intent
launched, terminate strays, close rows EC2 no longer has), intents the dead daemon left open
closed, agents re-attached with the attempts the journal says they run, and each instance's
release timer set by the ledger's rule. See README "Resuming a run".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.core.control.ledger import Ledger, restore_instance, resume_release

from .types import BootDone

if TYPE_CHECKING:
    from .loop import Daemon


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a resume found and did (the ``run.resume`` event)."""

    reattached: int
    requeued: int
    adopted: int
    terminated: int


def _continue_launches(d: "Daemon") -> dict:
    """Launch intents so far: the next client token continues their numbering."""
    launches = d.journal.actions("launch")
    d.confirmed = d.confirmed or bool(launches)
    prefix = f"{d.opt.run_id}-"
    for act in launches:
        token = str(act.payload.get("client_token", ""))
        if token.startswith(prefix) and token[len(prefix):].isdigit():
            d.ec2.launch_seq = max(d.ec2.launch_seq, int(token[len(prefix):]))
    return {act.payload.get("client_token"): act for act in launches}


def _reconcile(d: "Daemon", now: float) -> tuple[int, int]:
    """The journal's instances against EC2 under the run's tag; returns (adopted, terminated)."""
    from broker.shells.aws.fleet import TOKEN_TAG

    j = d.journal
    records = {r.id: r for r in j.instances()}
    by_token = _continue_launches(d)
    reconciled = d.fleet.reconcile(list(records))
    if reconciled.failure is not None:
        d._emit("resume.reconcile_failed", error=reconciled.failure.render())
    adopted = terminated = 0
    for inst in reconciled.adopted:
        if inst.state.gone:
            continue
        token = inst.tags.get(TOKEN_TAG)
        act = by_token.get(token)
        t = d.types.get(inst.type_name)
        if act is None or t is None:
            outcome = d.fleet.terminate([inst.id])
            d._emit("instance.stray_terminated", instance_id=inst.id, type=inst.type_name,
                    reason="tagged with this run but launched by no intent in its journal",
                    terminated=bool(outcome.terminated or outcome.already_terminated))
            continue
        # Launched between RunInstances and its journal row: adopt it under its intent.
        launched = act.created_at_s if d.clock.time_scale != 1.0 else d.clock.to_run_s(inst.launched_at_s)
        launched = min(launched, now)
        j.record_launch(inst.id, t.name, launched_at_s=launched, price_per_hour=t.price_per_hour, billing=t.billing,
                        client_token=f"{token}-adopted-{inst.id}", action_seq=act.seq)
        adopted += 1
        d._emit("instance.launch", instance_id=inst.id, type=t.name, cause="adopted_on_resume",
                launched_at_s=round(launched, 3), boot_s=t.boot_s)
    for instance_id in reconciled.missing:
        r = records[instance_id]
        if r.state == "terminated":
            continue
        j.record_instance_state(instance_id, "terminated")
        d.nodes.stop(instance_id, None)
        terminated += 1
        d._emit("instance.terminated", instance_id=instance_id, type=r.type_name, cause="gone_on_resume",
                launched_at_s=round(r.launched_at_s, 3), at_s=round(now, 3),
                paid_until_s=round(r.billing.paid_until(r.launched_at_s, now), 3),
                cost_usd=round(r.committed_usd(now), 6), committed_usd=round(j.committed_usd(), 6))
    for instance_id in reconciled.strays:
        d._emit("resume.stray", instance_id=instance_id,
                reason="in the journal but without this run's tag on EC2: left alone")
    return adopted, terminated


def _close_intents(d: "Daemon") -> set[str]:
    """Actions the dead daemon began and never closed; returns the instances whose
    termination was interrupted (redone now)."""
    j = d.journal
    records = {r.id: r for r in j.instances()}
    redo_terminate: set[str] = set()
    for intent in j.pending_intents():
        if intent.kind == "launch":
            token = str(intent.payload.get("client_token"))
            found = [r.id for r in records.values() if r.client_token
                     and (r.client_token.rsplit("-", 1)[0] == token or r.client_token.startswith(f"{token}-adopted-"))]
            if found:
                j.complete(intent.seq, {"instances": found, "resumed": True})
            else:
                j.fail(intent.seq, "the daemon stopped before EC2 answered; no instance carries its client token")
        else:
            if intent.kind == "terminate":
                redo_terminate.add(str(intent.payload.get("instance_id")))
            j.fail(intent.seq, "interrupted: the daemon stopped; redone on resume")
    return redo_terminate


def resume(d: "Daemon") -> Resumed:
    j = d.journal
    now = d.clock.now_s()
    adopted, terminated = _reconcile(d, now)
    redo_terminate = _close_intents(d)
    redo_terminate |= {r.id for r in j.instances() if r.state == "terminating"}  # EC2 never confirmed
    rows = j.rows()
    speeds = {p.name: p.speed for p in d.inv.private}
    speeds.update({r.id: d.types[r.type_name].speed for r in rows.instances if r.type_name in d.types})
    tasks = [(t.id, d.estimates[t.id]) for t in d.bag.tasks]
    ledger, restored = Ledger.from_journal(rows, d.types, tasks, speeds, d.rng.permutation(len(tasks)),
                                           **d._ledger_options())
    d._new_ledger(ledger)
    plan = j.first_plan()
    if plan is not None:
        d.first_plan = (plan.makespan_s, plan.cost_usd)
    ready = {e.get("node") or e.get("instance_id") for name in ("node.ready", "instance.ready")
             for _, _, e in j.events(name)}
    running = restored.running
    reattached = 0
    for p in d.inv.private:
        d.ledger.add_private(p)
        j.record_private_node(p.name, slots=p.slots, speed=p.speed, cost_per_hour=p.cost_per_hour, at_s=now)
    attached = _attach_all(d, [p.name for p in d.inv.private], running)  # at once, not one after another
    for p in d.inv.private:
        reattached += _reattach(d, p.name, running.pop(p.name, []), p.name in ready, attached[p.name])
    releases = []
    for r in rows.instances:
        restore_instance(d.ledger, r, now)
        if r.state == "terminated":
            continue
        t = d.types[r.type_name]
        if r.ready_at_s is not None or now >= r.launched_at_s + t.boot_s:
            if r.ready_at_s is None:
                j.record_instance_state(r.id, "running")
            reattached += _reattach(d, r.id, running.pop(r.id, []), r.id in ready)
        else:
            d.clients[r.id] = None
            d.timers.at(r.launched_at_s + t.boot_s, BootDone(r.id), f"boot-{r.id}")
        releases.append(r)
    requeued = 0
    with j.batch():  # attempts on nodes that are gone: back to the pool (no failure: the daemon died)
        for attempts in running.values():
            for a in attempts:
                j.attempt_cancelled(a.task_id, a.attempt)
                requeued += 1
    for node in sorted(restored.bad_nodes):
        d._carry_out(d.ledger.quarantine_node(node, now), why="found again on resume")
    for r in releases:
        if not d.ledger.nodes[r.id].alive:
            continue  # lost or bad: its release is under way already
        d._release_timer(resume_release(d.ledger, r.id, r.release_at_s, now, d.config.margin_s,
                                        interrupted=r.id in redo_terminate))
    led = d.ledger
    d._emit("run.resume", run_dir=str(d.opt.run_dir), at_s=round(now, 3), tasks=led.tasks_total, done=len(led.done),
            failed=len(led.quarantined), pending=len(led.pool), reattached=reattached, requeued=requeued,
            adopted=adopted, terminated=terminated, committed_usd=round(j.committed_usd(), 6),
            time_scale=d.clock.time_scale)
    return Resumed(reattached, requeued, adopted, terminated)


RESUME_ATTACH_AT_ONCE = 8  # private nodes reached at once on resume


def _attach_all(d: "Daemon", nodes: list[str], running: dict) -> dict[str, tuple[Any, BaseException | None]]:
    """Reach these nodes' agents in parallel (at most :data:`RESUME_ATTACH_AT_ONCE` at a
    time), each told the attempts the journal says it runs: ``node -> (client, None)`` or
    ``(None, error)``. Only the attaches run on the pool; the ledger and the journal are
    then told on the caller's thread (:func:`_reattach`)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(node, d.ledger.nodes[node].slots, tuple(d._run_of(a.task_id, a.attempt)
                                                      for a in running.get(node, []) if a.task_id in d.tasks))
            for node in nodes]

    def one(job: tuple) -> tuple[str, tuple[Any, BaseException | None]]:
        node, slots, expect = job
        try:
            return node, (d.nodes.attach(node, slots, expect), None)
        except Exception as exc:  # noqa: BLE001 - reported by _reattach
            return node, (None, exc)

    with ThreadPoolExecutor(max_workers=RESUME_ATTACH_AT_ONCE, thread_name_prefix="resume-attach") as pool:
        return dict(pool.map(one, jobs))


def _reattach(d: "Daemon", node: str, running: list, was_ready: bool,
              attached: tuple[Any, BaseException | None] | None = None) -> int:
    """Reach the node's agent again (or take ``attached``, :func:`_attach_all`'s outcome),
    telling it which attempts the journal says it runs: those it runs or replays stay; the
    others come back as TaskLost (then re-queued). Returns how many attempts were re-attached."""
    record = d.ledger.nodes[node]
    if not record.alive:
        if attached is not None and attached[0] is not None:
            d.nodes.stop(node, attached[0])
        return 0
    kept = [a for a in running if a.task_id in d.tasks]
    d.clients[node] = None
    try:
        if attached is None:
            client = d.nodes.attach(node, record.slots, tuple(d._run_of(a.task_id, a.attempt) for a in kept))
        elif attached[1] is not None:
            raise attached[1]
        else:
            client = attached[0]
    except Exception as exc:  # noqa: BLE001 - an unreachable node is reported, not fatal
        if attached is not None and _wait_for(d, node, kept, was_ready, exc):
            return 0
        now = d.clock.now_s()
        _, followups = d.ledger.on_node_lost(node, now)
        from broker.shells.ssh_errors import is_refusal

        d._emit("node.lost", node=node, reason=f"could not reach its agent on resume: {exc}", refused=is_refusal(exc))
        d._notice(f"warning: node {node} {'refused' if is_refusal(exc) else 'not reached'} on resume: {exc}. "
                  "The run goes on without it")
        with d.journal.batch():
            for a in running:
                d.journal.attempt_cancelled(a.task_id, a.attempt)
            d._carry_out(followups)
        return 0
    d.clients[node] = client
    now = d.clock.now_s()
    count = sum(1 for a in kept if d.ledger.resume_attempt(a.task_id, a.attempt, node,
                                                           a.started_at_s if a.started_at_s is not None else now))
    d._reattached(node, client, count, was_ready, now)
    return count


def _wait_for(d: "Daemon", node: str, kept: list, was_ready: bool, error: BaseException) -> bool:
    """A private node over SSH that did not answer on resume is tried again in the background
    for its grace, as at start; meanwhile it is away: the attempts the journal says it runs are
    held there (its agent may be running them still), it takes no new work. When it answers
    its agent is told those attempts (those it no longer knows come back lost); past its grace
    it is lost and they are re-queued (nodes_mixin.py). False for a node not waited for (a
    refusal, a local node, an instance): it is lost at once."""
    from broker.shells.ssh_errors import is_transient

    from .types import Attached

    start = getattr(d.nodes, "attach_private_in_background", None)
    expect = tuple(d._run_of(a.task_id, a.attempt) for a in kept)
    if start is None or not is_transient(error) or not start(
            node, lambda client, e: d._post(Attached(node, client, e)), lambda _e: None, expect=expect):
        return False
    now = d.clock.now_s()
    for a in kept:
        d.ledger.resume_attempt(a.task_id, a.attempt, node, a.started_at_s if a.started_at_s is not None else now)
    d.ledger.on_node_away(node, now)
    d.resumed_waiting[node] = was_ready
    grace = d.nodes.grace_s(node)
    d._emit("node.unreachable", node=node, reason=str(error), grace_s=grace)
    d._notice(f"warning: private node {node} did not answer on resume ({error}); it is tried again in the "
              f"background for up to {grace:g} s, holding the {len(kept)} task(s) it ran, and the run waits for it")
    return True
