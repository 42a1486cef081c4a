"""``broker down [RUN_DIR]``: the safety valve. Terminate every instance of a run, stop its agents.

Works whether or not the daemon still runs, from any directory, and as often as you like; a
broken piece (a journal cut short, the dry run's moto server gone, a node that does not
answer) is reported in one line, never a traceback, and the rest is still cleaned up:

- every local agent under ``RUN_DIR/agents/`` is stopped first (its tasks are killed);
- every private node reached over SSH (the inventory the journal names, its relative paths
  read from the directory the run started in): the run's agent there is stopped with its
  tasks (``agent.py stop``), and its state there (``~/.broker/runs/<run>/<node>``) removed,
  or left for the node's ``keep``; all nodes at once. A node that does not answer is named:
  its agent stops by itself after its ``lease`` without a broker;
- a run that never launched an instance (no instance and no launch in its journal) asks
  nothing of EC2: no credentials or network needed;
- a live run: every instance the journal knows, plus any EC2 holds under the run's tag, is
  terminated through :class:`~broker.shells.aws.Ec2Fleet` (which never touches an instance
  without the run's tag) and recorded as terminated;
- a dry run: the same against the run directory's moto server when it is still up (a
  killed or left run), which is then stopped; when it is gone its instances went with it
  and the journal records them as terminated;
- the journal is left consistent: attempts still marked running are cancelled, intents
  left open are closed as failed, and the run is marked ``stopped`` unless it had ended.

A run that already ended cleanly (``finished`` or ``stopped`` in its journal, no instance
left unterminated, no intent left open, no attempt left running, no moto server) is a quick
no-op: nothing is asked of EC2 or of the private nodes, and the exit status is 0.

``--unless-left`` (the systemd unit's ``ExecStopPost``): a run its daemon left running on
purpose (``--on-stop leave``: the journal's last ``run.left`` is later than its last start
or resume) is left alone, exit 0; anything else is brought down as above.

RUN_DIR defaults to the most recently written run directory under ``./runs/``.
Exit status: 0 when nothing of the run is left running, 1 when an instance could not be
terminated, a private node could not be reached or the journal could not be read (the
message says which and why), 2 when RUN_DIR is not a run directory.
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
    p.add_argument("--unless-left", action="store_true",
                   help="do nothing to a run left running on purpose (--on-stop leave); for the systemd "
                   "unit's ExecStopPost")
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
    if getattr(args, "unless_left", False) and has_journal and _was_left(run_dir):
        print(f"{run_dir}: the run was left running on purpose (--on-stop leave): nothing done; "
              f"`broker down {run_dir}` releases it")
        return 0
    stopped_agents = 0
    agents = run_dir / AGENTS_DIR
    if agents.is_dir():
        for state_dir in sorted(p for p in agents.iterdir() if p.is_dir()):
            stopped_agents += stop_local_agent(state_dir)
    server = find_moto_server(run_dir)
    problems: list[str] = []
    terminated: list[str] = []
    failed: list[str] = []
    remote = _RemoteStops()
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
                    if server is None and ended_cleanly(journal, record):
                        print(f"{run_dir}: run {run_id}: 0 instance(s) terminated, {stopped_agents} agent(s) "
                              f"stopped (it ended {record.state}: nothing of it was left running)")
                        return 0
                    remote = _stop_private_agents(record, problems)
                    terminated, failed = _bring_down(journal, record, server, problems)
    except (JournalError, sqlite3.Error, OSError) as exc:
        problems.append(f"the journal in {run_dir} could not be used: {exc}")
    if server is not None:
        stop_moto_server(run_dir)
    print(f"{run_dir}: run {run_id}: {len(terminated)} instance(s) terminated, "
          f"{stopped_agents + remote.stopped} agent(s) stopped"
          + (f" ({remote.stopped} on private nodes, {remote.tasks_killed} task(s) killed there)"
             if remote.stopped or remote.tasks_killed else "")
          + (f", {len(failed)} FAILED" if failed else "")
          + (", its moto server stopped" if server is not None else ""))
    for line in failed:
        print(f"  could not terminate {line}")
    for line in remote.unreachable:
        print(f"  could not reach {line}")
    for line in problems:
        print(f"  note: {line}")
    return 1 if failed or remote.unreachable or any("could not" in p for p in problems) else 0


def _was_left(run_dir: Path) -> bool:
    from broker.shells.journal import Journal, JournalError

    try:
        with Journal.open(run_dir, readonly=True) as journal:
            record = journal.run()
            return record is not None and left_on_purpose(journal, record)
    except (JournalError, sqlite3.Error, OSError):
        return False  # a journal that cannot be read: bring the run down


def left_on_purpose(journal, record) -> bool:
    """The daemon stopped with ``--on-stop leave`` and nothing resumed the run since."""
    if record.state != "running":
        return False
    left = [at for at, _, _ in journal.events("run.left")]
    since = [at for name in ("run.start", "run.resume") for at, _, _ in journal.events(name)]
    return bool(left) and max(left) >= max(since, default=0.0)


def ended_cleanly(journal, record) -> bool:
    """The run ended (finished or stopped) with nothing of it left: every instance
    terminated, no intent open, no attempt running."""
    return (record.state in ("finished", "stopped")
            and all(i.state == "terminated" for i in journal.instances())
            and not journal.pending_intents() and not journal.running_attempts())


class _RemoteStops:
    """What stopping the agents on the private SSH nodes did."""

    def __init__(self) -> None:
        self.stopped = 0
        self.tasks_killed = 0
        self.unreachable: list[str] = []


def _stop_private_agents(record, problems: list[str]) -> _RemoteStops:
    """Stop the run's agent and its tasks on every private SSH node, all nodes at once."""
    from concurrent.futures import ThreadPoolExecutor

    from broker.config.errors import ConfigError
    from broker.config.inventory import load_inventory

    done = _RemoteStops()
    if not record.inventory_path:
        return done
    base = record.options.get("cwd")
    path = Path(base, record.inventory_path) if base else Path(record.inventory_path)
    try:
        inventory = load_inventory(path, base=base)
    except ConfigError as exc:
        problems.append(f"could not read the run's inventory {path}, so its private nodes were not reached: "
                        f"{exc.problems[0].render() if exc.problems else exc}")
        return done
    nodes = [n for n in inventory.private if not n.local and n.host and n.key]
    if not nodes:
        return done
    with ThreadPoolExecutor(max_workers=min(16, len(nodes)), thread_name_prefix="down") as pool:
        outcomes = list(pool.map(lambda n: _stop_on_node(record.id, n), nodes))
    for node, outcome in zip(nodes, outcomes):
        if isinstance(outcome, str):
            done.unreachable.append(f"private node {node.name}: {outcome}; its agent cancels its tasks and "
                                    f"exits by itself {_duration(node.lease_s)} after it last heard from a "
                                    f"broker (its lease); `broker down` again once the node is back")
        else:
            done.stopped += 1 if outcome.get("stopped") else 0
            done.tasks_killed += int(outcome.get("tasks_killed") or 0)
    return done


def _stop_on_node(run_id: str, node) -> dict | str:
    """``agent.py stop`` for the run on ``node`` over SSH; what it reported, or why it failed."""
    from broker.shells.nodes import stop_remote_agent
    from broker.shells.ssh import SshError, SshTarget, connect

    try:
        with connect(SshTarget.for_node(node)) as session:
            return stop_remote_agent(session, run_id, node.name, keep_s=node.keep_s)
    except (SshError, ConnectionError, OSError, ValueError) as exc:
        return str(exc)


def _duration(seconds: float) -> str:
    from broker.core.units import format_duration

    return format_duration(seconds)


def _bring_down(journal, record, server, problems: list[str]) -> tuple[list[str], list[str]]:
    """Terminate the run's instances, close what the journal left open; returns the ids
    terminated and a line per instance that could not be."""
    import time

    from broker.shells.metrics import run_now_s

    left = [i for i in journal.instances() if i.state != "terminated"]
    if not journal.instances() and not journal.actions("launch"):
        terminated, failed = [], []  # nothing was ever launched: nothing to ask EC2
    elif not record.options.get("dry_run"):
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


def _terminate_dry(record, server, known_ids: list[str]) -> tuple[list[str], list[str]]:
    """The dry run's instances in its moto server: the journal's and any under the tag."""
    from broker.config.aws import AwsSettings
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

    from broker.config.errors import ConfigError

    base = record.options.get("cwd")
    try:
        inventory = load_inventory(Path(base, record.inventory_path) if base else record.inventory_path,
                                   base=base) if record.inventory_path else None
    except ConfigError:
        inventory = None  # the instances are found by the run's tag all the same
    settings = inventory.aws if inventory is not None else None
    if settings is None:
        from broker.config.aws import AwsSettings

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
