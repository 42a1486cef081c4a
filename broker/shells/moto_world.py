"""The dry run's AWS: moto in-process, with fake credentials that can never reach an account.

:func:`mock_ec2` sets ``AWS_ACCESS_KEY_ID=testing`` (and the secret, session token, region,
``AWS_EC2_METADATA_DISABLED=true``) *before* boto3 is used, starts moto's ``mock_aws``, and
creates what a launch needs to look real: a VPC, a subnet, a security group, a key pair and
an AMI. The inventory's ``aws`` section cannot name these (moto makes up its own ids), so
the settings handed back keep the inventory's region and tags and point at the created ones.
Everything is undone on exit, environment included. The instance addresses moto reports are
fake and never contacted: the dry-run shell realizes each instance as a local agent.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

from broker.core.model import AwsSettings

DEFAULT_REGION = "us-east-1"
_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Files a real account's credentials could come from: pointed at nothing during the dry run.
_MASKED_FILES = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
# An endpoint override (LocalStack users set one) would send moto's requests past moto.
_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_STS")


@contextmanager
def fake_aws_environment(region: str) -> Iterator[None]:
    """Fake credentials and region in ``os.environ`` for the block; the old values after."""
    saved = {k: os.environ.get(k) for k in (*_FAKE_ENV, *_MASKED_FILES, "AWS_DEFAULT_REGION", *_UNSET)}
    os.environ.update(_FAKE_ENV)
    os.environ["AWS_DEFAULT_REGION"] = region
    for name in _UNSET:
        os.environ.pop(name, None)
    for name in _MASKED_FILES:
        os.environ[name] = os.devnull
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def mock_ec2(settings: AwsSettings, run_id: str) -> Iterator[tuple[Any, AwsSettings]]:
    """An EC2 client served by moto and the settings to launch with inside it."""
    region = settings.region or DEFAULT_REGION
    with fake_aws_environment(region):
        import boto3
        from moto import mock_aws

        with mock_aws():
            ec2 = boto3.client("ec2", region_name=region)
            yield ec2, _create_world(ec2, settings, region, run_id)


def _create_world(ec2: Any, settings: AwsSettings, region: str, run_id: str) -> AwsSettings:
    vpc_id = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    subnet_id = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.77.1.0/24")["Subnet"]["SubnetId"]
    group_id = ec2.create_security_group(
        GroupName=f"broker-dry-run-{run_id}", Description="broker dry run", VpcId=vpc_id
    )["GroupId"]
    key_name = settings.key_name or "broker-dry-run"
    ec2.create_key_pair(KeyName=key_name)
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    if not images:  # pragma: no cover - moto ships a catalogue of public AMIs
        raise RuntimeError("moto offers no AMI to launch from")
    return replace(
        settings,
        region=region,
        ami=sorted(i["ImageId"] for i in images)[0],
        key_name=key_name,
        security_group=group_id,
        subnet=subnet_id,
        instance_profile=None,
    )
