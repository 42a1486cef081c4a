"""deploy/iam-policy.json grants what the EC2 shell calls, and nothing else.

The calls are found by reading the shell's source (``self._ec2.<method>(``,
``self._sts.<method>(`` and ``get_waiter("<name>")``), so a new boto3 call without its
permission fails here rather than in a user's account.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import botocore.session
import pytest

from broker.shells.aws import MANAGED_TAG

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "deploy" / "iam-policy.json"
SHELL_SOURCES = sorted((ROOT / "broker" / "shells" / "aws").glob("*.py"))

# Granted for what RunInstances does on the broker's behalf, not called by name.
IMPLIED = {"ec2:CreateTags", "iam:PassRole"}


def _policy() -> dict:
    return json.loads(POLICY.read_text())


def _actions(statement: dict) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def _resources(statement: dict) -> list[str]:
    resource = statement["Resource"]
    return [resource] if isinstance(resource, str) else list(resource)


def _statements_for(action: str) -> list[dict]:
    return [s for s in _policy()["Statement"] if action in _actions(s)]


def _called_actions() -> set[str]:
    """IAM actions of every boto3 call and waiter in broker/shells/aws/*.py."""
    offline = {"region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    apis = {
        "ec2": boto3.client("ec2", **offline).meta.method_to_api_mapping,
        "sts": boto3.client("sts", **offline).meta.method_to_api_mapping,
    }
    waiters = botocore.session.get_session().get_waiter_model("ec2")
    actions: set[str] = set()
    for path in SHELL_SOURCES:
        source = path.read_text()
        for service, method in re.findall(r"self\._(ec2|sts)\.(\w+)\(", source):
            if method == "get_waiter":
                continue
            actions.add(f"{service}:{apis[service][method]}")
        for waiter in re.findall(r'get_waiter\("(\w+)"\)', source):
            camel = "".join(part.capitalize() for part in waiter.split("_"))
            actions.add(f"ec2:{waiters.get_waiter(camel).operation}")
    return actions


def test_policy_is_a_well_formed_allow_only_document() -> None:
    policy = _policy()
    assert policy["Version"] == "2012-10-17"
    assert policy["Statement"]
    sids = [s["Sid"] for s in policy["Statement"]]
    assert len(sids) == len(set(sids)) and all(re.fullmatch(r"[A-Za-z0-9]+", sid) for sid in sids)
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}
        assert _actions(statement) and _resources(statement)


def test_the_source_scan_finds_the_calls_the_shell_makes() -> None:
    assert {
        "ec2:RunInstances",
        "ec2:DescribeInstances",
        "ec2:TerminateInstances",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeImages",
        "sts:GetCallerIdentity",
    } <= _called_actions()


def test_every_call_is_allowed_and_nothing_else_is() -> None:
    granted = {a for s in _policy()["Statement"] for a in _actions(s)}
    assert _called_actions() <= granted
    assert granted == _called_actions() | IMPLIED


def test_no_action_is_a_wildcard() -> None:
    for statement in _policy()["Statement"]:
        for action in _actions(statement):
            assert "*" not in action and "?" not in action, action


def test_terminate_is_allowed_only_on_instances_tagged_as_managed() -> None:
    statements = _statements_for("ec2:TerminateInstances")
    assert statements
    for statement in statements:
        assert statement["Condition"]["StringEquals"][f"aws:ResourceTag/{MANAGED_TAG}"] == "true"
        assert all(":instance/" in r for r in _resources(statement))


def test_run_instances_creates_instances_and_volumes_only_with_the_managed_request_tag() -> None:
    statements = _statements_for("ec2:RunInstances")
    created = [s for s in statements if any(":instance/" in r or ":volume/" in r for r in _resources(s))]
    assert created
    for statement in created:
        assert statement["Condition"]["StringEquals"][f"aws:RequestTag/{MANAGED_TAG}"] == "true"
    for statement in statements:
        assert "*" not in _resources(statement)


def test_tags_can_be_written_only_by_the_launch_itself_and_only_with_the_managed_tag() -> None:
    statements = _statements_for("ec2:CreateTags")
    assert statements
    for statement in statements:
        assert statement["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"
        assert statement["Condition"]["StringEquals"][f"aws:RequestTag/{MANAGED_TAG}"] == "true"
        assert all(":instance/" in r or ":volume/" in r for r in _resources(statement))


def test_no_statement_allows_deleting_tags_or_a_wildcard_resource_for_a_mutating_action() -> None:
    mutating = {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "iam:PassRole"}
    for statement in _policy()["Statement"]:
        assert "ec2:DeleteTags" not in _actions(statement)
        if mutating & set(_actions(statement)):
            assert "*" not in _resources(statement), statement["Sid"]


def test_what_the_policy_requires_is_what_a_launch_sends() -> None:
    """The tag the conditions name is the one the fleet puts on every instance and volume."""
    from broker.core.model import AwsSettings
    from broker.shells.aws import Ec2Fleet

    class _NoCalls:
        def run_instances(self, **_):  # pragma: no cover - never called: only the parameters are built
            raise AssertionError

    fleet = Ec2Fleet(_NoCalls(), AwsSettings(region="us-east-1", ami="ami-1"), "run-1")
    params = fleet._run_params("t3.micro", 1, "tok", None)
    for spec in params["TagSpecifications"]:
        assert spec["ResourceType"] in ("instance", "volume")
        assert {"Key": MANAGED_TAG, "Value": "true"} in spec["Tags"]


@pytest.mark.parametrize("statement", _statements_for("iam:PassRole"), ids=lambda s: s["Sid"])
def test_pass_role_is_limited_to_the_agent_role_and_to_ec2(statement: dict) -> None:
    assert all(r != "*" and ":role/" in r for r in _resources(statement))
    assert statement["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
