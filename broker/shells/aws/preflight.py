"""Preflight: ask AWS, read-only, whether a live run can work before it spends anything.

``broker run`` (live) calls :func:`preflight` after reading its input files and before it
creates a run directory, samples a task or starts an agent; ``broker validate --live`` runs
the same checks. Every problem found is reported at once (the caller exits 2):

- the credentials work (``sts:GetCallerIdentity``); without them nothing else can be asked,
  so the other checks are skipped and the problem says so;
- the AMI exists in the region and is ``available`` (``ec2:DescribeImages``), and its
  architecture is one every type runs (``ec2:DescribeInstanceTypes``);
- the key pair (``ec2:DescribeKeyPairs``), the security group (``ec2:DescribeSecurityGroups``)
  and, when given, the subnet (``ec2:DescribeSubnets``) exist, the group in the subnet's VPC;
- every type is offered in the region (``ec2:DescribeInstanceTypeOfferings``);
- the account's on-demand vCPU quota of each family covers the inventory's peak, every type
  at its ``limit`` at once (the most any plan can rent): ``servicequotas:GetServiceQuota``,
  ``L-1216C47A`` "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances" for most
  types, the family's own code for G/VT, P, X, F, Inf, Trn, DL, HPC and high-memory types.
  The quota is not used by this run alone (other instances of the account count against
  it): covering the peak is necessary, not sufficient. A denied quota call is a warning,
  not a problem (the IAM policy may leave Service Quotas out).

An inventory without EC2 types needs no AWS at all: :func:`preflight` then makes no call and
says so. Every call it makes is granted by ``deploy/iam-policy.json`` and by the policy
``broker iam-policy`` prints (``tests/test_iam_policy.py`` checks both against this source).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from broker.config.errors import Problem
from broker.core.model import Inventory

from .errors import classify
from .records import AwsFailure, LaunchErrorKind

STANDARD_QUOTA = "L-1216C47A"
# On-demand vCPU quotas (Service Quotas, service code "ec2"), by instance family prefix.
# Longer prefixes are tried first; a family not listed here falls to the first letter.
_QUOTAS_BY_PREFIX = {
    "u-": ("L-43DA4232", "Running On-Demand High Memory instances"),
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "trn": ("L-2C3B7624", "Running On-Demand Trn instances"),
    "hpc": ("L-F7808C92", "Running On-Demand HPC instances"),
    "dl": ("L-6E869C2A", "Running On-Demand DL instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "x": ("L-7295265B", "Running On-Demand X instances"),
    "f": ("L-74FC7D96", "Running On-Demand F instances"),
}
_STANDARD_LETTERS = "acdhimrtz"
_STANDARD_NAME = "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"


@dataclass(frozen=True)
class AwsClients:
    """The three clients the checks use (tests pass stubbed or moto-served ones)."""

    sts: Any
    ec2: Any
    quotas: Any


@dataclass
class PreflightReport:
    """What the checks found: ``problems`` refuse the run, ``warnings`` do not, ``checked``
    says in a few words what was confirmed."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def quota_of(type_name: str) -> tuple[str, str] | None:
    """``(quota code, quota name)`` of the on-demand vCPU quota ``type_name`` counts against;
    ``None`` for a type no on-demand vCPU quota covers (``mac*`` runs on dedicated hosts)."""
    family = type_name.split(".", 1)[0].lower()
    if family.startswith("mac"):
        return None
    for prefix in sorted(_QUOTAS_BY_PREFIX, key=len, reverse=True):
        if family.startswith(prefix):
            return _QUOTAS_BY_PREFIX[prefix]
    if family[:1] in _STANDARD_LETTERS:
        return STANDARD_QUOTA, _STANDARD_NAME
    return None


def clients_for(region: str | None, session: Any = None) -> AwsClients:
    """Clients for ``region`` from ``session`` (default: boto3's usual credential chain).

    Few retries and short timeouts: a preflight that cannot reach AWS says so in seconds.
    """
    import boto3

    session = session or boto3.Session()
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20)
    return AwsClients(*(session.client(name, region_name=region, config=config)
                        for name in ("sts", "ec2", "service-quotas")))


def preflight(inventory: Inventory, clients: AwsClients | None = None,
              make_clients: Callable[[str | None], AwsClients] = clients_for) -> PreflightReport:
    """Run every check for ``inventory``'s AWS section; see the module's docstring."""
    report = PreflightReport()
    if not inventory.types:
        report.checked.append("no EC2 types in the inventory: AWS is not needed, nothing was asked of it")
        return report
    checks = _Checks(inventory, clients or make_clients(inventory.aws.region), report)
    if not checks.credentials():
        return report
    types = checks.instance_types()
    checks.image(types)
    checks.network()
    checks.quotas(types)
    return report


class _Checks:
    """One preflight: each method adds what it finds to the report."""

    def __init__(self, inventory: Inventory, clients: AwsClients, report: PreflightReport) -> None:
        self.inventory = inventory
        self.aws = inventory.aws
        self.clients = clients
        self.report = report
        self.region = inventory.aws.region or "the default region"

    def problem(self, field_name: str, message: str) -> None:
        self.report.problems.append(Problem(self.inventory.source, field_name, message))

    def credentials(self) -> bool:
        result = _call(lambda: self.clients.sts.get_caller_identity())
        if isinstance(result, AwsFailure):
            if result.code in ("NoCredentialsError", "PartialCredentialsError"):
                why = result.message
            elif result.kind is LaunchErrorKind.AUTH:
                why = f"AWS rejected the credentials ({result.code}): {result.message}"
            else:
                why = f"could not check the AWS credentials ({result.code}): {result.message}"
            self.problem("aws", f"{why} (the other AWS checks need working credentials and were skipped)")
            return False
        self.report.checked.append(f"AWS credentials work (identity {result.get('Arn')})")
        return True

    def instance_types(self) -> dict[str, dict]:
        """The inventory's types EC2 offers in the region, with their description."""
        names = sorted({t.instance_type for t in self.inventory.types})  # EC2's names, either market
        where = [{"Name": "instance-type", "Values": names}]
        offered = _pages(lambda **kw: self.clients.ec2.describe_instance_type_offerings(
            LocationType="region", Filters=where, **kw), "InstanceTypeOfferings")
        if isinstance(offered, AwsFailure):
            self.problem("aws.types", f"could not list the instance types offered in {self.region}: "
                         f"{offered.render()}")
            return {}
        offered_names = {o["InstanceType"] for o in offered}
        for name in names:
            if name not in offered_names:
                self.problem(f"aws.types.{name}", f"instance type {name!r} is not offered in {self.region}")
        if not offered_names:
            return {}
        described = _pages(lambda **kw: self.clients.ec2.describe_instance_types(
            Filters=[{"Name": "instance-type", "Values": sorted(offered_names)}], **kw), "InstanceTypes")
        if isinstance(described, AwsFailure):
            self.problem("aws.types", f"could not describe the instance types: {described.render()}")
            return {}
        self.report.checked.append(f"{len(offered_names)} of {len(names)} instance types offered in {self.region}")
        return {t["InstanceType"]: t for t in described}

    def image(self, types: dict[str, dict]) -> None:
        ami = self.aws.ami
        if not ami:
            self.problem("aws.ami", "no AMI given")
            return
        images = _call(lambda: self.clients.ec2.describe_images(ImageIds=[ami])["Images"])
        if isinstance(images, AwsFailure):
            found = images.kind is LaunchErrorKind.INVALID
            self.problem("aws.ami", f"AMI {ami!r} not found in {self.region}: {images.message}" if found
                         else f"could not look up AMI {ami!r}: {images.render()}")
            return
        if not images:
            self.problem("aws.ami", f"AMI {ami!r} not found in {self.region}")
            return
        image = images[0]
        if image.get("State", "available") != "available":
            self.problem("aws.ami", f"AMI {ami!r} is {image['State']}, not available")
        arch = image.get("Architecture")
        for name, described in sorted(types.items()):
            runs = described.get("ProcessorInfo", {}).get("SupportedArchitectures") or []
            if arch and runs and arch not in runs:
                self.problem(f"aws.types.{name}", f"instance type {name!r} runs {'/'.join(runs)}, but AMI {ami!r} "
                             f"is {arch}: use an AMI built for {runs[0]} or drop the type")
        self.report.checked.append(f"AMI {ami} available ({arch or 'architecture unknown'})")

    def network(self) -> None:
        aws = self.aws
        if aws.key_name:
            self._exists("aws.key_name", f"key pair {aws.key_name!r}",
                         lambda: self.clients.ec2.describe_key_pairs(KeyNames=[aws.key_name])["KeyPairs"])
        group = subnet = None
        if aws.security_group:
            if not aws.security_group.startswith("sg-"):
                self.problem("aws.security_group", f"{aws.security_group!r} is not a security group id "
                             "(sg-...): the broker launches with SecurityGroupIds")
            else:
                group = self._exists("aws.security_group", f"security group {aws.security_group!r}",
                                     lambda: self.clients.ec2.describe_security_groups(
                                         GroupIds=[aws.security_group])["SecurityGroups"])
        if aws.subnet:
            subnet = self._exists("aws.subnet", f"subnet {aws.subnet!r}",
                                  lambda: self.clients.ec2.describe_subnets(SubnetIds=[aws.subnet])["Subnets"])
        if group and subnet and group.get("VpcId") != subnet.get("VpcId"):
            self.problem("aws.security_group", f"security group {aws.security_group!r} is in {group.get('VpcId')}, "
                         f"subnet {aws.subnet!r} in {subnet.get('VpcId')}: EC2 refuses to launch across VPCs")

    def _exists(self, field_name: str, what: str, describe: Callable[[], list]) -> dict | None:
        found = _call(describe)
        if isinstance(found, AwsFailure):
            if found.kind is LaunchErrorKind.INVALID:
                self.problem(field_name, f"{what} not found in {self.region} ({found.code})")
            else:
                self.problem(field_name, f"could not look up {what}: {found.render()}")
            return None
        if not found:
            self.problem(field_name, f"{what} not found in {self.region}")
            return None
        self.report.checked.append(f"{what} found")
        return found[0]

    def quotas(self, types: dict[str, dict]) -> None:
        """The inventory's peak vCPUs per on-demand quota, against the account's quota."""
        peaks: dict[tuple[str, str], int] = {}
        for machine in self.inventory.types:
            if machine.is_spot:  # spot vCPUs count against the spot quotas, not these
                continue
            described = types.get(machine.instance_type)
            quota = quota_of(machine.instance_type)
            if described is None or quota is None:
                continue
            vcpus = int(described.get("VCpuInfo", {}).get("DefaultVCpus", 0))
            peaks[quota] = peaks.get(quota, 0) + machine.limit * vcpus
        for (code, name), peak in sorted(peaks.items()):
            value = self._quota_value(code, name)
            if value is None:
                continue
            if peak > value:
                self.problem("aws.types", f"the types' limits allow {peak} vCPUs of on-demand instances counted by "
                             f"the quota {name!r} ({code}), but the account's quota in {self.region} is {value:g} "
                             "vCPUs: lower the types' limits or ask AWS for more (Service Quotas console)")
            else:
                self.report.checked.append(f"vCPU quota {code} {value:g} covers the peak of {peak}")

    def _quota_value(self, code: str, name: str) -> float | None:
        """The quota's applied value (else its default); ``None``, with a warning, if unreadable."""
        try:
            result = _call(lambda: self.clients.quotas.get_service_quota(
                ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
            if isinstance(result, AwsFailure) and result.code == "NoSuchResourceException":
                result = _call(lambda: self.clients.quotas.get_aws_default_service_quota(
                    ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except Exception as exc:  # noqa: BLE001 - a quota never refuses a run by crashing it (moto lacks one call)
            result = AwsFailure(LaunchErrorKind.UNKNOWN, type(exc).__name__, str(exc))
        if isinstance(result, AwsFailure):
            denied = " (denied by the IAM policy)" if result.kind is LaunchErrorKind.AUTH else ""
            self.report.warnings.append(
                f"{self.inventory.source}: could not read the on-demand vCPU quota {code} ({name}){denied}: "
                f"{result.code}; the run may meet VcpuLimitExceeded")
            return None
        return float(result)


def _call(call: Callable[[], Any]) -> Any:
    """The call's result, or the :class:`AwsFailure` it raised (botocore retried already)."""
    try:
        return call()
    except (ClientError, BotoCoreError) as exc:
        return classify(exc)


def _pages(call: Callable[..., dict], key: str) -> list | AwsFailure:
    """Every item under ``key`` of every page of a paginated call."""
    items: list = []
    kwargs: dict[str, Any] = {}
    while True:
        page = _call(lambda: call(**kwargs))
        if isinstance(page, AwsFailure):
            return page
        items.extend(page.get(key, []))
        if not page.get("NextToken"):
            return items
        kwargs = {"NextToken": page["NextToken"]}
