"""``broker down [RUN_DIR]``: the safety valve. Terminate every instance of a run, stop its agents.

Works whether or not the daemon still runs, and as often as you like; a broken piece (a
journal cut short, the dry run's moto server gone) is reported in one line, never a
traceback, and the rest is still cleaned up:

- every local agent under ``RUN_DIR/agents/`` is stopped first (its tasks are killed, and
  whatever they started and left behind), and so is the agent of every private node the
  inventory reaches over SSH (``agent.py stop`` there; a node it cannot reach is named);
- a live run: every instance the journal knows, plus any EC2 holds under the run's tag, is
  terminated through :class:`~broker.shells.aws.Ec2Fleet` (which never touches an instance
  without the run's tag) and recorded as terminated;
- a dry run: the same against the run directory's moto server when it is still up (a
  killed or left run), which is then stopped; when it is gone its instances went with it
  and the journal records them as terminated;
- the journal is left consistent: attempts still marked running are cancelled, intents
  left open are closed as failed, and the run is marked ``stopped`` unless it had ended.

RUN_DIR defaults to the most recently written run directory under ``./runs/``.
Exit status: 0 when nothing of the run is left running, 1 when an instance could not be
terminated or the journal could not be read (the message says which and why), 2 when
RUN_DIR is not a run directory.
"""

from __future__ import annotations

import argparse
import sqlite3
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
    from broker.shells.journal import JOURNAL_FILE, Journal, JournalError
    from broker.shells.local_transport import stop_local_agent
    from broker.shells.moto_world import SERVER_FILE, find_moto_server, stop_moto_server
    from broker.shells.nodes import AGENTS_DIR

    run_dir = Path(args.run_dir) if args.run_dir is not None else latest_run_dir(RUNS_DIR)
    has_journal = (run_dir / JOURNAL_FILE).is_file()
    if not has_journal and not (run_dir / SERVER_FILE).exists() and not (run_dir / AGENTS_DIR).is_dir():
        raise UsageError(f"no journal in {run_dir}: is it a run directory?")
    stopped_agents = 0
    agents = run_dir / AGENTS_DIR
    if agents.is_dir():
        for state_dir in sorted(p for p in agents.iterdir() if p.is_dir()):
            stopped_agents += stop_local_agent(state_dir)
    server = find_moto_server(run_dir)
    problems: list[str] = []
    terminated: list[str] = []
    failed: list[str] = []
    run_id = "?"
    try:
        if not has_journal:
            problems.append(f"no journal in {run_dir} (the run died before writing one)")
        else:
            with Journal.open(run_dir) as journal:
                record = journal.run()
                if record is None:
                    problems.append(f"{run_dir} holds no run (its daemon died before recording it)")
                else:
                    run_id = record.id
                    stopped_agents += _stop_private_agents(record, problems)
                    terminated, failed = _bring_down(journal, record, server, problems)
    except (JournalError, sqlite3.Error, OSError) as exc:
        problems.append(f"the journal in {run_dir} could not be used: {exc}")
    if server is not None:
        stop_moto_server(run_dir)
    print(f"{run_dir}: run {run_id}: {len(terminated)} instance(s) terminated, "
          f"{stopped_agents} agent(s) stopped" + (f", {len(failed)} FAILED" if failed else "")
          + (", its moto server stopped" if server is not None else ""))
    for line in failed:
        print(f"  could not terminate {line}")
    for line in problems:
        print(f"  note: {line}")
    return 1 if failed or any("could not" in p for p in problems) else 0


def _bring_down(journal, record, server, problems: list[str]) -> tuple[list[str], list[str]]:
    """Terminate the run's instances, close what the journal left open; returns the ids
    terminated and a line per instance that could not be."""
    import time

    from broker.shells.metrics import run_now_s

    left = [i for i in journal.instances() if i.state != "terminated"]
    if not record.options.get("dry_run"):
        terminated, failed = _terminate_live(record, [i.id for i in left])
    elif server is not None:
        terminated, failed = _terminate_dry(record, server, [i.id for i in left])
    else:
        terminated, failed = [i.id for i in left], []
        if left:
            problems.append("the dry run's moto server is gone, and its instances with it")
    known = {i.id for i in left}
    # Journal times are run time (a dry run's clock runs --time-scale times faster than the
    # wall): recorded at wall time, a run's end fell before its own plans ("ran 23s", "plan
    # #1 (-1186s ago)" in status after down).
    at = run_now_s(record, time.time())
    with journal.batch():
        for instance_id in terminated:
            if instance_id in known:  # an instance found only by its tag has no journal row
                journal.record_instance_state(instance_id, "terminated", at_s=at)
        for attempt in journal.running_attempts():  # their agents were stopped above
            journal.attempt_cancelled(attempt.task_id, attempt.attempt, at_s=at)
        for intent in journal.pending_intents():
            journal.fail(intent.seq, "the run was brought down (broker down) before this completed", at_s=at)
        if terminated:
            journal.record_event("run.down", {"terminated": terminated, "failed": failed}, at_s=at)
        if record.state == "running":
            journal.finish_run("stopped", at_s=at)
    return terminated, failed


def _stop_private_agents(record, problems: list[str]) -> int:
    """Stop the run's agent on each private node reached over SSH, and kill what its tasks
    left running there (``agent.py stop``); a node that cannot be reached is a problem."""
    from broker.config.errors import ConfigError
    from broker.config.inventory import load_inventory
    from broker.shells.nodes import REMOTE_AGENT_ROOT, remote_path

    if not record.inventory_path:
        return 0
    try:
        nodes = [n for n in load_inventory(record.inventory_path).private if not n.local and n.host]
    except ConfigError as exc:
        problems.append(f"could not read the inventory {record.inventory_path} to reach the private nodes: "
                        f"{exc.problems[0].render() if exc.problems else exc}")
        return 0
    import shlex

    from broker.shells.ssh import SshTarget, connect

    stopped = 0
    for node in nodes:
        try:
            session = connect(SshTarget.for_node(node))
            try:  # shipped again, as a run does: this broker's agent knows `stop`, whatever is there
                agent = session.deploy_agent(f"{REMOTE_AGENT_ROOT}/agent")
                result = session.run(f"python3 -B {shlex.quote(agent + '/agent.py')} stop --state-dir "
                                     f"{remote_path(REMOTE_AGENT_ROOT, f'runs/{record.id}/{node.name}')}",
                                     timeout_s=60.0)
            finally:
                session.close()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the node is reported, not raised
            problems.append(f"could not stop the agent on private node {node.name}: {exc}")
            continue
        if result.exit_code != 0:
            problems.append(f"could not stop the agent on private node {node.name}: "
                            f"{result.stderr.strip()[-300:] or f'exit code {result.exit_code}'}")
        elif result.stdout.startswith("agent stopped"):
            stopped += 1
    return stopped


def _terminate_dry(record, server, known_ids: list[str]) -> tuple[list[str], list[str]]:
    """The dry run's instances in its moto server: the journal's and any under the tag."""
    from broker.core.model import AwsSettings
    from broker.shells.aws import Ec2Fleet
    from broker.shells.moto_world import DEFAULT_REGION, fake_aws_environment, server_client

    region = (server.world or {}).get("region") or DEFAULT_REGION
    with fake_aws_environment(region):
        fleet = Ec2Fleet(server_client(server, region), AwsSettings(region=region), record.id)
        described = fleet.describe()
        if described.failure is not None:
            return [], [f"{i}: {described.failure.render()}" for i in known_ids] or [described.failure.render()]
        listed = {r.id for r in described.instances}
        # Ids this server never held died with an earlier one (it was restarted): gone too.
        done, failed = _terminate(fleet, record, [i for i in known_ids if i in listed])
        return done + [i for i in known_ids if i not in listed], failed


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
    return _terminate(fleet, record, known_ids)


def _terminate(fleet, record, known_ids: list[str]) -> tuple[list[str], list[str]]:
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
