"""Spot offers in the inventory (issue 21, part 1): validated like every other field."""

from __future__ import annotations

import math

import pytest

from broker.config.errors import ConfigError
from broker.config.inventory import SPOT_BUCKETS, bucket_rate_per_hour, parse_inventory
from broker.core.billing import Billing
from broker.core.model import SPOT


def _inv(*entries: str) -> str:
    return "aws:\n  billing: hourly\n  types:\n" + "".join(f"    - {{{e}}}\n" for e in entries)


OD = "name: c5.xlarge, slots: 4, speed: 5, price: 0.17, limit: 20, boot: 90s"
SPOT_ENTRY = "name: c5.xlarge, market: spot, slots: 4, speed: 5, price: 0.05, limit: 10, interruptions_per_hour: 0.05"


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml")
    return [p.render() for p in exc.value.problems]


def test_a_type_offered_on_both_markets_becomes_two_offers_with_distinct_keys():
    inv = parse_inventory(_inv(OD, SPOT_ENTRY))
    od, spot = inv.types
    assert (od.name, od.market, od.instance_type, od.is_spot) == ("c5.xlarge", "on-demand", "c5.xlarge", False)
    assert (spot.name, spot.market, spot.instance_type, spot.is_spot) == ("c5.xlarge@spot", SPOT, "c5.xlarge", True)
    assert spot.interruptions_per_hour == 0.05 and spot.price_per_hour == 0.05
    assert od.billing == Billing.hourly()  # aws.billing applies to on-demand
    assert spot.billing == Billing.per_second()  # EC2 bills spot per second


def test_a_spot_offer_may_override_its_billing():
    inv = parse_inventory(_inv(SPOT_ENTRY + ", billing: hourly"))
    assert inv.types[0].billing == Billing.hourly()


def test_max_price_alone_is_the_price_the_plan_counts_on():
    entry = "name: m5.large, market: spot, slots: 2, speed: 1, max_price: 0.04, limit: 3, interruptions_per_hour: 0.2"
    t = parse_inventory(_inv(entry)).types[0]
    assert (t.price_per_hour, t.max_price_per_hour) == (0.04, 0.04)


def test_bucket_becomes_a_poisson_rate_from_its_upper_edge():
    entry = "name: m5.large, market: spot, slots: 2, speed: 1, price: 0.03, limit: 3, interruption_bucket: '10-15%'"
    t = parse_inventory(_inv(entry)).types[0]
    assert t.interruptions_per_hour == pytest.approx(-math.log(0.85) / 730)
    # A monthly share s means P(no interruption in 730 h) = 1 - s under the rate.
    for bucket, share in SPOT_BUCKETS.items():
        assert math.exp(-bucket_rate_per_hour(bucket) * 730) == pytest.approx(1 - share)


def test_the_same_type_twice_in_one_market_is_refused_citing_the_first_line():
    problems = _problems(_inv(OD, SPOT_ENTRY, SPOT_ENTRY))
    assert problems == ["inv.yaml:6: aws.types[2].name: duplicate EC2 type name 'c5.xlarge' in the spot market "
                        "(first used on line 5)"]


@pytest.mark.parametrize("entry, expected", [
    ("name: a, market: spot, slots: 1, speed: 1, limit: 1, interruptions_per_hour: 0.1",
     "a spot offer needs a price"),
    ("name: a, market: spot, slots: 1, speed: 1, price: 1, limit: 1",
     "needs exactly one of interruptions_per_hour and interruption_bucket"),
    ("name: a, market: spot, slots: 1, speed: 1, price: 1, limit: 1, interruptions_per_hour: 0.1, "
     "interruption_bucket: '<5%'", "needs exactly one of interruptions_per_hour and interruption_bucket"),
    ("name: a, market: spot, slots: 1, speed: 1, price: 1, limit: 1, interruption_bucket: '6%'",
     "unknown bucket '6%'"),
    ("name: a, market: spot, slots: 1, speed: 1, price: 1, limit: 1, interruptions_per_hour: -1",
     "interruptions_per_hour: expected a number >= 0"),
    ("name: a, market: spot, slots: 1, speed: 1, price: 0.5, max_price: 0.4, limit: 1, interruptions_per_hour: 0",
     "price 0.5 is above max_price 0.4"),
    ("name: a, market: spots, slots: 1, speed: 1, price: 1, limit: 1", "unknown market 'spots' (did you mean"),
    ("name: a, slots: 1, speed: 1, price: 1, limit: 1, interruptions_per_hour: 0.1",
     "'interruptions_per_hour' applies to spot offers only; add market: spot"),
    ("name: a, slots: 1, speed: 1, limit: 1", "aws.types[0].price: missing required key 'price'"),
    ("name: a@spot, market: spot, slots: 1, speed: 1, price: 1, limit: 1, interruptions_per_hour: 0",
     "'a@spot' is not an EC2 type name"),
])
def test_bad_spot_fields_are_reported_clearly(entry, expected):
    problems = _problems(_inv(entry))
    assert any(expected in p for p in problems), problems
