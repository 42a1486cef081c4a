"""``broker down [RUN_DIR]``: the safety valve. Terminate every instance of a run, stop its agents.

Works whether or not the daemon still runs, and as often as you like:

- a live run: every instance the journal knows, plus any EC2 holds under the run's tag, is
  terminated through :class:`~broker.shells.aws.Ec2Fleet` (which never touches an instance
  without the run's tag) and recorded as terminated;
- a dry run: its instances lived in the in-process moto of the ``broker run`` that made
  them and died with it; the journal records them as terminated;
- every local agent under ``RUN_DIR/agents/`` is stopped (its tasks are killed);
- the run is marked ``stopped`` unless it had already ended.

RUN_DIR defaults to the most recently written run directory under ``./runs/``.
Exit status: 0 when nothing of the run is left running, 1 when an instance could not be
terminated (the message says which and why).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "down",
        help="terminate every instance of a run and stop its agents (safe to repeat)",
        description="Terminate every instance of a run (by the run's tag and its journal), stop its "
        "local agents and mark the run stopped. Works when the daemon is dead; idempotent.",
    )
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="run directory (default: the latest under ./runs/)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from broker.cli import UsageError
    from broker.cli.status import RUNS_DIR, latest_run_dir
    from broker.shells.journal import JOURNAL_FILE, Journal
    from broker.shells.local_transport import stop_local_agent
    from broker.shells.nodes import AGENTS_DIR

    run_dir = Path(args.run_dir) if args.run_dir is not None else latest_run_dir(RUNS_DIR)
    if not (run_dir / JOURNAL_FILE).is_file():
        raise UsageError(f"no journal in {run_dir}: is it a run directory?")
    stopped_agents = 0
    agents = run_dir / AGENTS_DIR
    if agents.is_dir():
        for state_dir in sorted(p for p in agents.iterdir() if p.is_dir()):
            stopped_agents += stop_local_agent(state_dir)
    with Journal.open(run_dir) as journal:
        record = journal.run()
        if record is None:
            raise UsageError(f"{run_dir} holds no run")
        left = [i for i in journal.instances() if i.state != "terminated"]
        if record.options.get("dry_run"):
            terminated, failed = [i.id for i in left], []
        else:
            terminated, failed = _terminate_live(record, [i.id for i in left])
        known = {i.id for i in left}
        for instance_id in terminated:
            if instance_id in known:  # an instance found only by its tag has no journal row
                journal.record_instance_state(instance_id, "terminated")
        if terminated:
            journal.record_event("run.down", {"terminated": terminated, "failed": failed})
        if record.state == "running":
            journal.finish_run("stopped")
    print(f"{run_dir}: run {record.id}: {len(terminated)} instance(s) terminated, "
          f"{stopped_agents} agent(s) stopped" + (f", {len(failed)} FAILED" if failed else ""))
    for line in failed:
        print(f"  could not terminate {line}")
    return 1 if failed else 0


def _terminate_live(record, known_ids: list[str]) -> tuple[list[str], list[str]]:
    """Terminate the run's instances on EC2: the journal's and any under the run's tag.
    Returns the ids now terminated and a line per instance that could not be."""
    import boto3

    from broker.config.inventory import load_inventory
    from broker.shells.aws import Ec2Fleet

    inventory = load_inventory(record.inventory_path) if record.inventory_path else None
    settings = inventory.aws if inventory is not None else None
    if settings is None:
        from broker.core.model import AwsSettings

        settings = AwsSettings()
    fleet = Ec2Fleet(boto3.Session(), settings, record.id)
    described = fleet.describe()
    if described.failure is not None:
        return [], [f"{i}: {described.failure.render()}" for i in known_ids] or [described.failure.render()]
    tagged = [r.id for r in described.instances if not r.state.gone]
    ids = list(dict.fromkeys(known_ids + tagged))
    outcome = fleet.terminate(ids)
    done = list(outcome.terminated) + list(outcome.already_terminated)
    failed = [f"{i}: {outcome.failure.render() if outcome.failure else 'failed'}" for i in outcome.failed]
    failed += [f"{i}: refused, it does not carry run {record.id}'s tag" for i in outcome.refused]
    return done, failed
