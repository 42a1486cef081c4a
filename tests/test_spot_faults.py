"""The dry run's spot interrupter against moto in-process: a notice on the fake metadata
endpoint, then EC2's termination with Server.SpotInstanceTermination, each logged; on-demand
instances and instances the broker released first are left alone."""

from __future__ import annotations

import time

import pytest

from broker.config.aws import AwsSettings
from broker.shells.aws import Ec2Fleet
from broker.shells.fake_imds import FakeMetadata
from broker.shells.faults import FaultKind, SpecFaultInjector, parse_fault_spec
from broker.shells.moto_world import mock_ec2
from broker.shells.spot_faults import NOTICE_S, SpotInterrupter, spot_rates
from tests.test_agent import wait_until as wait_for
from workers.imds import MetadataClient


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world():
    with mock_ec2(AwsSettings(region="us-east-1"), "spot-test") as (client, settings), FakeMetadata() as metadata:
        entries = parse_fault_spec("spot_interrupt:c5.large:3600")  # a notice within seconds of run time
        injector = SpecFaultInjector(entries)
        injector.attach(client)
        clock = Clock()
        interrupter = SpotInterrupter(spot_rates(entries), injector, client, metadata, clock, time_scale=60.0,
                                      seed=1, poll_s=0.01).attach(client)
        try:
            yield Ec2Fleet(client, settings, "spot-test"), injector, interrupter, metadata, clock
        finally:
            interrupter.close()


def test_a_spot_instance_gets_its_notice_then_is_taken_back(world):
    fleet, injector, interrupter, metadata, clock = world
    spot = fleet.launch("c5.large@spot", 1, client_token="spot-test-1").instances[0].id
    on_demand = fleet.launch("c5.large", 1, client_token="spot-test-2").instances[0].id
    assert interrupter.is_spot(spot) and not interrupter.is_spot(on_demand)
    clock.now += 3600.0  # far past any draw at 3600 an hour
    assert wait_for(lambda: metadata.noticed(spot))
    document = MetadataClient(metadata.base_url(spot)).instance_action()
    assert document["action"] == "terminate"
    assert {r.id: r.state.value for r in fleet.describe().instances}[spot] == "running"  # two minutes left
    clock.now += NOTICE_S
    assert wait_for(lambda: any(r.id == spot and r.interrupted for r in fleet.describe().instances))
    records = {r.id: r for r in fleet.describe().instances}
    assert records[spot].state.gone and records[spot].type_name == "c5.large@spot"
    assert not records[on_demand].state.gone and not metadata.noticed(on_demand)
    assert wait_for(lambda: len(injector.injected(FaultKind.SPOT_INTERRUPT)) == 2)  # logged once done
    details = [i.detail for i in injector.injected(FaultKind.SPOT_INTERRUPT)]
    assert len(details) == 2 and "notice posted" in details[0] and "terminated by EC2" in details[1]
    assert all(spot in d for d in details)


def test_an_instance_released_before_its_notice_is_left_alone(world):
    fleet, injector, interrupter, metadata, clock = world
    spot = fleet.launch("c5.large@spot", 1, client_token="spot-test-3").instances[0].id
    assert fleet.terminate([spot]).terminated == (spot,)
    clock.now += 3600.0
    time.sleep(0.3)  # the interrupter polls every 10 ms: it has looked many times
    assert not metadata.noticed(spot)
    assert injector.injected(FaultKind.SPOT_INTERRUPT) == []
    assert not any(r.interrupted for r in fleet.describe().instances)


def test_a_resumed_dry_run_still_interrupts_the_spot_instances_launched_before_it(world):
    """A resume builds a new interrupter; it used to learn only of RunInstances it saw, so the
    spot instances launched before the daemon died were never taken back."""
    fleet, injector, first, metadata, clock = world
    first.close()  # the daemon died
    spot = fleet.launch("c5.large@spot", 1, client_token="spot-test-4").instances[0].id
    entries = parse_fault_spec("spot_interrupt:c5.large:3600")
    resumed = SpotInterrupter(spot_rates(entries), injector, first.client, metadata, clock, time_scale=60.0,
                              seed=2, poll_s=0.01).attach(first.client)
    try:
        assert resumed.is_spot(spot)
        clock.now += 3600.0 + NOTICE_S
        assert wait_for(lambda: metadata.noticed(spot))
        clock.now += NOTICE_S
        assert wait_for(lambda: any(r.id == spot and r.interrupted for r in fleet.describe().instances))
    finally:
        resumed.close()


def test_the_spot_fault_spec_is_checked_and_names_the_spot_offer():
    (entry,) = parse_fault_spec("spot_interrupt:c5.large:6")
    assert (entry.kind, entry.target, entry.rate) == (FaultKind.SPOT_INTERRUPT, "c5.large@spot", 6.0)
    assert parse_fault_spec("spot_interrupt:m5.large@spot:0.5")[0].target == "m5.large@spot"
    for bad in ("spot_interrupt", "spot_interrupt:c5.large", "spot_interrupt:c5.large:x", "spot_interrupt:c5.large:0",
                "spot_interrupt:c5.large:-1"):
        with pytest.raises(ValueError, match="spot_interrupt"):
            parse_fault_spec(bad)
    # a capacity fault on the spot offer matches its launches only, by the offer tag
    (capacity,) = parse_fault_spec("insufficient_capacity:c5.large@spot")
    spot = {"InstanceType": "c5.large", "TagSpecifications": [
        {"ResourceType": "instance", "Tags": [{"Key": "broker:offer", "Value": "c5.large@spot"}]}]}
    on_demand = {"InstanceType": "c5.large", "TagSpecifications": [
        {"ResourceType": "instance", "Tags": [{"Key": "broker:offer", "Value": "c5.large"}]}]}
    assert capacity.matches("RunInstances", spot) and not capacity.matches("RunInstances", on_demand)
