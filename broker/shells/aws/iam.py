"""The least-privilege IAM policy for the broker, generated from an inventory.

``broker iam-policy INVENTORY`` prints :func:`iam_policy` of the inventory;
``deploy/iam-policy.json`` is the same policy for no inventory (every region, type, image,
group and subnet: a starting point). It grants exactly the calls the broker makes
(``broker/shells/aws/fleet.py``) and its preflight makes (``preflight.py``), plus the two a
launch implies (``ec2:CreateTags`` for the tags given at launch, ``iam:PassRole`` for an
instance profile); ``tests/test_iam_policy.py`` checks both against the source.

What each part allows, and why it is the narrowest that works:

- ``ec2:RunInstances`` creates instances only of the inventory's types (``ec2:InstanceType``),
  in its region (the resource ARNs name it), tagged ``broker:managed=true``, with a
  ``broker:run`` tag, and with every tag of the inventory's ``aws.tags``; volumes only with the
  same tags; from the inventory's AMI, security group, subnet (any subnet when none is given)
  and key pair only. Conditions that only an instance carries (the type) stay on the
  instance's statement: on the other resources of the same call the key is absent and a
  condition on it would deny the launch.
- ``ec2:TerminateInstances`` and ``ec2:GetConsoleOutput`` act only on instances of the region
  that carry ``broker:managed=true``, a ``broker:run`` tag and the inventory's ``aws.tags``.
  Which tag limits termination, and why not the run's own: a run's id exists only once the
  run starts, while a policy is written before, and a policy per run would need the broker to
  hold ``iam:PutRolePolicy``, a far worse privilege. So IAM limits termination to the
  **deployment**, the instances launched under this inventory's tags (give ``aws.tags`` a
  value of your own, e.g. ``deployment: lab-a``, to keep two brokers of one account apart);
  the broker itself terminates only instances carrying its run's ``broker:run`` tag
  (``Ec2Fleet.terminate`` refuses any other without a call).
- Reads (``Describe*``) cannot be limited by resource in EC2; they are limited to the region
  (``aws:RequestedRegion``). ``sts:GetCallerIdentity`` and the two Service Quotas reads take no
  resource.
- ``iam:PassRole`` is granted only when the inventory names an ``instance_profile`` (always in
  the generic policy), for roles named ``broker-agent-*`` and only to EC2. Together with
  ``ec2:RunInstances`` it is a privilege-escalation path (parliament reports it as
  ``CreateEC2WithExistingIP``): whoever holds this policy can start an instance with such a
  role and act with the role's permissions. Keep ``broker-agent-*`` roles minimal, or leave
  ``instance_profile`` out (the broker does not need one).
"""

from __future__ import annotations

from typing import Any

from broker.core.model import Inventory

from .fleet import MANAGED_TAG, RUN_TAG

AGENT_ROLE_PATTERN = "broker-agent-*"
DESCRIBE_ACTIONS = (
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    "ec2:DescribeKeyPairs",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
)
QUOTA_ACTIONS = ("servicequotas:GetAWSDefaultServiceQuota", "servicequotas:GetServiceQuota")


def partition_of(region: str | None) -> str:
    """The ARN partition of a region (``aws``, ``aws-cn``, ``aws-us-gov``); ``aws`` if unknown."""
    if region and region.startswith("cn-"):
        return "aws-cn"
    if region and region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def iam_policy(inventory: Inventory | None = None) -> dict[str, Any]:
    """The policy document for ``inventory`` (``None``: the generic one of ``deploy/``)."""
    aws = inventory.aws if inventory is not None else None
    region = (aws.region if aws else None) or "*"
    arn = f"arn:{partition_of(aws.region if aws else None)}:ec2:{region}"
    tags = {MANAGED_TAG: "true", **(dict(aws.tags) if aws else {})}
    request_tags = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    resource_tags = {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
    # EC2's own type names: a spot offer's key (c5.xlarge@spot) launches its instance_type
    type_names = sorted({t.instance_type for t in inventory.types}) if inventory is not None else []
    spot = inventory is None or any(t.is_spot for t in inventory.types)
    instance_launch = {"StringEquals": dict(request_tags), "Null": {f"aws:RequestTag/{RUN_TAG}": "false"}}
    if type_names:
        instance_launch["StringEquals"]["ec2:InstanceType"] = type_names
    tagged_instances = {"StringEquals": resource_tags, "Null": {f"aws:ResourceTag/{RUN_TAG}": "false"}}

    def named(kind: str, name: str | None, account: str = ":*") -> str:
        return f"{arn}{account}:{kind}/{name or '*'}"

    statements = [
        _allow("LaunchOnlyTaggedInstancesOfTheInventorysTypes", "ec2:RunInstances", [f"{arn}:*:instance/*"],
               instance_launch),
        _allow("LaunchOnlyTaggedVolumes", "ec2:RunInstances", [f"{arn}:*:volume/*"],
               {"StringEquals": dict(request_tags)}),
        _allow("LaunchFromTheInventorysImageNetworkAndKey", "ec2:RunInstances", [
            named("image", aws.ami if aws else None, account=":"),
            named("security-group", aws.security_group if aws else None),
            named("subnet", aws.subnet if aws else None),
            f"{arn}:*:network-interface/*",
            named("key-pair", aws.key_name if aws else None),
        ]),
        *([_allow("LaunchSpotInstancesThroughRunInstances", "ec2:RunInstances",
                  [f"{arn}:*:spot-instances-request/*"], {"StringEquals": {"ec2:InstanceMarketType": "spot"}})]
          if spot else []),
        _allow("TagOnlyWhileLaunching", "ec2:CreateTags", [f"{arn}:*:instance/*", f"{arn}:*:volume/*"],
               {"StringEquals": {"ec2:CreateAction": "RunInstances", **request_tags}}),
        _allow("TerminateOnlyTheDeploymentsInstances", "ec2:TerminateInstances", [f"{arn}:*:instance/*"],
               tagged_instances),
        _allow("ReadHostKeysFromTheConsoleOfTheDeploymentsInstances", "ec2:GetConsoleOutput",
               [f"{arn}:*:instance/*"], tagged_instances),
        _allow("ReadInstancesTypesImagesAndNetwork", list(DESCRIBE_ACTIONS), ["*"],
               {"StringEquals": {"aws:RequestedRegion": region}} if region != "*" else None),
        _allow("CheckCredentials", "sts:GetCallerIdentity", ["*"]),
        _allow("ReadTheOnDemandVcpuQuotas", list(QUOTA_ACTIONS), ["*"]),
    ]
    if inventory is None or (aws is not None and aws.instance_profile):
        statements.append(_allow(
            "PassTheAgentRoleOnlyToEc2", "iam:PassRole",
            [f"arn:{partition_of(aws.region if aws else None)}:iam::*:role/{AGENT_ROLE_PATTERN}"],
            {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}))
    return {"Version": "2012-10-17", "Statement": statements}


def _allow(sid: str, action: str | list[str], resources: list[str],
           condition: dict[str, Any] | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": action,
                                 "Resource": resources[0] if resources == ["*"] else resources}
    if condition:
        statement["Condition"] = condition
    return statement
