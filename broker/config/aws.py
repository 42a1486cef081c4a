"""The inventory's ``aws:`` section as live runs use it: where and how to rent and reach EC2.

Configuration, not domain: the pure core never reads it (``Inventory.aws`` carries it opaque).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True, slots=True)
class AwsSettings:
    """Connection fields for live runs; all optional so plans and simulations need none."""

    region: str | None = None
    ami: str | None = None
    key_name: str | None = None
    security_group: str | None = None
    subnet: str | None = None
    instance_profile: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # How a live run reaches its instances over SSH (see broker/shells/nodes.py).
    user: str = "ec2-user"  # the AMI's login (Amazon Linux: ec2-user, Ubuntu: ubuntu)
    key: str | None = None  # private key file of the key pair ``key_name``
    address: str = "public"  # public | private: which IP describe_instances gives to use
    host_key_policy: str = "console"  # console | known-hosts | accept-new
    known_hosts: str | None = None  # for known-hosts (default ~/.ssh/known_hosts)
    ssh_port: int = 22
    ssh_timeout_s: float = 300.0  # boot done -> agent attached, else the instance is released
    agent_dir: str = "~/.broker"  # on the instances: the agent in agent/, its state in runs/
    user_data: str | None = None  # the text of aws.user_data, passed to RunInstances (deploy/user-data.sh)
