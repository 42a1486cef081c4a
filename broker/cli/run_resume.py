"""What ``broker run`` checks and records before it resumes a run (README "Resuming").

A resume carries on with what the user gives now: an edited bag is matched with the
journal's tasks (:mod:`broker.shells.run.bagedit`: kept, new, dropped, redone), a changed
goal replaces the run's (the next plan is the promise), a changed inventory is planned on
as it is. Refused, each with why, only where continuing would be wrong: a dry run resumed
live or the reverse (its instances are in another EC2), another time scale (the run's
billing clock would jump), instances of a type the inventory no longer lists (their cost
and release are that type's), a budget already spent or a deadline already past, an
edited bag the journal cannot match (see ``bagedit``), a private node that costs money
removed or priced otherwise (its spend would be miscounted).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.cli import UsageError
from broker.cli.terminal import goal_text, money
from broker.core.units import format_duration


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """What a resume runs with and must record before it starts."""

    scale: float
    tick_s: float
    margin_s: float
    bag: Any  # the bag, its tasks under the journal's ids
    edit: Any  # BagEdit
    goal_change: tuple[str, str] | None  # (the run's goal, the new one), as text


def prepare_resume(args, record, journal, goal, scale, inventory, bag, run_dir: Path) -> ResumePlan:
    """Check the resume's inputs against the run in ``journal`` (read only); refuse (exit 2)
    where continuing would be wrong."""
    how = f"or `broker down {run_dir}` and start a new run directory"
    options = record.options
    if bool(options.get("dry_run")) != bool(args.dry_run):
        then = "a dry run" if options.get("dry_run") else "a live run"
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: it is {then}; "
                         f"{'add' if options.get('dry_run') else 'drop'} --dry-run")
    run_scale = float(options.get("time_scale", scale))
    if args.time_scale is not None and abs(args.time_scale - run_scale) > 1e-9:
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: it runs at time scale {run_scale:g}, "
                         f"not {args.time_scale:g}")
    instance_types = {i.type_name for i in journal.instances()}
    missing = sorted(instance_types - {t.name for t in inventory.types})
    if missing:
        raise UsageError(f"cannot resume run {record.id} in {run_dir}: its instances are of type(s) "
                         f"{', '.join(missing)}, which {args.inventory} no longer lists (their cost and "
                         f"release are that type's): list them again, {how}")
    _check_private_costs(record, journal, inventory, args.inventory, run_dir)
    goal_change = _goal_change(record, goal, journal, run_scale, run_dir, how)
    edit = _bag_edit(args, record, journal, bag, run_dir, how)
    return ResumePlan(run_scale, float(options.get("tick_s", 60.0)), float(options.get("margin_s", 120.0)),
                      edit.bag, edit, goal_change)


def _check_private_costs(record, journal, inventory, path, run_dir) -> None:
    """A private node that costs money is billed from when it joined to the run's end: one
    removed from the inventory, or priced otherwise, would be miscounted. Free nodes may come
    and go."""
    now = {p.name: p.cost_per_hour for p in inventory.private}
    for name, cost in sorted(journal.private_node_costs().items()):
        if cost > 0 and name not in now:
            raise UsageError(f"cannot resume run {record.id} in {run_dir}: its private node {name} costs "
                             f"{money(cost)}/h and {path} no longer lists it; the run bills a private node "
                             "until its end, so its spend would be miscounted: list it again (it may sit idle)")
        if name in now and abs(now[name] - cost) > 1e-9:
            raise UsageError(f"cannot resume run {record.id} in {run_dir}: its private node {name} is billed at "
                             f"{money(cost)}/h, and {path} now says {money(now[name])}/h; the run's spend would "
                             "be counted at two prices: put the old price back")


def _bag_edit(args, record, journal, bag, run_dir, how):
    from broker.shells.journal import file_sha256
    from broker.shells.run.bagedit import BagEditRefused, match_bag

    same = record.bag_sha256 is None or file_sha256(args.bag) == record.bag_sha256
    try:
        return match_bag(journal.live_tasks(), journal.task_ids(), journal.task_context(), bag, same_file=same)
    except BagEditRefused as exc:
        raise UsageError(f"cannot resume run {record.id} in {run_dir} with {args.bag}: {exc}, {how}") from None


def _journaled_goal(goal) -> tuple[str, float]:
    return ("theta", 1.0) if goal.kind == "none" else (goal.kind, goal.value)


def _goal_change(record, goal, journal, scale, run_dir, how) -> tuple[str, str] | None:
    """The run's goal and the new one, when they differ; refused when the new one is missed
    already (a budget spent, a deadline past)."""
    kind, value = _journaled_goal(goal)
    same = kind == record.goal_kind and (value is None or record.goal_value is None
                                         or abs(float(value) - float(record.goal_value)) <= 1e-9)
    if same:
        return None
    then, now = goal_text(record.goal_kind, record.goal_value), goal_text(kind, value)
    if kind == "budget":
        spent = journal.committed_usd()
        if spent >= float(value):
            raise UsageError(f"cannot resume run {record.id} in {run_dir} with --budget {value:g}: the run has "
                             f"committed {money(spent)} already, so that budget is spent: give a larger one, "
                             f"{how}")
    if kind == "deadline":
        anchor = float(record.options.get("epoch_anchor_s", record.created_at_s))
        elapsed = scale * (time.time() - anchor)
        if elapsed >= float(value):
            raise UsageError(f"cannot resume run {record.id} in {run_dir} with --deadline {format_duration(value)}: "
                             f"the run started {format_duration(elapsed)} ago (run time), so that deadline has "
                             f"passed: give a later one, {how}")
    return then, now


def record_resume(journal, plan: ResumePlan, args, goal) -> None:
    """Write what the resume changed (in one transaction) and say so: ``run.bag_changed`` and
    ``run.goal_changed``, on the console and in the journal's events."""
    import structlog

    from broker.shells.run.bagedit import task_context

    log = structlog.get_logger()
    edit, said = plan.edit, []
    if not edit.changed and plan.goal_change is None:
        return  # nothing to write (not even an empty batch: crash tests count batches)
    with journal.batch():
        if edit.changed:
            journal.apply_bag_edit(drop=edit.dropped, add=[t for t in plan.bag.tasks if t.id in set(edit.new)],
                                   task_context=task_context(plan.bag), bag_path=os.path.abspath(args.bag),
                                   reason="dropped: no longer in the bag when the run was resumed")
            if edit.new or edit.dropped:
                fields = {"summary": edit.summary(), **edit.fields()}
                journal.record_event("run.bag_changed", fields)
                said.append(("run.bag_changed", fields))
        if plan.goal_change is not None:
            kind, value = _journaled_goal(goal)
            journal.change_goal(goal_kind=kind, goal_value=value,
                                budget_usd=goal.value if goal.kind == "budget" else None,
                                deadline_s=goal.value if goal.kind == "deadline" else None)
            fields = {"before": plan.goal_change[0], "after": plan.goal_change[1]}
            journal.record_event("run.goal_changed", fields)
            said.append(("run.goal_changed", fields))
    for name, fields in said:  # once durable
        log.info(name, **fields)
