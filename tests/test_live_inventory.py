"""The inventory's aws fields for reaching instances over SSH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.config.errors import ConfigError
from broker.config.inventory import parse_inventory

LIVE = "  region: r\n  ami: ami-0\n  key_name: k\n  security_group: sg-0\n"
TYPES = "  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: 1}\n"


def test_ssh_fields_are_read_with_their_defaults(tmp_path: Path) -> None:
    default = parse_inventory("aws:\n" + TYPES).aws
    assert (default.user, default.key, default.address, default.host_key_policy, default.ssh_port,
            default.ssh_timeout_s, default.agent_dir) == ("ec2-user", None, "public", "console", 22, 300.0, "~/.broker")
    key = tmp_path / "id"
    key.write_text("k")
    os.chmod(key, 0o600)
    aws = parse_inventory(
        f"aws:\n{LIVE}  user: ubuntu\n  key: {key}\n  address: private\n  host_key_policy: accept-new\n"
        f"  known_hosts: ~/kh\n  ssh_port: 2222\n  ssh_timeout: 2m\n  agent_dir: /opt/broker-agent\n" + TYPES,
        live=True).aws
    assert (aws.user, aws.key, aws.address, aws.host_key_policy, aws.ssh_port, aws.ssh_timeout_s, aws.agent_dir) == (
        "ubuntu", str(key), "private", "accept-new", 2222, 120.0, "/opt/broker-agent")
    assert aws.known_hosts == os.path.expanduser("~/kh")


def test_bad_ssh_fields_are_all_reported(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("k")
    os.chmod(key, 0o644)
    text = (f"aws:\n  key: {key}\n  address: elastic\n  host_key_policy: accept-all\n  ssh_port: 0\n"
            "  ssh_timeout: soon\n" + LIVE + TYPES)
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml", live=True)
    problems = [p.render() for p in exc.value.problems]
    assert problems[0].startswith(f"inv.yaml:2: aws.key: SSH key {key} is accessible by group or others")
    assert problems[1] == "inv.yaml:3: aws.address: unknown value 'elastic' (expected one of: private, public)"
    assert problems[2] == "inv.yaml:4: aws.host_key_policy: unknown value 'accept-all' (did you mean 'accept-new'?)"
    assert problems[3].startswith("inv.yaml:5: aws.ssh_port: expected an integer from 1 to 65535")
    assert problems[4].startswith("inv.yaml:6: aws.ssh_timeout:")
    assert len(problems) == 5
