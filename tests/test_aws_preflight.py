"""Preflight: a live run asks AWS whether it can work before it creates or runs anything.

Unit tests drive :func:`preflight` with botocore's Stubber (each call it makes is scripted,
and an unexpected one fails the test) or with moto in this process. The end-to-end tests run
``broker run`` (live) inside a network namespace of their own (``unshare -n``: only a
loopback, no route out): once with no credentials at all, once against a moto server on that
namespace's 127.0.0.1 holding a key pair but not the AMI, the security group or one of the
types. Each must exit 2 naming every problem, with no run directory made and no task run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from broker.config.inventory import parse_inventory
from broker.shells.aws.preflight import STANDARD_QUOTA, AwsClients, preflight, quota_of

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
_OFFLINE = {"region_name": REGION, "aws_access_key_id": "x", "aws_secret_access_key": "x",
            "endpoint_url": "http://127.0.0.1:9"}  # a stub answers; nothing is ever sent


def _inventory(types: str = "    - {name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 3}\n",
               extra: str = "", private: str = ""):
    text = (f"{private}aws:\n  region: {REGION}\n  ami: ami-0123456789abcdef0\n  key_name: broker\n"
            f"  security_group: sg-0123456789abcdef0\n{extra}  types:\n{types}")
    return parse_inventory(text, "inv.yaml")


class _Stubbed:
    """Three stubbed clients; ``expect_*`` script their answers in call order."""

    def __init__(self) -> None:
        self.clients = AwsClients(*(boto3.client(name, **_OFFLINE) for name in ("sts", "ec2", "service-quotas")))
        self.stubs = [Stubber(c) for c in (self.clients.sts, self.clients.ec2, self.clients.quotas)]
        self.sts, self.ec2, self.quotas = self.stubs

    def __enter__(self) -> AwsClients:
        for stub in self.stubs:
            stub.activate()
        return self.clients

    def __exit__(self, *exc) -> None:
        for stub in self.stubs:
            stub.deactivate()
        if exc[0] is None:
            for stub in self.stubs:
                stub.assert_no_pending_responses()

    def identity(self) -> None:
        self.sts.add_response("get_caller_identity", {"Arn": "arn:aws:iam::123456789012:user/broker",
                                                      "Account": "123456789012", "UserId": "AIDEXAMPLE"})

    def catalogue(self, offered: dict[str, int], arch: str = "x86_64") -> None:
        self.ec2.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": name, "LocationType": "region", "Location": REGION} for name in offered]})
        if offered:
            self.ec2.add_response("describe_instance_types", {"InstanceTypes": [
                {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus},
                 "ProcessorInfo": {"SupportedArchitectures": [arch]}} for name, vcpus in offered.items()]})

    def image(self, arch: str = "x86_64", state: str = "available") -> None:
        self.ec2.add_response("describe_images", {"Images": [
            {"ImageId": "ami-0123456789abcdef0", "State": state, "Architecture": arch}]})

    def network(self, group_vpc: str = "vpc-1") -> None:
        self.ec2.add_response("describe_key_pairs", {"KeyPairs": [{"KeyName": "broker"}]})
        self.ec2.add_response("describe_security_groups", {"SecurityGroups": [
            {"GroupId": "sg-0123456789abcdef0", "VpcId": group_vpc}]})


def test_quota_codes_follow_the_instance_family() -> None:
    assert quota_of("m5.large")[0] == STANDARD_QUOTA == "L-1216C47A"
    for name in ("t3.micro", "c7gn.xlarge", "r6i.large", "z1d.large", "i4i.large", "d3en.xlarge", "a1.large",
                 "h1.2xlarge"):
        assert quota_of(name)[0] == STANDARD_QUOTA, name
    assert {name: quota_of(name)[0] for name in ("g5.xlarge", "vt1.3xlarge", "p4d.24xlarge", "x2idn.16xlarge",
                                                "f1.2xlarge", "inf2.xlarge", "trn1.2xlarge", "dl1.24xlarge",
                                                "hpc7g.4xlarge", "u-6tb1.56xlarge")} == {
        "g5.xlarge": "L-DB2E81BA", "vt1.3xlarge": "L-DB2E81BA", "p4d.24xlarge": "L-417A185B",
        "x2idn.16xlarge": "L-7295265B", "f1.2xlarge": "L-74FC7D96", "inf2.xlarge": "L-1945791B",
        "trn1.2xlarge": "L-2C3B7624", "dl1.24xlarge": "L-6E869C2A", "hpc7g.4xlarge": "L-F7808C92",
        "u-6tb1.56xlarge": "L-43DA4232"}
    assert quota_of("mac2.metal") is None  # dedicated hosts only: no on-demand vCPU quota


def test_an_inventory_without_ec2_types_makes_no_call() -> None:
    def no_clients(_region):
        raise AssertionError("a private-only inventory must not even create an AWS client")

    inventory = parse_inventory("private:\n  - {name: here, local: true, slots: 1}\n", "inv.yaml")
    report = preflight(inventory, make_clients=no_clients)
    assert report.ok and report.checked == ["no EC2 types in the inventory: AWS is not needed, nothing was asked "
                                            "of it"]


def test_everything_present_and_a_quota_that_covers_the_peak_pass() -> None:
    stubbed = _Stubbed()
    stubbed.identity()
    stubbed.catalogue({"m5.large": 2, "c5.xlarge": 4})
    stubbed.image()
    stubbed.network()
    stubbed.quotas.add_response("get_service_quota", {"Quota": {"QuotaCode": STANDARD_QUOTA, "Value": 18.0}},
                                {"ServiceCode": "ec2", "QuotaCode": STANDARD_QUOTA})
    types = ("    - {name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 3}\n"
             "    - {name: c5.xlarge, slots: 4, speed: 1, price: 0.2, limit: 3}\n")
    with stubbed as clients:
        report = preflight(_inventory(types), clients)
    assert report.problems == [] and report.warnings == []
    assert "vCPU quota L-1216C47A 18 covers the peak of 18" in report.checked  # 3 x 2 + 3 x 4


def test_a_quota_below_the_peak_is_a_problem_naming_both_figures() -> None:
    stubbed = _Stubbed()
    stubbed.identity()
    stubbed.catalogue({"m5.large": 2})
    stubbed.image()
    stubbed.network()
    stubbed.quotas.add_response("get_service_quota", {"Quota": {"Value": 5.0}})
    with stubbed as clients:
        report = preflight(_inventory(), clients)
    (problem,) = report.problems
    assert problem.field == "aws.types"
    assert "allow 6 vCPUs" in problem.message and "quota in us-east-1 is 5 vCPUs" in problem.message
    assert STANDARD_QUOTA in problem.message


def test_a_denied_quota_call_is_a_warning_and_an_unset_quota_falls_back_to_the_default() -> None:
    stubbed = _Stubbed()
    stubbed.identity()
    stubbed.catalogue({"m5.large": 2, "g5.xlarge": 4})
    stubbed.image()
    stubbed.network()
    # Asked in code order: the standard quota (denied), then G and VT (no applied value: its default).
    stubbed.quotas.add_client_error("get_service_quota", "AccessDeniedException", "not allowed", 403)
    stubbed.quotas.add_client_error("get_service_quota", "NoSuchResourceException", "no applied value")
    stubbed.quotas.add_response("get_aws_default_service_quota", {"Quota": {"Value": 4.0}})  # G: 2 x 4 > 4
    types = ("    - {name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 3}\n"
             "    - {name: g5.xlarge, slots: 4, speed: 1, price: 1.0, limit: 2}\n")
    with stubbed as clients:
        report = preflight(_inventory(types), clients)
    assert [p.message.split(",")[0] for p in report.problems] == [
        "the types' limits allow 8 vCPUs of on-demand instances counted by the quota 'Running On-Demand G and VT "
        "instances' (L-DB2E81BA)"]
    (warning,) = report.warnings
    assert "L-1216C47A" in warning and "denied by the IAM policy" in warning


def test_rejected_credentials_stop_the_checks_with_one_problem() -> None:
    stubbed = _Stubbed()
    stubbed.sts.add_client_error("get_caller_identity", "InvalidClientTokenId", "The security token is invalid.",
                                 403)
    with stubbed as clients:  # no EC2 or quota answer is scripted: any such call fails the test
        report = preflight(_inventory(), clients)
    (problem,) = report.problems
    assert problem.field == "aws" and "rejected the credentials (InvalidClientTokenId)" in problem.message
    assert "skipped" in problem.message


def test_every_problem_is_listed_at_once() -> None:
    """An unoffered type, an AMI of another architecture that is not available, a missing key
    pair, a missing security group and a subnet in another VPC: all six in one report."""
    stubbed = _Stubbed()
    stubbed.identity()
    stubbed.catalogue({"m6g.large": 2}, arch="arm64")
    stubbed.image(arch="x86_64", state="deregistered")
    stubbed.ec2.add_client_error("describe_key_pairs", "InvalidKeyPair.NotFound", "no such key")
    stubbed.ec2.add_response("describe_security_groups", {"SecurityGroups": [
        {"GroupId": "sg-0123456789abcdef0", "VpcId": "vpc-a"}]})
    stubbed.ec2.add_response("describe_subnets", {"Subnets": [{"SubnetId": "subnet-1", "VpcId": "vpc-b"}]})
    stubbed.quotas.add_response("get_service_quota", {"Quota": {"Value": 100.0}})
    types = ("    - {name: m6g.large, slots: 2, speed: 1, price: 0.1, limit: 1}\n"
             "    - {name: zz.huge, slots: 2, speed: 1, price: 0.1, limit: 1}\n")
    with stubbed as clients:
        report = preflight(_inventory(types, extra="  subnet: subnet-1\n"), clients)
    fields = [p.field for p in report.problems]
    assert fields == ["aws.types.zz.huge", "aws.ami", "aws.types.m6g.large", "aws.key_name", "aws.security_group"]
    rendered = "\n".join(p.render() for p in report.problems)
    for expected in ("'zz.huge' is not offered in us-east-1", "is deregistered, not available",
                     "runs arm64, but AMI 'ami-0123456789abcdef0' is x86_64", "key pair 'broker' not found",
                     "is in vpc-a, subnet 'subnet-1' in vpc-b"):
        assert expected in rendered, rendered


# -- end to end: `broker run` (live) in a network namespace with no route out ------------------
_IN_NAMESPACE = textwrap.dedent(
    r"""
    import json, os, socket, subprocess, sys
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    try:  # the namespace has no route out: prove it
        socket.create_connection(("192.0.2.1", 443), timeout=2).close()
        sys.exit("a connection left the namespace")
    except OSError as exc:
        unreachable = str(exc)
    env = dict(os.environ)
    if sys.argv[1] == "moto":
        import boto3
        from moto.server import ThreadedMotoServer
        server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
        server.start()
        url = "http://127.0.0.1:%d" % server.get_host_and_port()[1]
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url, aws_access_key_id="testing",
                           aws_secret_access_key="testing")
        ec2.create_key_pair(KeyName="broker")
        env.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    done = subprocess.run([sys.executable, "-m", "broker", "run", "--yes", *sys.argv[2:]], env=env,
                          capture_output=True, text=True, timeout=120)
    print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr, "unreachable": unreachable}))
    """
)


def _run_in_namespace(tmp_path: Path, mode: str, monkeypatch) -> tuple[dict, Path, Path]:
    from test_aws_fleet import isolate_from_real_aws

    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], capture_output=True).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the network-namespace preflight tests, but `unshare -n` does not work here")
        pytest.skip("`unshare -n` does not work here")
    isolate_from_real_aws(monkeypatch, tmp_path)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    key = tmp_path / "broker.pem"
    key.write_text("not a key: never used, the run stops before any SSH\n")
    key.chmod(0o600)
    marks = tmp_path / "marks"
    marks.mkdir()
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "private:\n  - {name: here, local: true, slots: 2}\n"
        f"aws:\n  region: us-east-1\n  ami: ami-0badbadbadbadbad0\n  key_name: broker\n  key: {key}\n"
        "  security_group: sg-0123456789abcdef0\n  types:\n"
        "    - {name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 2}\n"
        "    - {name: zz.huge, slots: 2, speed: 1, price: 0.1, limit: 2}\n")
    bag = tmp_path / "bag.yaml"
    bag.write_text(f"command: 'touch ran-{{i}}'\nsweep: {{i: {{range: [0, 20]}}}}\ntimeout: 10s\nworkdir: {marks}\n")
    run_dir = tmp_path / "run"
    argv = [unshare, "-n", sys.executable, "-c", _IN_NAMESPACE, mode, "--inventory", str(inventory), str(bag),
            "--run-dir", str(run_dir), "--deadline", "1h"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), run_dir, marks


def test_a_live_run_without_credentials_exits_2_before_anything_runs(tmp_path: Path, monkeypatch) -> None:
    result, run_dir, marks = _run_in_namespace(tmp_path, "no-credentials", monkeypatch)
    assert "unreachable" in result["unreachable"]
    assert result["rc"] == 2, result["err"][-3000:]
    assert result["err"].startswith("1 problem found; nothing was started:")
    assert "aws: no AWS credentials found" in result["err"]
    assert not run_dir.exists() and list(marks.iterdir()) == []  # no run directory, no task ran


@pytest.mark.slow
def test_a_live_run_with_a_bad_ami_group_and_type_names_each_and_runs_nothing(tmp_path: Path, monkeypatch) -> None:
    result, run_dir, marks = _run_in_namespace(tmp_path, "moto", monkeypatch)
    err = result["err"]
    assert result["rc"] == 2, err[-3000:]
    assert "3 problems found; nothing was started:" in err
    assert "aws.types.zz.huge: instance type 'zz.huge' is not offered in us-east-1" in err
    assert "aws.ami: AMI 'ami-0badbadbadbadbad0' not found in us-east-1" in err
    assert "aws.security_group: security group 'sg-0123456789abcdef0' not found in us-east-1" in err
    assert "aws.key_name" not in err  # the key pair exists: only what is wrong is named
    assert not run_dir.exists() and list(marks.iterdir()) == []
