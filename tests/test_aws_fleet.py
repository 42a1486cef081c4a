"""The EC2 edge against moto (in-process, us-east-1), with faults moto cannot produce injected.

Nothing here contacts a network: moto intercepts every call inside botocore, and the
instance IPs it returns are never used.
"""

from __future__ import annotations

import base64
import random
import time
from pathlib import Path

import boto3
import pytest
import moto.settings
from moto import mock_aws

from broker.config.aws import AwsSettings
from broker.shells.aws import (
    MANAGED_TAG,
    RUN_TAG,
    TOKEN_TAG,
    Ec2Fleet,
    InstanceState,
    LaunchErrorKind,
    RetryPolicy,
    kind_of_code,
)
from broker.shells.faults import FaultInjector, FaultKind

REGION = "us-east-1"
USER_DATA = Path(__file__).resolve().parent.parent / "deploy" / "user-data.sh"


class FakeTime:
    """An injected clock whose time passes only when the fleet sleeps; sleeps are recorded."""

    def __init__(self) -> None:
        self.now_s = 1_000.0
        self.sleeps_s: list[float] = []

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.now_s += seconds


def isolate_from_real_aws(env: pytest.MonkeyPatch, tmp_dir: Path) -> None:
    """No profile, no config file, no instance metadata, no container credentials."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
        "AWS_ENDPOINT_URL_STS",
    ):
        env.delenv(name, raising=False)
    empty = tmp_dir / "aws-empty"
    empty.write_text("")
    env.setenv("AWS_CONFIG_FILE", str(empty))
    env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    env.setenv("AWS_EC2_METADATA_DISABLED", "true")
    env.setenv("AWS_DEFAULT_REGION", REGION)


class Account:
    """One moto account for the module: a VPC, subnet, security group, key pair, a stock AMI.

    Building it (and a boto3 session's service models) costs seconds, so tests share it and
    keep apart by run id: every test gets its own runs, and the fleet only sees its run.
    """

    def __init__(self) -> None:
        self.session = boto3.Session(region_name=REGION)
        self.ec2 = self.session.client("ec2")
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        self.security_group = self.ec2.create_security_group(
            GroupName="broker", Description="broker agents", VpcId=vpc
        )["GroupId"]
        self.ec2.create_key_pair(KeyName="broker-key")
        images = self.ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn-ami-hvm-*"]}])
        self.ami = images["Images"][0]["ImageId"]
        self.settings = AwsSettings(
            region=REGION,
            ami=self.ami,
            key_name="broker-key",
            security_group=self.security_group,
            subnet=self.subnet,
            tags={"project": "thesis", "owner": "alice"},
        )


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as env:
        isolate_from_real_aws(env, tmp_path_factory.mktemp("aws"))
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        # moto reads these variables once, when moto.settings is imported (before any
        # fixture runs), so the module attributes are what switch the validation on.
        env.setenv("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "1")
        env.setenv("MOTO_ENABLE_AMI_VALIDATION", "1")
        env.setattr(moto.settings, "EC2_ENABLE_INSTANCE_TYPE_VALIDATION", True)
        env.setattr(moto.settings, "ENABLE_AMI_VALIDATION", True)
        with mock_aws():
            yield Account()


class World:
    """One test's view of the account: its own run ids, settings and fake time."""

    _serial = 0

    def __init__(self, account: Account) -> None:
        World._serial += 1
        self.account = account
        self.ec2 = account.ec2
        self.ami = account.ami
        self.subnet = account.subnet
        self.security_group = account.security_group
        self.settings = account.settings
        self.run_id = f"run-{World._serial}"
        self.other_run_id = f"run-{World._serial}-other"
        self.time = FakeTime()

    def fleet(self, run_id: str | None = None, *, client=None, retry: RetryPolicy = RetryPolicy(), seed: int = 7) -> Ec2Fleet:
        return Ec2Fleet(
            client if client is not None else self.account.session,
            self.settings,
            run_id or self.run_id,
            clock=self.time.clock,
            sleep=self.time.sleep,
            rng=random.Random(seed),
            retry=retry,
        )

    def fleet_with_faults(self, injector: FaultInjector, run_id: str | None = None, **kw) -> Ec2Fleet:
        client = injector.attach(self.account.session.client("ec2"))
        return self.fleet(run_id, client=client, **kw)

    def instances(self, **filters: str) -> list[dict]:
        f = [{"Name": k, "Values": [v]} for k, v in filters.items()]
        pages = self.ec2.describe_instances(Filters=f)["Reservations"]
        return [i for r in pages for i in r["Instances"]]

    def of_run(self, run_id: str | None = None) -> list[dict]:
        return self.instances(**{"tag:broker:run": run_id or self.run_id})

    def state_of(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return reservations[0]["Instances"][0]["State"]["Name"]


@pytest.fixture
def world(account: Account) -> World:
    return World(account)


def _tags(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


# -- launching ------------------------------------------------------------------------------
def test_every_launched_instance_and_its_volume_carry_the_run_tags(world: World) -> None:
    user_data = USER_DATA.read_text()
    outcome = world.fleet().launch("c5.xlarge", 3, client_token="tok-tags", user_data=user_data)

    assert outcome.ok and outcome.attempts == 1 and not outcome.reused
    assert len(outcome.instances) == 3
    expected = {
        MANAGED_TAG: "true",
        RUN_TAG: world.run_id,
        TOKEN_TAG: "tok-tags",
        "broker:offer": "c5.xlarge",  # the inventory's key, read back by describe
        "Name": f"broker-{world.run_id}-c5.xlarge",
        "project": "thesis",
        "owner": "alice",
    }
    for record in outcome.instances:
        (raw,) = world.ec2.describe_instances(InstanceIds=[record.id])["Reservations"][0]["Instances"]
        assert _tags(raw) == expected
        assert record.tags == expected
        assert raw["InstanceType"] == "c5.xlarge" and raw["ImageId"] == world.ami
        assert raw["KeyName"] == "broker-key" and raw["SubnetId"] == world.subnet
        assert [g["GroupId"] for g in raw["SecurityGroups"]] == [world.security_group]
        volume_ids = [m["Ebs"]["VolumeId"] for m in raw["BlockDeviceMappings"]]
        assert volume_ids
        for volume in world.ec2.describe_volumes(VolumeIds=volume_ids)["Volumes"]:
            assert _tags(volume) == expected
        attribute = world.ec2.describe_instance_attribute(InstanceId=record.id, Attribute="userData")
        assert base64.b64decode(attribute["UserData"]["Value"]).decode() == user_data


def test_launch_passes_the_instance_profile_by_name_or_arn(world: World) -> None:
    iam = world.account.session.client("iam")
    profile = iam.create_instance_profile(InstanceProfileName="broker-agent")["InstanceProfile"]
    for given in ("broker-agent", profile["Arn"]):
        settings = AwsSettings(**{**_fields(world.settings), "instance_profile": given})
        fleet = Ec2Fleet(world.account.session, settings, world.run_id, sleep=world.time.sleep)
        outcome = fleet.launch("t3.micro", 1, client_token=f"tok-{len(given)}")
        assert outcome.ok
        (raw,) = world.ec2.describe_instances(InstanceIds=list(outcome.instance_ids))["Reservations"][0]["Instances"]
        assert raw["IamInstanceProfile"]["Arn"] == profile["Arn"]


def _fields(settings: AwsSettings) -> dict:
    return {name: getattr(settings, name) for name in settings.__slots__}


def test_the_same_client_token_never_launches_twice(world: World) -> None:
    fleet = world.fleet()
    first = fleet.launch("t3.micro", 2, client_token="tok-once")
    again = fleet.launch("t3.micro", 2, client_token="tok-once")
    other = fleet.launch("t3.micro", 2, client_token="tok-other")

    assert first.ok and again.ok and other.ok
    assert set(again.instance_ids) == set(first.instance_ids) and again.reused and not first.reused
    assert not set(other.instance_ids) & set(first.instance_ids)
    assert len(world.of_run()) == 4


def test_a_token_reused_for_another_type_is_refused_like_ec2_does(world: World) -> None:
    fleet = world.fleet()
    assert fleet.launch("t3.micro", 1, client_token="tok-mismatch").ok
    clash = fleet.launch("c5.large", 1, client_token="tok-mismatch")
    assert clash.failure is not None and clash.failure.kind is LaunchErrorKind.INVALID
    assert clash.failure.code == "IdempotentParameterMismatch"
    assert len(world.of_run()) == 1


def test_retry_after_a_lost_response_returns_the_launched_instances_not_new_ones(world: World) -> None:
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.LOST_RESPONSE]})
    outcome = world.fleet_with_faults(injector).launch("t3.micro", 3, client_token="tok-lost")

    assert [i.kind for i in injector.log] == [FaultKind.LOST_RESPONSE]
    assert outcome.ok and outcome.reused and outcome.attempts == 2
    assert len(outcome.instances) == 3
    assert len(world.of_run()) == 3
    assert len(world.time.sleeps_s) == 1


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (FaultKind.CAPACITY, LaunchErrorKind.CAPACITY),
        (FaultKind.LIMIT, LaunchErrorKind.LIMIT),
        (FaultKind.VCPU_LIMIT, LaunchErrorKind.LIMIT),
    ],
)
def test_capacity_and_limit_errors_are_reported_at_once_without_retry(
    world: World, fault: FaultKind, kind: LaunchErrorKind
) -> None:
    injector = FaultInjector.scripted({"RunInstances": [fault]})
    outcome = world.fleet_with_faults(injector).launch("c5.xlarge", 2, client_token="tok-cap")

    assert outcome.failure is not None and outcome.failure.kind is kind
    assert outcome.failure.code and outcome.failure.message
    assert outcome.attempts == 1 and outcome.instances == ()
    assert world.time.sleeps_s == []
    assert world.of_run() == []


@pytest.mark.parametrize("fault", [FaultKind.THROTTLE, FaultKind.READ_TIMEOUT])
def test_throttling_and_timeouts_are_retried_then_succeed(world: World, fault: FaultKind) -> None:
    injector = FaultInjector.scripted({"RunInstances": [fault, fault]})
    outcome = world.fleet_with_faults(injector).launch("t3.micro", 2, client_token="tok-retry")

    assert outcome.ok and outcome.attempts == 3 and not outcome.reused
    assert len(injector.log) == 2
    assert len(world.of_run()) == 2
    assert len(world.time.sleeps_s) == 2


@pytest.mark.parametrize(
    ("fault", "kind"), [(FaultKind.THROTTLE, LaunchErrorKind.THROTTLED), (FaultKind.READ_TIMEOUT, LaunchErrorKind.TIMEOUT)]
)
def test_retries_exhausted_become_a_record_with_jittered_growing_sleeps(
    world: World, fault: FaultKind, kind: LaunchErrorKind
) -> None:
    policy = RetryPolicy(max_attempts=6, base_delay_s=1.0, max_delay_s=8.0, max_total_s=1_000.0)
    injector = FaultInjector.scripted({"RunInstances": [fault] * 10})
    outcome = world.fleet_with_faults(injector, retry=policy).launch("t3.micro", 1, client_token="tok-exhaust")

    assert outcome.failure is not None and outcome.failure.kind is kind
    assert outcome.attempts == 6 and len(injector.log) == 6
    sleeps = world.time.sleeps_s
    steps = [1.0, 2.0, 4.0, 8.0, 8.0]  # min(cap, base * 2^(k-1)) before retries 1..5
    assert len(sleeps) == len(steps)
    for slept, step in zip(sleeps, steps):
        assert step / 2 <= slept <= step
    assert any(step / 2 < slept < step for slept, step in zip(sleeps, steps)), "no jitter"
    assert world.of_run() == []


def test_retries_stop_before_the_total_time_bound_would_be_passed(world: World) -> None:
    policy = RetryPolicy(max_attempts=50, base_delay_s=1.0, max_delay_s=4.0, max_total_s=10.0)
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.THROTTLE] * 50})
    outcome = world.fleet_with_faults(injector, retry=policy).launch("t3.micro", 1, client_token="tok-total")

    assert outcome.failure is not None and outcome.failure.kind is LaunchErrorKind.THROTTLED
    assert sum(world.time.sleeps_s) <= 10.0
    assert 3 <= outcome.attempts < 50  # 0.5+1+2 s at least fit; 50 attempts cannot


def test_jitter_differs_between_fleets_with_different_seeds(world: World) -> None:
    seen = []
    for seed in (1, 2):
        world.time.sleeps_s.clear()
        injector = FaultInjector.scripted({"RunInstances": [FaultKind.THROTTLE]})
        world.fleet_with_faults(injector, seed=seed).launch("t3.micro", 1, client_token=f"tok-seed-{seed}")
        seen.append(tuple(world.time.sleeps_s))
    assert seen[0] != seen[1]


def test_a_partial_launch_is_reported_with_the_instances_that_did_launch(world: World) -> None:
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.PARTIAL]})
    outcome = world.fleet_with_faults(injector).launch("t3.micro", 5, client_token="tok-partial")

    assert outcome.failure is not None and outcome.failure.kind is LaunchErrorKind.PARTIAL
    assert len(outcome.instances) == 2
    on_ec2 = {i["InstanceId"] for i in world.of_run()}
    assert set(outcome.instance_ids) == on_ec2


@pytest.mark.parametrize(
    ("type_name", "ami_override"), [("zz.huge", None), ("t3.micro", "ami-12345678"), ("t3.micro", "")]
)
def test_invalid_type_or_ami_is_invalid_and_not_retried(world: World, type_name: str, ami_override) -> None:
    if ami_override is not None:
        world.settings = AwsSettings(**{**_fields(world.settings), "ami": ami_override})
    outcome = world.fleet().launch(type_name, 1, client_token="tok-invalid")

    assert outcome.failure is not None and outcome.failure.kind is LaunchErrorKind.INVALID
    assert outcome.attempts <= 1 and world.time.sleeps_s == []


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", LaunchErrorKind.CAPACITY),
        ("InstanceLimitExceeded", LaunchErrorKind.LIMIT),
        ("VcpuLimitExceeded", LaunchErrorKind.LIMIT),
        ("RequestLimitExceeded", LaunchErrorKind.THROTTLED),
        ("Throttling", LaunchErrorKind.THROTTLED),
        ("InvalidAMIID.NotFound", LaunchErrorKind.INVALID),
        ("InvalidParameterValue", LaunchErrorKind.INVALID),
        ("MissingParameter", LaunchErrorKind.INVALID),
        ("AuthFailure", LaunchErrorKind.AUTH),
        ("UnauthorizedOperation", LaunchErrorKind.AUTH),
        ("InvalidClientTokenId", LaunchErrorKind.AUTH),
        ("ExpiredToken", LaunchErrorKind.AUTH),
        ("InternalError", LaunchErrorKind.UNKNOWN),
    ],
)
def test_vendor_error_codes_map_to_closed_kinds(code: str, kind: LaunchErrorKind) -> None:
    assert kind_of_code(code) is kind


# -- credentials ------------------------------------------------------------------------------
def test_working_credentials_name_the_identity(world: World) -> None:
    check = world.fleet().check_credentials()
    assert check.ok and check.identity_arn and check.identity_arn in check.message


# -- describing, terminating, reconciling ------------------------------------------------------
def _launch_untagged(world: World) -> str:
    raw = world.ec2.run_instances(ImageId=world.ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)
    return raw["Instances"][0]["InstanceId"]


def test_describe_lists_only_this_run_with_translated_states(world: World) -> None:
    fleet = world.fleet()
    mine = fleet.launch("t3.micro", 2, client_token="tok-desc").instance_ids
    world.fleet(world.other_run_id).launch("t3.micro", 1, client_token="tok-desc-other")
    _launch_untagged(world)
    world.ec2.terminate_instances(InstanceIds=[mine[0]])
    world.ec2.stop_instances(InstanceIds=[mine[1]])

    described = fleet.describe()

    assert described.failure is None
    by_id = {r.id: r for r in described.instances}
    assert set(by_id) == set(mine)
    assert by_id[mine[0]].state is InstanceState.TERMINATED
    assert by_id[mine[1]].state in (InstanceState.STOPPING, InstanceState.STOPPED)
    assert all(abs(r.launched_at_s - time.time()) < 300 for r in described.instances)
    assert all(r.type_name == "t3.micro" for r in described.instances)


@pytest.mark.parametrize("state", list(InstanceState))
def test_every_vendor_state_name_has_its_enum_member(state: InstanceState) -> None:
    assert InstanceState.from_vendor(state.value) is state


def test_an_unheard_of_vendor_state_is_unknown() -> None:
    assert InstanceState.from_vendor("hibernating") is InstanceState.UNKNOWN
    assert InstanceState.from_vendor(None) is InstanceState.UNKNOWN


def test_terminate_refuses_instances_without_this_runs_tag_and_leaves_them_running(world: World) -> None:
    fleet = world.fleet()
    (mine,) = fleet.launch("t3.micro", 1, client_token="tok-term").instance_ids
    (foreign,) = world.fleet(world.other_run_id).launch("t3.micro", 1, client_token="tok-term-2").instance_ids
    untagged = _launch_untagged(world)
    asked: list[list[str]] = []
    fleet._ec2.meta.events.register(
        "before-parameter-build.ec2.TerminateInstances", lambda params, **_: asked.append(list(params["InstanceIds"]))
    )

    outcome = fleet.terminate([mine, foreign, untagged, "i-0123456789abcdef0"])

    assert outcome.terminated == (mine,)
    assert outcome.refused == (foreign, untagged, "i-0123456789abcdef0")
    assert outcome.failure is None
    assert asked == [[mine]]
    assert world.state_of(mine) in ("shutting-down", "terminated")
    assert world.state_of(foreign) in ("pending", "running")
    assert world.state_of(untagged) in ("pending", "running")

    again = fleet.terminate([mine])
    assert again.already_terminated == (mine,) and again.terminated == () and asked == [[mine]]


def test_reconcile_adopts_unjournaled_reports_missing_and_strays(world: World) -> None:
    fleet = world.fleet()
    journaled = fleet.launch("t3.micro", 1, client_token="tok-rec-a").instance_ids[0]
    unjournaled = fleet.launch("t3.micro", 1, client_token="tok-rec-b").instance_ids[0]
    terminated = fleet.launch("t3.micro", 1, client_token="tok-rec-c").instance_ids[0]
    world.ec2.terminate_instances(InstanceIds=[terminated])
    untagged = _launch_untagged(world)
    (other_run,) = world.fleet(world.other_run_id).launch("t3.micro", 1, client_token="tok-rec-d").instance_ids
    never_existed = "i-0123456789abcdef0"
    before = {i["InstanceId"]: i["State"]["Name"] for i in world.instances()}

    result = fleet.reconcile([journaled, terminated, untagged, never_existed])

    assert result.failure is None
    assert [r.id for r in result.adopted] == [unjournaled]
    assert set(result.missing) == {terminated, never_existed}
    assert result.strays == (untagged,)
    assert other_run not in {r.id for r in result.adopted} | set(result.strays) | set(result.missing)
    after = {i["InstanceId"]: i["State"]["Name"] for i in world.instances()}
    assert {k: v for k, v in after.items() if k != journaled} == {
        k: ("running" if v == "pending" else v) for k, v in before.items() if k != journaled
    }


def test_describe_failure_is_a_record_not_an_exception(world: World) -> None:
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.1, max_delay_s=0.1)
    injector = FaultInjector.scripted({"DescribeInstances": [FaultKind.THROTTLE] * 4})
    fleet = world.fleet_with_faults(injector, retry=policy)

    described = fleet.describe()
    terminated = fleet.terminate(["i-0123456789abcdef0"])

    assert described.failure is not None and described.failure.kind is LaunchErrorKind.THROTTLED
    assert terminated.failed == ("i-0123456789abcdef0",) and terminated.failure is not None
    assert terminated.failure.kind is LaunchErrorKind.THROTTLED


# -- waiting --------------------------------------------------------------------------------------
def test_wait_running_reports_running_and_not_running(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    waiter_sleeps: list[float] = []
    monkeypatch.setattr("botocore.waiter.time.sleep", waiter_sleeps.append)
    fleet = world.fleet()
    ids = fleet.launch("t3.micro", 2, client_token="tok-wait").instance_ids
    foreign = _launch_untagged(world)

    ready = fleet.wait_running([*ids, foreign], timeout_s=10, poll_s=1)
    assert {r.id for r in ready.running} == set(ids)
    assert ready.not_running == (foreign,)
    assert ready.failure is None

    world.ec2.stop_instances(InstanceIds=[ids[0]])
    stuck = fleet.wait_running([ids[0]], timeout_s=3, poll_s=1)
    assert stuck.running == () and stuck.not_running == (ids[0],)
    assert stuck.failure is not None and stuck.failure.kind is LaunchErrorKind.TIMEOUT
    assert waiter_sleeps == [1, 1]  # three polls, one second apart, then give up

    world.ec2.terminate_instances(InstanceIds=[ids[1]])
    dead = fleet.wait_running([ids[1]], timeout_s=10, poll_s=1)
    assert dead.not_running == (ids[1],) and dead.failure is not None
    assert waiter_sleeps == [1, 1]  # a terminal state ends the wait at once
