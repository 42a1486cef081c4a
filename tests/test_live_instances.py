"""A live run's EC2 instances reached over real SSH: moto for EC2, a test sshd for the machines.

moto's instance addresses are invented and never contacted: ``address_of`` first asks the
fleet for the address EC2 reports (as a live run does) and then maps the instance to the
test sshd on 127.0.0.1. The instance's "console" carries the sshd's real host key inside
cloud-init's block, so the default ``console`` host-key policy is exercised end to end.
Tasks really run under the agent shipped over SFTP and started over SSH.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest
from structlog.testing import capture_logs

from broker.config.bag import parse_bag
from broker.config.inventory import parse_inventory
from broker.core.control.controller import ControllerConfig
from broker.core.control.snapshot import Goal
from broker.shells.aws import Ec2Fleet, InstanceState
from broker.shells.clock import RunClock
from broker.shells.run import Daemon, DaemonOptions, RunNodes
from broker.shells.journal import Journal
from broker.shells.local_transport import stop_local_agent
from broker.shells.moto_world import mock_ec2
from broker.shells.nodes import InstanceAgents, InstanceUnreachable
from broker.shells.ssh import HostKeyChanged, HostKeyUnknown
from tests.processes import agent_task_processes
from tests.sshd import TestSshd, connects_to

pytestmark = [pytest.mark.sshd]

INVENTORY = """\
aws:
  region: us-east-1
  billing: hourly
  types:
    - {name: c5.xlarge, slots: 2, speed: 1, price: 0.17, limit: 3, boot: 30s}
"""

BAG = """\
command: "sleep 0.2; echo task-{i} > result-{i}.txt; echo ran-{i}"
sweep:
  i: {range: [0, 6]}
timeout: 1m
retries: 1
workdir: WORKDIR
outputs: "result-{i}.txt"
"""


def console_with(host_public_key: str) -> str:
    """Console text as an EC2 instance shows it: kernel noise, then cloud-init's key block."""
    key_type, blob = host_public_key.split()[:2]
    return (
        "[    0.000000] Linux version 6.1.0\n"
        "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
        f"ec2: 256 SHA256:abc root@ip-10-0-0-1 ({key_type})\n"
        "ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        f"{key_type} {blob} root@ip-10-0-0-1\n"
        "-----END SSH HOST KEY KEYS-----\n"
        "cloud-init finished\n"
    )


@pytest.fixture
def remote_root(tmp_path: Path) -> Iterator[Path]:
    """Where the 'instances' keep the agent and its state; no agent or task may outlive the test."""
    root = tmp_path / "remote"
    yield root
    runs = root / "runs"
    state_dirs = [d for run in runs.iterdir() for d in run.iterdir()] if runs.exists() else []
    leaked = []
    for state_dir in state_dirs:
        stop_local_agent(state_dir, timeout_s=5.0)
        leaked += agent_task_processes(state_dir)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"task processes outlived the test: {leaked}"


def run_live(sshd: TestSshd, tmp_path: Path, remote_root: Path, *, address_for=None, ssh_timeout_s: float = 20.0,
             console=None):
    """One live-style run through the daemon; returns (report, journal events, fleet states, lookups)."""
    work = tmp_path / "work"
    work.mkdir()
    inventory = parse_inventory(INVENTORY)
    bag = parse_bag(BAG.replace("WORKDIR", str(work)), str(tmp_path / "bag.yaml"))
    run_id = "live-test"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    inbox: queue.Queue = queue.Queue()
    looked_up: list[tuple[str, str | None]] = []
    with mock_ec2(inventory.aws, run_id) as (client, settings):
        fleet = Ec2Fleet(client, settings, run_id)
        ssh = replace(settings, user=sshd.user, key=str(sshd.client_key_path), ssh_port=sshd.port,
                      ssh_timeout_s=ssh_timeout_s, agent_dir=str(remote_root))

        def address_of(instance_id: str) -> str:
            reported = fleet.address_of(instance_id, "private")  # what a live run would use ...
            looked_up.append((instance_id, reported))
            return address_for(instance_id) if address_for else "127.0.0.1"  # ... never contacted

        def console_of(instance_id: str) -> str:
            return (console or console_with)(sshd.host_public_key)

        agents = InstanceAgents(run_id, run_dir, inbox, ssh, address_of=address_of, console_of=console_of)
        clock = RunClock(60.0)
        with Journal.open(run_dir, clock=clock.now_s, anchor_s=clock.epoch_anchor_s) as journal:
            journal.create_run(run_id, goal_kind="deadline", goal_value=600.0, deadline_s=600.0,
                               retries=bag.retries, tasks=bag.tasks)
            daemon = Daemon(
                inventory, bag, Goal("deadline", 600.0),
                DaemonOptions(run_dir=run_dir, run_id=run_id, dry_run=False, tick_s=60.0),
                journal=journal, clock=clock, fleet=fleet, nodes=RunNodes(inventory, instances=agents), inbox=inbox,
                config=ControllerConfig(tick_s=60.0, margin_s=120.0),
            )
            with capture_logs() as logs:
                report = daemon.run()
            journal_events = journal.events()
        states = {r.id: r.state for r in fleet.describe().instances}
    return report, journal_events, logs, states, looked_up, work


def named(journal_events, name: str) -> list[dict]:
    return [fields for _, event, fields in journal_events if event == name]


def test_a_live_run_reaches_its_instances_over_ssh_and_releases_them(sshd: TestSshd, tmp_path: Path,
                                                                      remote_root: Path) -> None:
    report, journal_events, logs, states, looked_up, work = run_live(sshd, tmp_path, remote_root)

    assert report.tasks_done == 6 and report.tasks_failed == 0 and report.instances_launched >= 1
    instance_ids = set(states)
    assert instance_ids and all(state.gone for state in states.values())  # every instance released
    assert {e["instance_id"] for e in named(journal_events, "instance.terminated")} == instance_ids
    # Each instance's address came from EC2's describe_instances (then mapped to the test sshd).
    assert {i for i, _ in looked_up} == {e["instance_id"] for e in named(journal_events, "instance.ready")}
    assert all(reported for _, reported in looked_up)
    # The tasks ran under agents that were shipped and started over SSH, one per instance.
    done = named(journal_events, "task.done")
    assert sorted(e["task"] for e in done) == [f"t00000{i}" for i in range(1, 7)]
    assert {e["node"] for e in done} <= instance_ids
    assert any(e.get("event") == "ssh.connect" and e["port"] == sshd.port for e in logs)
    assert any(e.get("event") == "ssh.host_keys_from_console" for e in logs)
    assert not any(e.get("event") == "ssh.host_key_trusted" for e in logs)
    for node in {e["node"] for e in done}:
        state_dir = remote_root / "runs" / "live-test" / node
        assert (state_dir / "journal").is_file() and (remote_root / "agent" / "agent.py").is_file()
    assert sorted(p.name for p in work.iterdir()) == sorted(f"result-{i}.txt" for i in range(6))
    # Each task's declared output came back over SFTP before its instance was released.
    fetched = named(journal_events, "task.outputs")
    assert sorted(e["task"] for e in fetched) == [f"t00000{i}" for i in range(1, 7)]
    for i in range(6):
        copy = tmp_path / "run" / "outputs" / f"t00000{i + 1}" / f"result-{i}.txt"
        assert copy.read_text() == f"task-{i}\n"
    assert not named(journal_events, "task.outputs_failed")


def test_an_instance_unreachable_within_the_timeout_is_released_and_the_run_goes_on(
    sshd: TestSshd, tmp_path: Path, remote_root: Path
) -> None:
    unreachable: list[str] = []

    def address_for(instance_id: str) -> str:
        # The first instance "never opens its port": 127.0.0.2 is loopback, but sshd is not there.
        if not unreachable:
            unreachable.append(instance_id)
        return "127.0.0.2" if instance_id == unreachable[0] else "127.0.0.1"

    report, journal_events, _logs, states, _looked_up, _work = run_live(
        sshd, tmp_path, remote_root, address_for=address_for, ssh_timeout_s=2.0)

    lost = named(journal_events, "node.lost")
    assert [e["node"] for e in lost] == unreachable
    assert "127.0.0.2" in lost[0]["reason"] and "gave up after" in lost[0]["reason"]
    terminated = {e["instance_id"]: e["cause"] for e in named(journal_events, "instance.terminated")}
    assert terminated[unreachable[0]] == "node_lost"
    assert all(state.gone for state in states.values())
    # The controller re-planned around the loss: another instance ran every task.
    assert report.instances_launched >= 2 and report.tasks_done == 6
    assert unreachable[0] not in {e["node"] for e in named(journal_events, "task.done")}


# -- InstanceAgents alone -------------------------------------------------------------------
def agents_for(sshd: TestSshd, tmp_path: Path, remote_root: Path, **settings) -> InstanceAgents:
    aws = parse_inventory(INVENTORY).aws
    aws = replace(aws, **{"user": sshd.user, "key": str(sshd.client_key_path), "ssh_port": sshd.port,
                          "ssh_timeout_s": 3.0, "agent_dir": str(remote_root), **settings})
    return InstanceAgents("unit", tmp_path / "run", queue.Queue(), aws, address_of=lambda i: "127.0.0.1",
                          console_of=lambda i: console_with(sshd.host_public_key))


def test_a_host_key_other_than_the_console_shows_is_refused_at_once(sshd: TestSshd, tmp_path: Path,
                                                                     remote_root: Path) -> None:
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEaZ0+9dxwMzw2bm4nn54Xm6mLBsiCBrB0sxM7HpLoSm"
    agents = agents_for(sshd, tmp_path, remote_root)
    agents.console_of = lambda i: console_with(other)
    with connects_to(sshd.host, sshd.port) as attempts, pytest.raises(InstanceUnreachable) as exc:
        agents.attach("i-0abc", 1)
    assert isinstance(exc.value.__cause__, HostKeyChanged)
    assert "i-0abc" in str(exc.value) and "does not match known_hosts" in str(exc.value)
    assert len(attempts) == 1  # never retried within its 3 s timeout: waiting cannot fix it
    assert (tmp_path / "run" / "known_hosts.d" / "i-0abc").read_text().split()[2] == other.split()[1]


def test_no_console_keys_within_the_timeout_names_what_was_missing(sshd: TestSshd, tmp_path: Path,
                                                                  remote_root: Path) -> None:
    slept: list[float] = []
    now = [0.0]
    agents = agents_for(sshd, tmp_path, remote_root, ssh_timeout_s=20.0)
    agents.console_of = lambda i: "[    0.0] booting\n"  # cloud-init has not printed its keys yet
    agents._clock, agents._sleep = (lambda: now[0]), (lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    with pytest.raises(InstanceUnreachable, match=r"instance i-1 gave no SSH host keys on its console .* \(20 s\)"):
        agents.attach("i-1", 1)
    assert slept == [1.0, 2.0, 4.0, 8.0, 5.0]  # doubling pauses, the last one cut to the deadline


def test_accept_new_trusts_the_first_key_and_logs_it(sshd: TestSshd, tmp_path: Path, remote_root: Path) -> None:
    agents = agents_for(sshd, tmp_path, remote_root, host_key_policy="accept-new")
    with capture_logs() as logs:
        client = agents.attach("i-2", 1)
    try:
        assert client.hello is not None and client.hello.slots == 1
    finally:
        agents.stop("i-2", client)
    trusted = [e for e in logs if e.get("event") == "ssh.host_key_trusted"]
    assert len(trusted) == 1 and trusted[0]["fingerprint"] and trusted[0]["port"] == sshd.port
    recorded = (tmp_path / "run" / "known_hosts.d" / "i-2").read_text()
    assert recorded.strip() == f"[127.0.0.1]:{sshd.port} {sshd.host_public_key}"


def test_known_hosts_policy_refuses_an_instance_whose_key_is_not_there(sshd: TestSshd, tmp_path: Path,
                                                                      remote_root: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    agents = agents_for(sshd, tmp_path, remote_root, host_key_policy="known-hosts", known_hosts=str(empty))
    with pytest.raises(InstanceUnreachable) as exc:
        agents.attach("i-3", 1)
    assert isinstance(exc.value.__cause__, HostKeyUnknown)
    agents = agents_for(sshd, tmp_path, remote_root, host_key_policy="known-hosts",
                        known_hosts=str(sshd.known_hosts_path))
    client = agents.attach("i-3", 1)
    agents.stop("i-3", client)


def test_releasing_an_instance_abandons_the_attach_under_way(sshd: TestSshd, tmp_path: Path,
                                                             remote_root: Path) -> None:
    agents = agents_for(sshd, tmp_path, remote_root, ssh_timeout_s=60.0)
    agents.address_of = lambda i: None  # no address yet: the attach keeps waiting
    outcome: queue.Queue = queue.Queue()
    agents.attach_in_background("i-4", 1, lambda client, error: outcome.put((client, error)))
    time.sleep(0.2)
    assert outcome.empty()
    agents.stop("i-4", None)  # the daemon releases the instance meanwhile
    client, error = outcome.get(timeout=10.0)  # far sooner than the 60 s timeout
    assert client is None and isinstance(error, InstanceUnreachable)
    assert "i-4 was released while waiting for its public IP address" in str(error)


def test_attach_in_background_hands_over_the_client(sshd: TestSshd, tmp_path: Path, remote_root: Path) -> None:
    agents = agents_for(sshd, tmp_path, remote_root)
    outcome: queue.Queue = queue.Queue()
    agents.attach_in_background("i-5", 2, lambda client, error: outcome.put((client, error)))
    client, error = outcome.get(timeout=20.0)
    assert error is None and client.hello.slots == 2 and client.hello.node == "i-5"
    agents.stop("i-5", client)
