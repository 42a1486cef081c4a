"""The fault injector on a moto EC2 client, and the launch invariants it exists to check."""

from __future__ import annotations

import itertools

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.shells.aws import LaunchErrorKind, RetryPolicy
from broker.shells.faults import FaultInjector, FaultKind, Injection, SpecFaultInjector, parse_fault_spec
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


# -- what moto does not emulate: idempotency, eventual consistency, pending, outages ----------

class _Clock:
    """The injector's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ids(response: dict) -> list[str]:
    return [i["InstanceId"] for i in response["Instances"]]


def _listed(client, world: World) -> set[str]:
    pages = client.describe_instances(Filters=[{"Name": "tag:broker:run", "Values": [world.run_id]}])
    return {i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]}


def test_moto_itself_ignores_the_client_token(world: World) -> None:
    """Why the injector emulates idempotency: moto 5 launches again under a used token."""
    token = f"raw-{next(_tokens)}"
    first, second = _run_raw(world.ec2, world, token=token), _run_raw(world.ec2, world, token=token)
    assert _ids(first) != _ids(second)


def test_the_same_client_token_returns_the_same_instances_and_launches_nothing(world: World) -> None:
    injector = FaultInjector.scripted({})
    client = injector.attach(world.account.session.client("ec2"))
    token = f"raw-{next(_tokens)}"

    first = _run_raw(client, world, count=2, token=token)
    again = _run_raw(client, world, count=2, token=token)
    other = _run_raw(client, world, count=1)

    assert _ids(again) == _ids(first)
    assert len(world.of_run()) == 3  # two under the token, one under another
    assert [i.kind for i in injector.log] == [FaultKind.IDEMPOTENT]
    assert set(injector.log[0].detail.split()[2:]) == set(_ids(first))
    assert _ids(other)[0] not in _ids(first)


def test_a_launch_retried_after_a_lost_response_while_ec2_hides_it_creates_nothing_new(world: World) -> None:
    """The fleet looks for the token's instances before retrying; eventual consistency hides
    them, so only EC2's own idempotency (emulated) keeps the retry from launching again."""
    clock = _Clock()
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.LOST_RESPONSE]})
    injector.clock, injector.hide_s = clock, 30.0
    fleet = world.fleet_with_faults(injector)
    token = f"lost-{next(_tokens)}"

    outcome = fleet.launch("t3.micro", 2, client_token=token)

    under_token = {i["InstanceId"] for i in world.instances(**{"tag:broker:client-token": token})}
    assert outcome.ok and outcome.attempts == 2 and not outcome.reused
    assert set(outcome.instance_ids) == under_token and len(under_token) == 2
    assert [i.kind for i in injector.log][:2] == [FaultKind.LOST_RESPONSE, FaultKind.EVENTUAL]
    assert injector.injected(FaultKind.IDEMPOTENT)


def test_new_instances_are_hidden_and_refused_until_ec2_catches_up(world: World) -> None:
    clock = _Clock()
    injector = FaultInjector.scripted({})
    injector.clock, injector.hide_s = clock, 30.0
    client = injector.attach(world.account.session.client("ec2"))
    old = _ids(_run_raw(client, world))
    clock.now += 31.0
    new = _ids(_run_raw(client, world))

    assert _listed(client, world) == set(old)  # the new one is not listed yet, the old one is
    with pytest.raises(ClientError) as caught:
        client.terminate_instances(InstanceIds=new)
    assert caught.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"
    assert world.state_of(new[0]) == "running"  # refused: nothing happened
    clock.now += 29.0
    assert _listed(client, world) == set(old)
    clock.now += 1.5
    assert _listed(client, world) == set(old) | set(new)
    client.terminate_instances(InstanceIds=new)
    assert world.state_of(new[0]) in ("shutting-down", "terminated")
    # Logged once per instance and operation, not at every describe.
    assert sorted(i.operation for i in injector.injected(FaultKind.EVENTUAL)) == [
        "DescribeInstances", "TerminateInstances"]


def test_the_fleet_never_calls_a_hidden_instance_terminated(world: World) -> None:
    clock = _Clock()
    injector = FaultInjector.scripted({})
    injector.clock, injector.hide_s = clock, 30.0
    fleet = world.fleet_with_faults(injector)
    launched = fleet.launch("t3.micro", 1, client_token=f"hide-{next(_tokens)}")

    refused = fleet.terminate(launched.instance_ids)
    assert refused.terminated == () and refused.already_terminated == ()
    assert world.state_of(launched.instance_ids[0]) == "running"
    clock.now += 30.0
    done = fleet.terminate(launched.instance_ids)
    assert done.terminated == launched.instance_ids


def test_a_stuck_launch_stays_pending_until_terminated(world: World) -> None:
    injector = FaultInjector.scripted({"RunInstances": [FaultKind.STUCK_PENDING]})
    fleet = world.fleet_with_faults(injector)
    stuck = fleet.launch("t3.micro", 2, client_token=f"stuck-{next(_tokens)}")
    fine = fleet.launch("t3.micro", 1, client_token=f"fine-{next(_tokens)}")

    states = {r.id: r.state.value for r in fleet.describe().instances}
    assert {states[i] for i in stuck.instance_ids} == {"pending"}
    assert states[fine.instance_ids[0]] == "running"
    waited = fleet.wait_running([*stuck.instance_ids, *fine.instance_ids], timeout_s=1.0, poll_s=1.0)
    assert set(waited.not_running) == set(stuck.instance_ids) and waited.failure is not None
    assert fleet.terminate(stuck.instance_ids).terminated == stuck.instance_ids
    assert {r.state.value for r in fleet.describe().instances if r.id in stuck.instance_ids} <= {
        "shutting-down", "terminated"}
    assert [i.kind for i in injector.log].count(FaultKind.STUCK_PENDING) == 3  # the launch, then each instance once


def test_an_outage_fails_every_call_from_the_first_launch_for_its_duration(world: World) -> None:
    clock = _Clock()
    injector = FaultInjector.scripted({})
    injector.clock = clock
    injector.outage(600.0)
    client = injector.attach(world.account.session.client("ec2"))

    client.describe_instances()  # before any launch: EC2 answers
    with pytest.raises(EndpointConnectionError):
        _run_raw(client, world)
    clock.now += 599.0
    with pytest.raises(EndpointConnectionError):
        client.describe_instances()
    clock.now += 1.0
    client.describe_instances()
    _run_raw(client, world)
    assert len(world.of_run()) == 1
    assert [(i.operation, i.kind) for i in injector.log] == [("RunInstances", FaultKind.OUTAGE),
                                                            ("DescribeInstances", FaultKind.OUTAGE)]


def test_settings_are_not_scheduled_faults() -> None:
    for kind in (FaultKind.EVENTUAL, FaultKind.OUTAGE, FaultKind.IDEMPOTENT):
        with pytest.raises(ValueError, match="setting"):
            FaultInjector.scripted({"RunInstances": [kind]})


def test_a_spec_sets_durations_and_counts_stuck_launches() -> None:
    entries = parse_fault_spec("eventual:30,outage:10m,stuck_pending:c5.large:2")
    injector = SpecFaultInjector(entries)
    assert injector.hide_s == 30.0 and injector._outage_s == 600.0
    assert [(e.kind, e.target, e.times) for e in entries][2] == (FaultKind.STUCK_PENDING, "c5.large", 2)
    for bad in ("eventual", "eventual:soon", "outage:0", "outage:c5.large:3"):
        with pytest.raises(ValueError, match="SECONDS"):
            parse_fault_spec(bad)
