"""Spot launches at the EC2 edge (issue 21, part 3), against moto: the market options, the
offer key carried in a tag and read back, interruptions told apart from our own terminations,
spot capacity errors classified as capacity, and the IAM policy and preflight on EC2's names."""

from __future__ import annotations

from typing import Any

from broker.config.inventory import parse_inventory
from broker.shells.aws import Ec2Fleet, InstanceState, LaunchErrorKind, kind_of_code
from broker.shells.aws.fleet import OFFER_TAG, _record, offer_of
from broker.shells.aws.iam import iam_policy
from broker.shells.aws.records import SPOT_TERMINATION
from tests.test_aws_fleet import World, account, world  # noqa: F401 - fixtures

SPOT_INVENTORY = """aws:
  region: us-east-1
  billing: hourly
  types:
    - {name: c5.xlarge, slots: 4, speed: 5, price: 0.17, limit: 20, boot: 90s}
    - {name: c5.xlarge, market: spot, slots: 4, speed: 5, max_price: 0.06, limit: 10, interruptions_per_hour: 0.05}
    - {name: m5.large, market: spot, slots: 2, speed: 2, price: 0.03, limit: 4, interruptions_per_hour: 0.2}
"""


def _sent(fleet: Ec2Fleet) -> list[dict[str, Any]]:
    """The RunInstances parameters the fleet sends, as botocore builds them."""
    sent: list[dict[str, Any]] = []
    fleet._ec2.meta.events.register("provide-client-params.ec2.RunInstances",
                                    lambda params, **_: sent.append(dict(params)))
    return sent


def test_a_spot_offer_launches_its_ec2_type_on_the_spot_market_and_is_described_by_its_key(world: World) -> None:
    fleet = world.fleet(client=world.account.session.client("ec2"))
    sent = _sent(fleet)
    outcome = fleet.launch("c5.xlarge@spot", 2, client_token=f"{world.run_id}-1", max_price_per_hour=0.06)
    assert outcome.failure is None and len(outcome.instances) == 2
    assert {r.type_name for r in outcome.instances} == {"c5.xlarge@spot"}
    params = sent[0]
    assert params["InstanceType"] == "c5.xlarge"
    assert params["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.06"}}
    assert params["ClientToken"] == f"{world.run_id}-1"
    for instance in world.of_run():
        assert instance["InstanceType"] == "c5.xlarge"
        assert instance.get("InstanceLifecycle") == "spot"  # moto launched them on the spot market
        assert {t["Key"]: t["Value"] for t in instance["Tags"]}[OFFER_TAG] == "c5.xlarge@spot"
    assert {r.type_name for r in fleet.describe().instances} == {"c5.xlarge@spot"}
    # The same token again is the same launch (found by its tag), with the same key.
    again = fleet.launch("c5.xlarge@spot", 2, client_token=f"{world.run_id}-1", max_price_per_hour=0.06)
    assert again.reused and again.instance_ids == outcome.instance_ids and again.failure is None


def test_an_on_demand_launch_asks_for_no_market_options(world: World) -> None:
    fleet = world.fleet(client=world.account.session.client("ec2"))
    sent = _sent(fleet)
    outcome = fleet.launch("c5.xlarge", 1, client_token=f"{world.run_id}-od")
    assert outcome.failure is None and outcome.instances[0].type_name == "c5.xlarge"
    assert "InstanceMarketOptions" not in sent[0]
    assert world.of_run()[0].get("InstanceLifecycle") != "spot"


def test_a_spot_launch_without_a_cap_leaves_the_price_to_ec2(world: World) -> None:
    fleet = world.fleet(client=world.account.session.client("ec2"))
    sent = _sent(fleet)
    fleet.launch("m5.large@spot", 1, client_token=f"{world.run_id}-nocap")
    assert "MaxPrice" not in sent[0]["InstanceMarketOptions"]["SpotOptions"]


def test_offer_keys_split_into_the_ec2_type_and_the_market() -> None:
    assert offer_of("c5.xlarge@spot") == ("c5.xlarge", True)
    assert offer_of("c5.xlarge") == ("c5.xlarge", False)


def test_an_instance_ec2_took_back_is_told_from_one_we_terminated() -> None:
    base = {"InstanceId": "i-1", "InstanceType": "c5.xlarge", "LaunchTime": __import__("datetime").datetime(2026, 1, 1),
            "State": {"Name": "terminated"}, "Tags": [{"Key": OFFER_TAG, "Value": "c5.xlarge@spot"}]}
    taken = _record({**base, "StateReason": {"Code": SPOT_TERMINATION, "Message": "Server.SpotInstanceTermination"}})
    ours = _record({**base, "StateReason": {"Code": "Client.UserInitiatedShutdown", "Message": ""}})
    assert taken.interrupted and not ours.interrupted
    assert taken.state is InstanceState.TERMINATED and taken.type_name == "c5.xlarge@spot"
    untagged = _record({**base, "Tags": []})
    assert untagged.type_name == "c5.xlarge" and not untagged.interrupted


def test_spot_capacity_errors_cool_the_type_down_like_capacity_errors() -> None:
    from broker.core.control.ledger.ledger import AVOID_KINDS

    for code in ("InsufficientInstanceCapacity", "SpotMaxPriceTooLow"):
        assert kind_of_code(code) is LaunchErrorKind.CAPACITY, code
    assert kind_of_code("MaxSpotInstanceCountExceeded") is LaunchErrorKind.LIMIT  # the spot quota
    for code in ("InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"):
        assert kind_of_code(code).value in AVOID_KINDS, code  # the type cools down either way


def test_the_iam_policy_names_ec2_types_and_lets_run_instances_make_spot_requests() -> None:
    inventory = parse_inventory(SPOT_INVENTORY, "inv.yaml")
    statements = {s["Sid"]: s for s in iam_policy(inventory)["Statement"]}
    launch = statements["LaunchOnlyTaggedInstancesOfTheInventorysTypes"]
    assert launch["Condition"]["StringEquals"]["ec2:InstanceType"] == ["c5.xlarge", "m5.large"]
    spot = statements["LaunchSpotInstancesThroughRunInstances"]
    assert spot["Action"] == "ec2:RunInstances" and spot["Resource"] == ["arn:aws:ec2:us-east-1:*:spot-instances-request/*"]
    on_demand_only = parse_inventory(SPOT_INVENTORY.split("    - {name: c5.xlarge, market")[0], "inv.yaml")
    assert "LaunchSpotInstancesThroughRunInstances" not in {s["Sid"] for s in iam_policy(on_demand_only)["Statement"]}
