"""deploy/iam-policy.json and ``broker iam-policy`` grant what the EC2 shell calls, and nothing else.

The calls are found by reading the shell's source (``self._ec2.<method>(``,
``self._sts.<method>(``, the preflight's ``self.clients.<ec2|sts|quotas>.<method>(`` and
``get_waiter("<name>")``), so a new boto3 call without its permission fails here rather
than in a user's account. ``deploy/iam-policy.json`` is the generated policy for no inventory,
byte for byte, so the two cannot drift apart.

parliament (the IAM policy linter) runs on generated policies. It reports two things we
accept, explicitly and nothing else:

- ``PRIVILEGE_ESCALATION`` ``CreateEC2WithExistingIP`` (with ``PERMISSIONS_MANAGEMENT_ACTIONS``
  for ``iam:passrole``): PassRole together with RunInstances lets the holder start an instance
  with a ``broker-agent-*`` role and act as that role. It is granted only when the inventory
  names an instance profile; deploy/README.md and the policy module say so.
- ``RESOURCE_MISMATCH`` for ``ec2:RunInstances``: parliament checks each statement alone and
  wants every resource type of the call in each (duo-labs/parliament issues #3 and #48), while
  AWS's own documented pattern splits them so that a condition on the instance (its type, its
  tags) is not applied to the image, group or subnet, where its key is absent and would deny
  the launch. The test accepts it only when the RunInstances statements together cover every
  resource type parliament asks for, which is what AWS evaluates.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import boto3
import botocore.session
import pytest

from broker.config.inventory import load_inventory, parse_inventory
from broker.shells.aws import MANAGED_TAG, RUN_TAG
from broker.shells.aws.iam import iam_policy

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "deploy" / "iam-policy.json"
SHELL_SOURCES = sorted((ROOT / "broker" / "shells" / "aws").glob("*.py"))
_CLIENTS = {"ec2": ("ec2", "ec2"), "sts": ("sts", "sts"), "quotas": ("service-quotas", "servicequotas")}

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
    apis = {name: boto3.client(client, **offline).meta.method_to_api_mapping for name, (client, _) in _CLIENTS.items()}
    waiters = botocore.session.get_session().get_waiter_model("ec2")
    actions: set[str] = set()
    for path in SHELL_SOURCES:
        source = path.read_text()
        for service, method in re.findall(r"(?:self\._|self\.clients\.)(ec2|sts|quotas)\.(\w+)\(", source):
            if method == "get_waiter":
                continue
            actions.add(f"{_CLIENTS[service][1]}:{apis[service][method]}")
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
        "ec2:DescribeInstanceTypeOfferings",
        "ec2:DescribeKeyPairs",
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
        "servicequotas:GetServiceQuota",
        "servicequotas:GetAWSDefaultServiceQuota",
    } <= _called_actions()


def test_every_call_is_allowed_and_nothing_else_is() -> None:
    granted = {a for s in _policy()["Statement"] for a in _actions(s)}
    assert _called_actions() <= granted
    assert granted == _called_actions() | IMPLIED


def test_no_action_is_a_wildcard() -> None:
    for statement in _policy()["Statement"]:
        for action in _actions(statement):
            assert "*" not in action and "?" not in action, action


def test_the_deployed_policy_is_the_generated_generic_one() -> None:
    assert POLICY.read_text() == json.dumps(iam_policy(None), indent=2) + "\n"


def test_terminate_is_allowed_only_on_instances_tagged_as_managed_with_a_run() -> None:
    statements = _statements_for("ec2:TerminateInstances")
    assert statements
    for statement in statements:
        assert statement["Condition"]["StringEquals"][f"aws:ResourceTag/{MANAGED_TAG}"] == "true"
        assert statement["Condition"]["Null"][f"aws:ResourceTag/{RUN_TAG}"] == "false"
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
    from broker.config.aws import AwsSettings
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


# -- the policy generated from an inventory (`broker iam-policy`) ------------------------------
_INVENTORY = """
aws:
  region: eu-west-1
  ami: ami-0123456789abcdef0
  key_name: broker
  security_group: sg-0123456789abcdef0
  subnet: subnet-0123456789abcdef0
  {profile}
  tags: {{deployment: lab-a}}
  types:
    - {{name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 2}}
    - {{name: c5.xlarge, slots: 4, speed: 1.2, price: 0.2, limit: 2}}
"""


def _generated(profile: bool = False) -> dict:
    text = _INVENTORY.format(profile="instance_profile: broker-agent-lab" if profile else "")
    return iam_policy(parse_inventory(text, "inv.yaml"))


def _granted(policy: dict) -> set[str]:
    return {a for s in policy["Statement"] for a in _actions(s)}


def test_the_generated_policy_grants_exactly_the_calls_and_pass_role_only_with_a_profile() -> None:
    assert _granted(_generated(profile=True)) == _called_actions() | IMPLIED
    assert _granted(_generated(profile=False)) == _called_actions() | {"ec2:CreateTags"}


def test_run_instances_is_limited_to_the_inventorys_types_region_image_group_subnet_and_key() -> None:
    policy = _generated()
    (instance,) = [s for s in policy["Statement"] if s["Action"] == "ec2:RunInstances"
                   and any(":instance/" in r for r in _resources(s))]
    assert instance["Condition"]["StringEquals"]["ec2:InstanceType"] == ["c5.xlarge", "m5.large"]
    assert instance["Condition"]["StringEquals"]["aws:RequestTag/deployment"] == "lab-a"
    assert instance["Condition"]["Null"] == {f"aws:RequestTag/{RUN_TAG}": "false"}
    launched_from = {r for s in policy["Statement"] if s["Action"] == "ec2:RunInstances" for r in _resources(s)}
    assert {"arn:aws:ec2:eu-west-1::image/ami-0123456789abcdef0",
            "arn:aws:ec2:eu-west-1:*:security-group/sg-0123456789abcdef0",
            "arn:aws:ec2:eu-west-1:*:subnet/subnet-0123456789abcdef0",
            "arn:aws:ec2:eu-west-1:*:key-pair/broker"} <= launched_from
    for statement in policy["Statement"]:
        for resource in _resources(statement):
            assert resource == "*" or resource.startswith(("arn:aws:ec2:eu-west-1:", "arn:aws:iam::")), resource
    (reads,) = _statements_for_in(policy, "ec2:DescribeInstances")
    assert reads["Condition"] == {"StringEquals": {"aws:RequestedRegion": "eu-west-1"}}


def test_termination_needs_the_deployment_tags_and_a_run_tag() -> None:
    for action in ("ec2:TerminateInstances", "ec2:GetConsoleOutput"):
        (statement,) = _statements_for_in(_generated(), action)
        assert statement["Condition"] == {
            "StringEquals": {f"aws:ResourceTag/{MANAGED_TAG}": "true", "aws:ResourceTag/deployment": "lab-a"},
            "Null": {f"aws:ResourceTag/{RUN_TAG}": "false"}}
        assert _resources(statement) == ["arn:aws:ec2:eu-west-1:*:instance/*"]


def test_the_tags_the_policy_requires_are_the_tags_a_launch_of_that_inventory_sends() -> None:
    from broker.shells.aws import Ec2Fleet

    inventory = parse_inventory(_INVENTORY.format(profile=""), "inv.yaml")
    fleet = Ec2Fleet(_NoCalls(), inventory.aws, "run-1")
    params = fleet._run_params("m5.large", 1, "tok", None)
    (instance,) = [s for s in iam_policy(inventory)["Statement"] if s["Sid"].startswith("LaunchOnlyTaggedInstances")]
    for spec in params["TagSpecifications"]:
        sent = {t["Key"]: t["Value"] for t in spec["Tags"]}
        for key, value in instance["Condition"]["StringEquals"].items():
            if key.startswith("aws:RequestTag/"):
                assert sent[key.removeprefix("aws:RequestTag/")] == value
        assert RUN_TAG in sent
    assert params["InstanceType"] in instance["Condition"]["StringEquals"]["ec2:InstanceType"]


class _NoCalls:
    def run_instances(self, **_):  # pragma: no cover - only the parameters are built
        raise AssertionError


def _statements_for_in(policy: dict, action: str) -> list[dict]:
    return [s for s in policy["Statement"] if action in _actions(s)]


def _parliament_findings(policy: dict) -> list:
    parliament = pytest.importorskip("parliament") if os.environ.get("CI") != "true" else __import__("parliament")
    return parliament.analyze_policy_string(json.dumps(policy, indent=2), include_community_auditors=True).findings


@pytest.mark.parametrize("which", ["generic", "inventory", "inventory-with-profile", "example"])
def test_parliament_finds_nothing_but_the_pass_role_path_and_its_split_statement_false_positive(which) -> None:
    policy = {"generic": lambda: iam_policy(None), "inventory": lambda: _generated(False),
              "inventory-with-profile": lambda: _generated(True),
              "example": lambda: iam_policy(load_inventory(ROOT / "deploy" / "inventory.example.yaml"))}[which]()
    passes_role = "iam:PassRole" in _granted(policy)
    findings = _parliament_findings(policy)
    run_instances_resources = [r for s in _statements_for_in(policy, "ec2:RunInstances") for r in _resources(s)]
    seen = set()
    for finding in findings:
        if finding.issue == "RESOURCE_MISMATCH":
            for wanted in finding.detail:
                assert wanted["action"] == "ec2:RunInstances", finding.detail
                kind = wanted["required_format"].rsplit(":", 1)[1].split("/")[0]
                # Together, the RunInstances statements name every resource type it asks for.
                assert any(f":{kind}/" in r for r in run_instances_resources), (kind, run_instances_resources)
        elif finding.issue == "PRIVILEGE_ESCALATION":
            assert finding.location["type"] == "CreateEC2WithExistingIP" and passes_role, finding.location
        elif finding.issue == "PERMISSIONS_MANAGEMENT_ACTIONS":
            assert finding.location["actions"] == ["iam:passrole"] and passes_role, finding.location
        else:
            raise AssertionError(f"unexpected parliament finding {finding.issue}: {finding.detail} {finding.location}")
        seen.add(finding.issue)
    # The PassRole path is reported whenever (and only when) PassRole is granted: the linter did run.
    assert ("PRIVILEGE_ESCALATION" in seen) == passes_role
    assert "RESOURCE_MISMATCH" in seen


def test_broker_iam_policy_prints_the_inventorys_policy(tmp_path, capsys) -> None:
    from broker.cli import main

    inventory = tmp_path / "inv.yaml"
    inventory.write_text(_INVENTORY.format(profile="instance_profile: broker-agent-lab"))
    assert main(["iam-policy", str(inventory)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == iam_policy(load_inventory(inventory))
    assert "iam:PassRole on role/broker-agent-*" in err and "privilege-escalation" in err
    untagged = tmp_path / "untagged.yaml"
    untagged.write_text(_INVENTORY.format(profile="").replace("  tags: {deployment: lab-a}\n", ""))
    assert main(["iam-policy", str(untagged)]) == 0
    assert "has no aws.tags, so termination is limited to every instance tagged" in capsys.readouterr().err
    private = tmp_path / "private.yaml"
    private.write_text("private:\n  - {name: here, local: true, slots: 1}\n")
    assert main(["iam-policy", str(private)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "has no EC2 types" in err
