"""``broker validate INVENTORY [BAG] [--live]``: check the input files, start nothing.

Every problem in both files is printed at once (exit status 2); a clean pair gets a short
summary on standard output (exit status 0). ``--live`` also asks AWS, when the inventory has
EC2 types, whether the credentials work (STS GetCallerIdentity), whether each type is offered
in the region and whether the AMI exists (read-only calls; nothing is launched).
"""

from __future__ import annotations

import argparse

from broker.config.bag import load_bag
from broker.config.durations import format_duration
from broker.config.errors import ConfigError, Problem
from broker.config.inventory import load_inventory
from broker.core.model import Bag, Inventory


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check an inventory (and a bag): every problem at once, nothing run",
        description="Check an inventory file and, optionally, a bag file. Every problem is "
        "listed with its file, line and field; nothing is started.",
    )
    parser.add_argument("inventory", metavar="INVENTORY", help="inventory YAML (private nodes, EC2 types)")
    parser.add_argument("bag", metavar="BAG", nargs="?", help="bag YAML (the tasks to run)")
    parser.add_argument(
        "--live",
        action="store_true",
        help="also require what a real run needs: AWS region, AMI, key pair and security "
        "group, and SSH key files that exist and are private to their owner; with EC2 types, "
        "ask AWS (read-only) whether the credentials work and the types and AMI exist",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    inventory: Inventory | None = None
    bag: Bag | None = None
    try:
        inventory = load_inventory(args.inventory, live=args.live)
    except ConfigError as exc:
        problems += exc.problems
    if args.bag is not None:
        try:
            bag = load_bag(args.bag)
        except ConfigError as exc:
            problems += exc.problems
    aws_note = None
    if args.live and inventory is not None and inventory.types and not problems:
        aws_problems, aws_note = check_aws(inventory)
        problems += aws_problems
    if problems:
        raise ConfigError(problems)
    print(describe_inventory(inventory))
    if bag is not None:
        print(describe_bag(bag))
    if aws_note:
        print(aws_note)
    checked = "live fields checked" if args.live else "add --live to check what a real run needs"
    print(f"valid ({checked}); nothing was started")
    return 0


def check_aws(inventory: Inventory) -> tuple[list[Problem], str | None]:
    """Problems AWS reports for the inventory's account, types and AMI, and a note if none.

    Read-only calls (sts:GetCallerIdentity, ec2:DescribeInstanceTypes, ec2:DescribeImages),
    each allowed by deploy/iam-policy.json. Credentials come from boto3's usual chain.
    """
    import boto3

    from broker.shells.aws import Ec2Fleet

    fleet = Ec2Fleet(boto3.Session(region_name=inventory.aws.region), inventory.aws, "validate")
    credentials = fleet.check_credentials()
    if not credentials.ok:
        return [Problem(inventory.source, "aws", credentials.message)], None
    problems = fleet.check_catalogue([t.name for t in inventory.types], inventory.aws.ami, source=inventory.source)
    return problems, None if problems else f"{inventory.source}: {credentials.message}; types and AMI found"


def describe_inventory(inventory: Inventory) -> str:
    """``inventory.yaml: 1 private node (2 slots), 4 EC2 types (up to 40 instances), hourly billing``."""
    parts = []
    if inventory.private:
        slots = sum(node.slots for node in inventory.private)
        parts.append(f"{_count(len(inventory.private), 'private node')} ({_count(slots, 'slot')})")
    if inventory.types:
        instances = sum(t.limit for t in inventory.types)
        parts.append(f"{_count(len(inventory.types), 'EC2 type')} (up to {_count(instances, 'instance')})")
        billings = sorted({t.billing.describe() for t in inventory.types})
        parts.append(f"{billings[0]} billing" if len(billings) == 1 else f"billing: {'; '.join(billings)}")
    return f"{inventory.source}: {', '.join(parts)}"


def describe_bag(bag: Bag) -> str:
    """``examples/sweep.yaml: bag 'sweep', 40 tasks, timeout 30s, 2 retries``."""
    return (
        f"{bag.source}: bag '{bag.name}', {_count(len(bag), 'task')}, "
        f"timeout {format_duration(bag.timeout_s)}, {_count(bag.retries, 'retry', 'retries')}"
    )


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"
