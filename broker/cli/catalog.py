"""``broker catalog --region R [--types PATTERN]``: the ``types:`` block of an inventory, from AWS.

    broker catalog --region us-east-1 --types 'c5.*,m5.large' [--mem-per-slot 2] [--speed 1]
                   [--limit 10] [--boot 90s] [--price TYPE=USD ...] [--dry-run] [--out FILE]

- **slots** from ``DescribeInstanceTypes``: one slot per vCPU, fewer when memory is short:
  ``slots = max(1, min(vCPUs, floor(memory GiB / --mem-per-slot)))`` (default 2 GiB a task);
- **price** per hour from the AWS Price List API (``pricing:GetProducts`` at its us-east-1
  endpoint): on-demand, Linux, shared tenancy, no pre-installed software, capacity status
  ``Used``, in the region (``regionCode``); ``--price TYPE=USD`` overrides it;
- **speed** 1 per slot (a vCPU is a speed-1 slot) unless ``--speed`` says otherwise: measure
  your tasks on the types and scale it;
- ``limit`` and ``boot`` are the same for every type (``--limit``, ``--boot``): edit them.

The output is an inventory of types alone (``aws: {region, types}``), valid for ``broker plan``
and ``broker simulate`` as it is; paste its ``types:`` into your inventory's ``aws`` section.
``--dry-run`` asks no AWS endpoint: the instance types come from moto's copy of EC2's data,
and since there is no Price List, every price must be given with ``--price`` (exit 2 names the
types without one). A type the Price List does not price in the region is refused the same way.

Credentials: the calls are ``ec2:DescribeInstanceTypes`` and ``pricing:GetProducts``, made with
your own credentials (``deploy/iam-policy.json`` is the broker service's policy: it needs
neither the catalogue nor the Price List).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from broker.cli import UsageError
from broker.core.units import parse_duration

PRICING_REGION = "us-east-1"  # the Price List API's endpoint
DEFAULT_MEM_PER_SLOT_GIB = 2.0


@dataclass(frozen=True)
class TypeInfo:
    name: str
    vcpus: int
    memory_gib: float


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "catalog",
        help="write an inventory's types: block from EC2 (slots from vCPUs and memory) and the Price List",
        description="Write the types: block of an inventory for a region: slots from DescribeInstanceTypes, "
        "on-demand Linux prices from the AWS Price List API.",
    )
    p.add_argument("--region", required=True, help="the EC2 region, e.g. us-east-1")
    p.add_argument("--types", metavar="PATTERN", default="*",
                   help="instance types, shell-style and comma-separated, e.g. 'c5.*,m5.large' (default: all)")
    p.add_argument("--mem-per-slot", type=float, default=DEFAULT_MEM_PER_SLOT_GIB, metavar="GIB",
                   help=f"memory one task needs, in GiB: slots = min(vCPUs, memory / this) (default "
                   f"{DEFAULT_MEM_PER_SLOT_GIB:g})")
    p.add_argument("--speed", type=float, default=1.0, help="speed of one slot (default 1: one vCPU)")
    p.add_argument("--limit", type=int, default=10, help="the most instances of each type to rent (default 10)")
    p.add_argument("--boot", default="90s", metavar="DUR", help="boot delay of every type (default 90s)")
    p.add_argument("--price", action="append", default=[], metavar="TYPE=USD",
                   help="USD per hour for TYPE, instead of the Price List (repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="no AWS call: moto's instance-type data; every price from --price")
    p.add_argument("--out", metavar="FILE", help="write the block to FILE instead of standard output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    patterns = [p.strip() for p in args.types.split(",") if p.strip()] or ["*"]
    given = _given_prices(args.price)
    if not args.mem_per_slot > 0 or not math.isfinite(args.mem_per_slot):
        raise UsageError(f"--mem-per-slot: must be a positive number of GiB, got {args.mem_per_slot:g}")
    if not args.speed > 0 or not math.isfinite(args.speed):
        raise UsageError(f"--speed: must be positive, got {args.speed:g}")
    if args.limit < 0:
        raise UsageError(f"--limit: must be 0 or more, got {args.limit}")
    try:
        boot_s = parse_duration(args.boot)
    except ValueError as exc:
        raise UsageError(f"--boot: {exc}") from None
    if args.dry_run:
        types = _moto_types(args.region, patterns)
    else:
        import boto3

        types = describe_types(boto3.client("ec2", region_name=args.region), patterns)
    if not types:
        raise UsageError(f"no instance type in {args.region} matches {args.types!r}")
    missing = [t.name for t in types if t.name not in given]
    prices = dict(given)
    if args.dry_run and missing:
        raise UsageError(f"a dry run has no Price List: prices must be given with --price TYPE=USD for "
                         f"{len(missing)} type{'s' if len(missing) != 1 else ''}: {', '.join(missing)}")
    if missing:
        import boto3

        prices.update(on_demand_prices(boto3.client("pricing", region_name=PRICING_REGION), args.region, missing))
        unpriced = [name for name in missing if name not in prices]
        if unpriced:
            raise UsageError(f"the AWS Price List has no on-demand Linux price in {args.region} for "
                             f"{', '.join(unpriced)}: give it with --price TYPE=USD, or leave the type out")
    source = ("moto's instance-type data (dry run)" if args.dry_run else "DescribeInstanceTypes") + \
        (" and --price" if args.dry_run else " and the AWS Price List (on-demand Linux, shared tenancy)")
    text = render(args.region, types, prices, args.mem_per_slot, args.speed, args.limit, boot_s, source)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {len(types)} types to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _given_prices(items: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        name, _, usd = item.partition("=")
        try:
            value = float(usd.lstrip("$"))
        except ValueError:
            value = math.nan
        if not name or not math.isfinite(value) or value < 0:
            raise UsageError(f"--price: expected TYPE=USD per hour, e.g. c5.large=0.085, got {item!r}")
        prices[name.strip()] = value
    return prices


def describe_types(ec2, patterns: list[str]) -> list[TypeInfo]:
    """The region's instance types matching ``patterns`` (``DescribeInstanceTypes``, all pages)."""
    kwargs: dict[str, Any] = {}
    if patterns != ["*"]:
        kwargs["Filters"] = [{"Name": "instance-type", "Values": patterns}]
    found: dict[str, TypeInfo] = {}
    while True:
        page = ec2.describe_instance_types(**kwargs)
        for item in page.get("InstanceTypes", []):
            name = item["InstanceType"]
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                found[name] = TypeInfo(name, int(item["VCpuInfo"]["DefaultVCpus"]),
                                       float(item["MemoryInfo"]["SizeInMiB"]) / 1024.0)
        token = page.get("NextToken")
        if not token:
            break
        kwargs["NextToken"] = token
    return sorted(found.values(), key=_type_order)


def _type_order(t: TypeInfo) -> tuple:
    family, _, size = t.name.partition(".")
    return (family, t.vcpus, t.memory_gib, size)


def _moto_types(region: str, patterns: list[str]) -> list[TypeInfo]:
    """moto's copy of EC2's instance-type data, in-process: no endpoint is asked."""
    import boto3
    from moto import mock_aws

    from broker.shells.moto_world import fake_aws_environment

    with fake_aws_environment(region), mock_aws():
        return describe_types(boto3.client("ec2", region_name=region), patterns)


def price_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """The Price List filters of one on-demand Linux instance-hour in ``region``."""
    terms = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
             "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "marketoption": "OnDemand"}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in terms.items()]


def on_demand_prices(pricing, region: str, names: Iterable[str]) -> dict[str, float]:
    """USD per hour of each type in ``names`` that the Price List prices (``GetProducts``)."""
    prices = {}
    for name in names:
        kwargs: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": price_filters(region, name),
                                  "FormatVersion": "aws_v1"}
        hourly: list[float] = []
        while True:
            page = pricing.get_products(**kwargs)
            for item in page.get("PriceList", []):
                hourly += hourly_prices(json.loads(item) if isinstance(item, str) else item)
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        positive = [p for p in hourly if p > 0]
        if positive:
            prices[name] = min(positive)  # one product is expected; several: the on-demand rate is the least
    return prices


def hourly_prices(product: dict[str, Any]) -> list[float]:
    """The on-demand USD-per-hour rates of one Price List product."""
    out = []
    for offer in (product.get("terms", {}).get("OnDemand") or {}).values():
        for dimension in (offer.get("priceDimensions") or {}).values():
            if dimension.get("unit") in ("Hrs", "Hours") and "USD" in dimension.get("pricePerUnit", {}):
                out.append(float(dimension["pricePerUnit"]["USD"]))
    return out


def slots_of(t: TypeInfo, mem_per_slot_gib: float) -> int:
    return max(1, min(t.vcpus, math.floor(t.memory_gib / mem_per_slot_gib + 1e-9)))


def render(region: str, types: list[TypeInfo], prices: dict[str, float], mem_per_slot_gib: float, speed: float,
           limit: int, boot_s: float, source: str) -> str:
    """An inventory of types alone, with a comment per type."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = [
        f"# EC2 types in {region}, {stamp}: slots from {source.split(' and ')[0]}, prices from "
        f"{source.split(' and ', 1)[1]}.",
        f"# slots = min(vCPUs, memory / {mem_per_slot_gib:g} GiB); speed {speed:g} per slot: measure your tasks on",
        "# each type and scale it. limit and boot are placeholders: edit them. Paste `types:` into your",
        "# inventory's aws: section (written by `broker catalog`).",
        "aws:",
        f"  region: {region}",
        "  types:",
    ]
    for t in types:
        price = prices[t.name]
        lines.append(f"    - {{name: {t.name}, slots: {slots_of(t, mem_per_slot_gib)}, speed: {speed:g}, "
                     f"price: {price:.6g}, limit: {limit}, boot: {boot_s:g}s}}"
                     f"  # {t.vcpus} vCPU, {t.memory_gib:g} GiB")
    return "\n".join(lines) + "\n"
