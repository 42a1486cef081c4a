"""``broker iam-policy INVENTORY``: print the least-privilege IAM policy for that inventory.

The policy (``broker/shells/aws/iam.py`` says what each statement allows and why) limits
launches to the inventory's region, types, AMI, security group, subnet and key pair, and
termination to the instances carrying the broker's tags and the inventory's ``aws.tags``.
It goes to standard output as JSON, ready for ``aws iam put-role-policy --policy-document
file://...``; notes on what it cannot limit go to standard error. An inventory without EC2
types needs no AWS permission at all (exit status 2, nothing printed on standard output).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "iam-policy",
        help="print the least-privilege IAM policy for an inventory (JSON)",
        description="Print the IAM policy a live run with this inventory needs, and nothing more: "
        "launches limited to its region, types, AMI, group, subnet and key pair, termination to "
        "instances with the broker's tags and the inventory's aws.tags.",
    )
    p.add_argument("inventory", metavar="INVENTORY", help="inventory YAML")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from broker.cli import UsageError
    from broker.config.inventory import load_inventory
    from broker.shells.aws.iam import AGENT_ROLE_PATTERN, iam_policy

    inventory = load_inventory(args.inventory)
    if not inventory.types:
        raise UsageError(f"{args.inventory} has no EC2 types: a run with it makes no AWS call and needs "
                         "no IAM policy")
    print(json.dumps(iam_policy(inventory), indent=2))
    aws = inventory.aws
    for field, value in (("region", aws.region), ("ami", aws.ami), ("security_group", aws.security_group),
                         ("key_name", aws.key_name)):
        if not value:
            print(f"note: no aws.{field} in {args.inventory}: the policy allows any", file=sys.stderr)
    if not aws.tags:
        print(f"note: {args.inventory} has no aws.tags, so termination is limited to every instance tagged "
              "broker:managed=true in the region, not to this deployment's; add a tag of your own "
              "(e.g. aws.tags: {deployment: NAME}) to keep two brokers of one account apart", file=sys.stderr)
    if aws.instance_profile:
        print(f"note: aws.instance_profile needs iam:PassRole on role/{AGENT_ROLE_PATTERN}: whoever holds this "
              "policy can start an instance with such a role and act as it (a privilege-escalation path); "
              "keep those roles minimal", file=sys.stderr)
    return 0
