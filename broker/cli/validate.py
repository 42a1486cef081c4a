"""``broker validate INVENTORY [BAG] [--live]``: check the input files, start nothing.

Every problem in both files is printed at once (exit status 2); a clean pair gets a short
summary on standard output (exit status 0). Warnings (a sweep value with shell
metacharacters, a vCPU quota that could not be read) go to standard error and do not change
the exit status. ``--live`` also runs the preflight a live ``broker run`` runs before it
spends anything (``broker/shells/aws/preflight.py``: credentials, AMI, key pair, security
group, subnet, types offered in the region, on-demand vCPU quota; read-only calls, nothing
is launched), when the inventory has EC2 types; without them AWS is not needed and not asked.
"""

from __future__ import annotations

import argparse
import sys

from broker.config.bag import load_bag
from broker.core.units import format_duration
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
        "run the live run's preflight (read-only AWS calls): credentials, AMI, key pair, security "
        "group, subnet, types offered in the region, on-demand vCPU quota",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    warnings: list[Problem] = []
    inventory: Inventory | None = None
    bag: Bag | None = None
    try:
        inventory = load_inventory(args.inventory, live=args.live)
    except ConfigError as exc:
        problems += exc.problems
        if args.live:  # what AWS says is listed too, when the file is valid but for live fields
            inventory = _parsed_or_none(args.inventory)
    if args.bag is not None:
        try:
            bag = load_bag(args.bag, warnings=warnings)
        except ConfigError as exc:
            problems += exc.problems
    checked: list[str] = []
    asks_aws = inventory is not None and (not inventory.types or (inventory.aws.region and inventory.aws.ami))
    if args.live and asks_aws:  # (without a region or an AMI, the file's problems say so already)
        report = live_preflight(inventory)
        problems += report.problems
        checked = report.checked
        print_warnings(report.warnings)
    print_warnings(w.render() for w in warnings)
    if problems:
        raise ConfigError(problems)
    print(describe_inventory(inventory))
    if bag is not None:
        print(describe_bag(bag))
    if checked:
        print(f"{inventory.source}: {'; '.join(checked)}")
    done = "live fields checked" if args.live else "add --live to check what a real run needs"
    print(f"valid ({done}); nothing was started")
    return 0


def _parsed_or_none(path: str) -> Inventory | None:
    try:
        return load_inventory(path)
    except ConfigError:
        return None


def live_preflight(inventory: Inventory):
    """The preflight of a live run (``broker.shells.aws.preflight``); an inventory without EC2
    types needs no AWS at all and gets no call."""
    from broker.shells.aws.preflight import preflight

    return preflight(inventory)


def print_warnings(warnings) -> None:
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


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
