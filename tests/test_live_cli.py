"""``broker run`` without ``--dry-run`` on an inventory with EC2 types: the live wiring.

EC2 is moto in this process (fake credentials, no network); the address EC2 reports for each
instance is looked up as in a real run and then replaced by 127.0.0.1, where a test sshd
stands in for the instances (moto's addresses are invented and never contacted). Host keys
are checked against the test sshd's known_hosts (``host_key_policy: known-hosts``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.cli import main
from broker.shells.aws import fleet as fleet_module
from broker.shells.moto_world import fake_aws_environment
from tests.test_live_instances import remote_root  # noqa: F401 - a fixture
from tests.sshd import TestSshd

pytestmark = [pytest.mark.sshd]


def test_a_live_run_launches_reaches_and_releases_its_instances(sshd: TestSshd, tmp_path: Path, capsys,
                                                                monkeypatch, remote_root) -> None:  # noqa: F811
    import boto3
    from moto import mock_aws

    reported: dict[str, str | None] = {}
    original = fleet_module.Ec2Fleet.address_of

    def loopback(self, instance_id: str, which: str = "public") -> str | None:
        reported[instance_id] = original(self, instance_id, which)  # what EC2 says ...
        return "127.0.0.1" if reported[instance_id] else None  # ... is never contacted

    monkeypatch.setattr(fleet_module.Ec2Fleet, "address_of", loopback)
    work = tmp_path / "work"
    work.mkdir()
    bag = tmp_path / "bag.yaml"
    bag.write_text(f"command: 'echo {{i}} > out-{{i}}.txt'\nsweep: {{i: [1, 2, 3, 4]}}\ntimeout: 30s\n"
                   f"workdir: {work}\noutputs: 'out-{{i}}.txt'\n")
    with fake_aws_environment("us-east-1"), mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = sorted(i["ImageId"] for i in ec2.describe_images(  # the preflight checks the architecture
            Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"])[0]
        group = ec2.create_security_group(GroupName="broker-test", Description="test")["GroupId"]
        ec2.create_key_pair(KeyName="broker-test")
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(
            "aws:\n  region: us-east-1\n"
            f"  ami: {ami}\n  key_name: broker-test\n  security_group: {group}\n"
            f"  user: {sshd.user}\n  key: {sshd.client_key_path}\n  address: private\n"
            f"  host_key_policy: known-hosts\n  known_hosts: {sshd.known_hosts_path}\n"
            f"  ssh_port: {sshd.port}\n  ssh_timeout: 20s\n  agent_dir: {remote_root}\n"
            "  types:\n    - {name: c5.large, slots: 2, speed: 1, price: 0.085, limit: 2, boot: 1s}\n"
        )
        run_dir = tmp_path / "run"
        rc = main(["run", "--yes", "--json-report", "--inventory", str(inventory), str(bag), "--run-dir",
                   str(run_dir), "--tick", "2s", "--deadline", "30m"])
        out = capsys.readouterr()
        states = {i["InstanceId"]: i["State"]["Name"]
                  for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert rc == 0, out.err[-3000:]
    report = json.loads(out.out)
    assert report["tasks"]["done"] == 4 and report["instances_launched"] >= 1
    assert states and set(states.values()) == {"terminated"}
    assert set(reported) == set(states) and all(reported.values())
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["node"] for e in lines if e["event"] == "task.done"} <= set(states)
    assert any(e["event"] == "ssh.connect" and e["port"] == sshd.port for e in lines)
    assert (remote_root / "agent" / "agent.py").is_file()  # aws.agent_dir: where the agent went
    for i, task in enumerate(["t000001", "t000002", "t000003", "t000004"], 1):
        assert (run_dir / "outputs" / task / f"out-{i}.txt").read_text() == f"{i}\n"


def test_a_live_run_without_an_ssh_key_for_its_instances_is_refused(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("aws:\n  region: r\n  ami: ami-0\n  key_name: k\n  security_group: sg-0\n"
                         "  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: 1}\n")
    bag = tmp_path / "bag.yaml"
    (tmp_path / "tasks.txt").write_text("true\n")
    bag.write_text("tasks_file: tasks.txt\ntimeout: 1s\n")
    assert main(["run", "--yes", "--inventory", str(inventory), str(bag), "--run-dir", str(tmp_path / "r")]) == 2
    assert (f"{inventory}: a live run logs in to its EC2 instances over SSH: give aws.key, the private key file "
            "of the key pair aws.key_name (or use --dry-run)") in capsys.readouterr().err
    assert not (tmp_path / "r" / "journal.sqlite").exists()
