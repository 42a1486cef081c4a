"""The fault injector on a moto EC2 client, and the launch invariants it exists to check."""

from __future__ import annotations

import itertools

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.shells.aws import LaunchErrorKind, RetryPolicy
from broker.shells.faults import FaultInjector, FaultKind, Injection
from test_aws_fleet import World, account, world  # noqa: F401  (fixtures shared with the fleet tests)

_tokens = itertools.count()


def _run_raw(client, world: World, count: int = 1, token: str | None = None) -> dict:
    tags = [{"Key": "broker:run", "Value": world.run_id}]
    return client.run_instances(
        ImageId=world.ami,
        InstanceType="t3.micro",
        MinCount=count,
        MaxCount=count,
        ClientToken=token or f"raw-{next(_tokens)}",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )


def test_scripted_faults_hit_exactly_the_named_calls_and_are_logged(world: World) -> None:
    injector = FaultInjector.scripted(
        {"RunInstances": [None, FaultKind.THROTTLE], "DescribeInstances": [FaultKind.READ_TIMEOUT]}
    )
    client = injector.attach(world.account.session.client("ec2"))

    with pytest.raises(ReadTimeoutError):
        client.describe_instances()
    client.describe_instances()
    _run_raw(client, world)
    with pytest.raises(ClientError) as caught:
        _run_raw(client, world)
    _run_raw(client, world)

    assert caught.value.response["Error"]["Code"] == "RequestLimitExceeded"
    assert injector.log == [
        Injection(0, "DescribeInstances", 0, FaultKind.READ_TIMEOUT),
        Injection(3, "RunInstances", 1, FaultKind.THROTTLE),
    ]
    assert len(world.of_run()) == 2


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (FaultKind.CAPACITY, "InsufficientInstanceCapacity"),
        (FaultKind.LIMIT, "InstanceLimitExceeded"),
        (FaultKind.VCPU_LIMIT, "VcpuLimitExceeded"),
    ],
)
def test_error_faults_surface_as_botocores_own_client_errors(world: World, kind: FaultKind, code: str) -> None:
    injector = FaultInjector.scripted({"RunInstances": [kind]})
    client = injector.attach(world.account.session.client("ec2"))
    with pytest.raises(ClientError) as caught:
        _run_raw(client, world, count=2)
    assert caught.value.response["Error"]["Code"] == code
    assert caught.value.operation_name == "RunInstances"
    assert world.of_run() == []


def test_a_lost_response_follows_a_call_that_happened_and_a_read_timeout_one_that_did_not(world: World) -> None:
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.READ_TIMEOUT, FaultKind.LOST_RESPONSE]})
    client = injector.attach(world.account.session.client("ec2"))

    with pytest.raises(ReadTimeoutError):
        _run_raw(client, world, count=2)
    assert world.of_run() == []
    with pytest.raises(ReadTimeoutError):
        _run_raw(client, world, count=2)
    assert len(world.of_run()) == 2


def test_partial_launches_half_and_is_not_injected_for_one_instance(world: World) -> None:
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.PARTIAL, FaultKind.PARTIAL]})
    client = injector.attach(world.account.session.client("ec2"))

    assert len(_run_raw(client, world, count=1)["Instances"]) == 1
    assert len(_run_raw(client, world, count=7)["Instances"]) == 3
    assert [(i.kind, i.detail) for i in injector.log] == [(FaultKind.PARTIAL, "launched 3 of 7")]


def test_launch_only_faults_are_refused_for_other_operations() -> None:
    with pytest.raises(ValueError, match="CAPACITY"):
        FaultInjector.scripted({"DescribeInstances": [FaultKind.CAPACITY]})


def test_detached_injector_injects_nothing(world: World) -> None:
    injector = FaultInjector.scripted({"DescribeInstances": [FaultKind.THROTTLE] * 3})
    client = injector.attach(world.account.session.client("ec2"))
    with pytest.raises(ClientError):
        client.describe_instances()
    injector.detach()
    client.describe_instances()
    client.describe_instances()
    assert len(injector.log) == 1


def _seeded_log(world: World, seed: int, calls: int) -> list[Injection]:
    injector = FaultInjector.seeded(
        seed, {FaultKind.THROTTLE: 0.25, FaultKind.CAPACITY: 0.5}, operations=("DescribeInstances",)
    )
    client = injector.attach(world.account.session.client("ec2"))
    filters = [{"Name": "tag:broker:run", "Values": ["nobody"]}]
    for _ in range(calls):
        try:
            client.describe_instances(Filters=filters)
        except ClientError:
            pass
    return injector.log


def test_a_seeded_schedule_replays_and_draws_at_its_rate(world: World) -> None:
    calls = 400
    log = _seeded_log(world, seed=11, calls=calls)

    assert _seeded_log(world, seed=11, calls=calls) == log
    assert _seeded_log(world, seed=12, calls=calls) != log
    # CAPACITY does not apply to DescribeInstances: only THROTTLE, at rate 0.25.
    assert {i.kind for i in log} == {FaultKind.THROTTLE}
    mean, sd = calls * 0.25, (calls * 0.25 * 0.75) ** 0.5
    assert abs(len(log) - mean) <= 4 * sd


def test_seeded_rates_must_be_probabilities() -> None:
    with pytest.raises(ValueError):
        FaultInjector.seeded(0, {FaultKind.THROTTLE: 0.7, FaultKind.LIMIT: 0.4})


_SCRIPT = st.lists(
    st.sampled_from(
        [None, FaultKind.THROTTLE, FaultKind.READ_TIMEOUT, FaultKind.LOST_RESPONSE, FaultKind.CAPACITY, FaultKind.PARTIAL]
    ),
    max_size=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=_SCRIPT, count=st.integers(min_value=1, max_value=4))
def test_launches_are_never_doubled_whatever_fails(world: World, script, count: int) -> None:
    """Under any sequence of faults, a client token never holds more than ``count``
    instances, a success holds exactly ``count``, and replaying the launch (a restart after
    a crash) creates nothing beyond that."""
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.5, max_delay_s=2.0, max_total_s=30.0)
    token = f"prop-{next(_tokens)}"
    world.time.sleeps_s.clear()
    injector = FaultInjector.scripted({"RunInstances": script})
    fleet = world.fleet_with_faults(injector, retry=policy)

    first = fleet.launch("t3.micro", count, client_token=token)
    under_token = {i["InstanceId"] for i in world.instances(**{"tag:broker:client-token": token})}

    assert len(under_token) <= count
    assert set(first.instance_ids) <= under_token
    if first.ok:
        assert len(first.instances) == count
    elif first.failure.kind is LaunchErrorKind.PARTIAL:
        assert 0 < len(first.instances) < count
    assert sum(world.time.sleeps_s) <= policy.max_total_s
    assert first.attempts <= policy.max_attempts

    replay = world.fleet().launch("t3.micro", count, client_token=token)
    after = {i["InstanceId"] for i in world.instances(**{"tag:broker:client-token": token})}
    assert len(after) <= count
    if under_token:
        assert after == under_token and replay.reused
    else:
        assert replay.ok and len(after) == count
