"""`broker catalog`: the types: block of an inventory from DescribeInstanceTypes and the AWS Price
List, checked with botocore's Stubber on responses shaped as the APIs return them (two pages of
types; Price List products as JSON strings with their OnDemand terms), and its dry run on
moto's instance-type data."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

import broker.cli.catalog as catalog
from broker.cli import main
from broker.config.inventory import parse_inventory

OFFLINE = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _type(name: str, vcpus: int, mib: int) -> dict:
    """One DescribeInstanceTypes item, with the fields EC2 returns around the ones we read."""
    return {
        "InstanceType": name, "CurrentGeneration": True, "FreeTierEligible": False,
        "SupportedUsageClasses": ["on-demand", "spot"], "SupportedRootDeviceTypes": ["ebs"],
        "SupportedVirtualizationTypes": ["hvm"], "BareMetal": False, "Hypervisor": "nitro",
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 3.4},
        "VCpuInfo": {"DefaultVCpus": vcpus, "DefaultCores": max(1, vcpus // 2), "DefaultThreadsPerCore": 2,
                     "ValidCores": [1], "ValidThreadsPerCore": [1, 2]},
        "MemoryInfo": {"SizeInMiB": mib}, "InstanceStorageSupported": False,
        "EbsInfo": {"EbsOptimizedSupport": "default", "EncryptionSupport": "supported", "NvmeSupport": "required"},
        "NetworkInfo": {"NetworkPerformance": "Up to 10 Gigabit", "MaximumNetworkInterfaces": 3,
                        "Ipv4AddressesPerInterface": 10, "Ipv6AddressesPerInterface": 10, "Ipv6Supported": True,
                        "EnaSupport": "required"},
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        "HibernationSupported": True, "BurstablePerformanceSupported": False, "DedicatedHostsSupported": True,
        "AutoRecoverySupported": True, "SupportedBootModes": ["legacy-bios", "uefi"],
    }


def _product(name: str, region: str, usd: str, sku: str) -> str:
    """One Price List product as GetProducts returns it: a JSON string."""
    return json.dumps({
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {"instanceType": name, "regionCode": region, "location": "US East (N. Virginia)",
                           "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                           "capacitystatus": "Used", "marketoption": "OnDemand", "licenseModel": "No License required",
                           "vcpu": "2", "memory": "4 GiB", "servicecode": "AmazonEC2",
                           "usagetype": f"BoxUsage:{name}", "operation": "RunInstances"},
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": f"${usd} per On Demand Linux {name} Instance Hour",
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z",
    })


@pytest.fixture
def stubbed(monkeypatch):
    ec2 = boto3.client("ec2", region_name="us-east-1", **OFFLINE)
    pricing = boto3.client("pricing", region_name="us-east-1", **OFFLINE)
    ec2_stub, pricing_stub = Stubber(ec2), Stubber(pricing)
    filters = [{"Name": "instance-type", "Values": ["c5.*", "t3.nano"]}]
    ec2_stub.add_response("describe_instance_types",
                          {"InstanceTypes": [_type("c5.xlarge", 4, 8192), _type("c5.large", 2, 4096)],
                           "NextToken": "page-2"}, {"Filters": filters})
    ec2_stub.add_response("describe_instance_types",
                          {"InstanceTypes": [_type("t3.nano", 2, 512), _type("c5.2xlarge", 8, 16384)]},
                          {"Filters": filters, "NextToken": "page-2"})
    for name, usd in (("c5.large", "0.0850000000"), ("c5.xlarge", "0.1700000000"), ("c5.2xlarge", "0.3400000000"),
                      ("t3.nano", "0.0052000000")):
        pricing_stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [_product(name, "us-east-1", usd, f"SKU{name.upper()}")]},
            {"ServiceCode": "AmazonEC2", "Filters": catalog.price_filters("us-east-1", name),
             "FormatVersion": "aws_v1"})
    clients = {"ec2": ec2, "pricing": pricing}
    monkeypatch.setattr(boto3, "client", lambda service, **kw: clients[service])
    with ec2_stub, pricing_stub:
        yield ec2_stub, pricing_stub
    ec2_stub.assert_no_pending_responses()
    pricing_stub.assert_no_pending_responses()


def test_the_block_has_slots_from_vcpus_and_memory_and_prices_from_the_price_list(stubbed, capsys):
    assert main(["catalog", "--region", "us-east-1", "--types", "c5.*,t3.nano"]) == 0
    text = capsys.readouterr().out
    inventory = parse_inventory(text, "catalog.yaml")
    types = {t.name: t for t in inventory.types}
    assert list(types) == ["c5.large", "c5.xlarge", "c5.2xlarge", "t3.nano"]  # both pages, by family and size
    assert [types[n].slots for n in types] == [2, 4, 8, 1]  # t3.nano: 0.5 GiB holds one 2 GiB task at most
    assert [types[n].price_per_hour for n in types] == [0.085, 0.17, 0.34, 0.0052]
    assert all(t.speed == 1.0 and t.limit == 10 and t.boot_s == 90.0 for t in types.values())
    assert inventory.aws.region == "us-east-1"
    assert "# 2 vCPU, 0.5 GiB" in text


def test_a_type_the_price_list_does_not_price_is_refused_by_name(monkeypatch, capsys):
    ec2 = boto3.client("ec2", region_name="eu-west-1", **OFFLINE)
    pricing = boto3.client("pricing", region_name="us-east-1", **OFFLINE)
    with Stubber(ec2) as ec2_stub, Stubber(pricing) as pricing_stub:
        ec2_stub.add_response("describe_instance_types", {"InstanceTypes": [_type("x9.huge", 4, 8192)]},
                              {"Filters": [{"Name": "instance-type", "Values": ["x9.huge"]}]})
        pricing_stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []},
                                  {"ServiceCode": "AmazonEC2", "Filters": catalog.price_filters("eu-west-1", "x9.huge"),
                                   "FormatVersion": "aws_v1"})
        clients = {"ec2": ec2, "pricing": pricing}
        monkeypatch.setattr(boto3, "client", lambda service, **kw: clients[service])
        assert main(["catalog", "--region", "eu-west-1", "--types", "x9.huge"]) == 2
    assert "no on-demand Linux price in eu-west-1 for x9.huge" in capsys.readouterr().err


def test_given_prices_replace_the_price_list_and_options_shape_the_rows(monkeypatch, capsys):
    ec2 = boto3.client("ec2", region_name="us-east-1", **OFFLINE)
    with Stubber(ec2) as stub:
        stub.add_response("describe_instance_types", {"InstanceTypes": [_type("m5.2xlarge", 8, 32768)]},
                          {"Filters": [{"Name": "instance-type", "Values": ["m5.2xlarge"]}]})
        monkeypatch.setattr(boto3, "client", lambda service, **kw: {"ec2": ec2}[service])  # no pricing call
        assert main(["catalog", "--region", "us-east-1", "--types", "m5.2xlarge", "--price", "m5.2xlarge=0.384",
                     "--mem-per-slot", "8", "--speed", "1.2", "--limit", "3", "--boot", "2m"]) == 0
    (t,) = parse_inventory(capsys.readouterr().out).types
    assert (t.slots, t.speed, t.price_per_hour, t.limit, t.boot_s) == (4, 1.2, 0.384, 3, 120.0)


def test_a_dry_run_reads_motos_types_and_says_prices_must_be_given(capsys):
    assert main(["catalog", "--region", "us-east-1", "--types", "c5.large,c5.xlarge", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "a dry run has no Price List: prices must be given with --price TYPE=USD" in err
    assert "c5.large, c5.xlarge" in err
    assert main(["catalog", "--region", "us-east-1", "--types", "c5.large,c5.xlarge", "--dry-run",
                 "--price", "c5.large=0.085", "--price", "c5.xlarge=0.17"]) == 0
    types = {t.name: t.slots for t in parse_inventory(capsys.readouterr().out).types}
    assert types == {"c5.large": 2, "c5.xlarge": 4}


@pytest.mark.parametrize("argv, message", [
    (["--price", "c5.large"], "--price: expected TYPE=USD"),
    (["--mem-per-slot", "0"], "--mem-per-slot: must be a positive"),
    (["--boot", "soon"], "--boot: expected a duration"),
    (["--types", "zz.*", "--dry-run"], "no instance type in us-east-1 matches"),
])
def test_bad_options_exit_2(argv, message, capsys):
    assert main(["catalog", "--region", "us-east-1", "--dry-run", *argv]) == 2
    assert message in capsys.readouterr().err
