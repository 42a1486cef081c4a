"""Inventory loading: the example files, defaults, live checks, and a YAML round trip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config.errors import ConfigError
from broker.config.inventory import load_inventory, parse_inventory
from broker.core.billing import Billing
from broker.config.aws import AwsSettings
from broker.core.model import SPOT, spot_key, Inventory, MachineType, PrivateNode

ROOT = Path(__file__).resolve().parent.parent


def rendered(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [p.render() for p in exc.value.problems]


# -- the shipped files --------------------------------------------------------------------
def test_root_inventory_has_one_local_node_and_hourly_types_with_quick_boots():
    inventory = load_inventory(ROOT / "inventory.yaml")
    assert [(n.name, n.local, n.slots, n.speed, n.cost_per_hour) for n in inventory.private] == [
        ("local", True, 2, 1.0, 0.0)
    ]
    assert 3 <= len(inventory.types) <= 4
    assert all(t.billing == Billing.hourly() for t in inventory.types)
    assert all(3 <= t.boot_s <= 10 and t.price_per_hour > 0 and t.limit > 0 for t in inventory.types)
    # The AWS fields are placeholders, but present: the file also passes the live checks.
    live = load_inventory(ROOT / "inventory.yaml", live=True)
    assert live.aws.ami == "ami-00000000000000000"


def test_thesis_catalogue_matches_table_6_2():
    inventory = load_inventory(ROOT / "examples" / "thesis-catalogue.yaml")
    table = {(t.name, t.speed, t.price_per_hour, t.slots, t.limit, t.billing.name) for t in inventory.types}
    assert table == {
        ("m1.small", 1.0, 0.080, 1, 20, "hourly"),
        ("c1.medium", 5.0, 0.165, 1, 20, "hourly"),
        ("m1.large", 4.0, 0.320, 1, 20, "hourly"),
        ("c1.xlarge", 20.0, 0.660, 1, 20, "hourly"),
    }
    assert inventory.private == (PrivateNode(name="xeon", slots=1, speed=10.0, cost_per_hour=0.32, local=True),)


def test_per_second_catalogue_has_about_twenty_distinct_per_second_types():
    inventory = load_inventory(ROOT / "examples" / "per-second.yaml")
    assert 18 <= len(inventory.types) <= 24
    assert len({t.name for t in inventory.types}) == len(inventory.types)
    assert {t.billing for t in inventory.types} == {Billing.per_second()}
    assert inventory.private == ()


# -- defaults and forms -------------------------------------------------------------------
def test_defaults_fill_speed_cost_port_boot_and_billing():
    inventory = parse_inventory(
        """
private:
  - {name: here, local: true, slots: 3}
  - {name: there, host: example.invalid, key: /k/id, slots: 1}
aws:
  types:
    - {name: a.small, slots: 1, speed: 1, price: 0.1, limit: 2}
""",
        "inv.yaml",
    )
    assert inventory.private == (
        PrivateNode(name="here", slots=3, speed=1.0, cost_per_hour=0.0, local=True),
        PrivateNode(name="there", slots=1, host="example.invalid", key="/k/id", port=22),
    )
    (machine,) = inventory.types
    assert machine.boot_s == 0.0 and machine.billing == Billing.hourly()
    assert inventory.aws == AwsSettings()
    assert inventory.source == "inv.yaml"


@pytest.mark.parametrize(
    ("section_billing", "type_billing", "expected"),
    [
        ("per-second", None, Billing.per_second()),
        ("hourly", "per-second", Billing.per_second()),
        ("{unit: 15m, minimum: 1h}", None, Billing.custom(900, 3600)),
        ("per-second", "{unit: 60}", Billing.custom(60, 0)),
    ],
)
def test_billing_section_default_and_per_type_override(section_billing, type_billing, expected):
    override = f", billing: {type_billing}" if type_billing else ""
    inventory = parse_inventory(
        f"aws:\n  billing: {section_billing}\n  types:\n"
        f"    - {{name: x, slots: 1, speed: 1, price: 1, limit: 1{override}}}\n"
    )
    assert inventory.types[0].billing == expected


def test_durations_in_boot_and_merge_keys_share_defaults():
    inventory = parse_inventory(
        """
aws:
  types:
    - &common {name: a, slots: 2, speed: 1.5, price: 0.2, limit: 4, boot: 1.5m}
    - {<<: *common, name: b, price: 0.3}
"""
    )
    a, b = inventory.types
    assert (a.boot_s, b.boot_s) == (90.0, 90.0)
    assert (b.name, b.slots, b.price_per_hour) == ("b", 2, 0.3)


def test_key_path_tilde_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = parse_inventory("private:\n  - {name: n, host: h.invalid, key: ~/.ssh/id_x, slots: 1}\n")
    assert inventory.private[0].key == str(tmp_path / ".ssh" / "id_x")


# -- live checks --------------------------------------------------------------------------
LIVE_AWS = "  region: r\n  ami: ami-0\n  key_name: k\n  security_group: sg-0\n"


def _key(tmp_path: Path, mode: int) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not really a key\n")
    os.chmod(key, mode)
    return key


def test_live_accepts_a_private_key_file_and_complete_aws_fields(tmp_path):
    key = _key(tmp_path, 0o600)
    text = (
        f"private:\n  - {{name: n, host: h.invalid, user: u, key: {key}, port: 2222, slots: 4}}\n"
        f"aws:\n{LIVE_AWS}  types:\n    - {{name: t, slots: 1, speed: 1, price: 1, limit: 1}}\n"
    )
    inventory = parse_inventory(text, live=True)
    assert inventory.private[0].key == str(key) and inventory.private[0].port == 2222
    assert inventory.aws.region == "r" and inventory.aws.subnet is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_live_rejects_keys_others_can_read(tmp_path, mode):
    key = _key(tmp_path, mode)
    text = f"private:\n  - name: n\n    host: h.invalid\n    key: {key}\n    slots: 1\n"
    parse_inventory(text)  # fine for planning
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml", live=True)
    assert rendered(exc) == [
        f"inv.yaml:4: private[0].key: SSH key {key} is accessible by group or others "
        f"(mode {mode:04o}); ssh refuses such keys: run chmod 600 {key}"
    ]


def test_live_needs_no_aws_fields_when_no_type_can_be_rented():
    inventory = parse_inventory("private:\n  - {name: n, local: true, slots: 1}\n", live=True)
    assert inventory.types == ()


def test_live_lists_every_missing_aws_field_at_the_aws_key():
    text = "aws:\n  subnet: s\n  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: 1}\n"
    parse_inventory(text)
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml", live=True)
    assert rendered(exc) == [
        f"inv.yaml:1: aws.{field}: a live run that rents EC2 instances needs aws.{field}"
        for field in ("region", "ami", "key_name", "security_group")
    ]


def test_live_need_not_give_aws_fields_for_a_run_that_will_not_rent():
    text = "private:\n  - {name: n, local: true, slots: 1}\naws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: 1}\n"
    inventory = parse_inventory(text, live=True, rents=False)
    assert [t.name for t in inventory.types] == ["t"] and inventory.aws.ami is None
    with pytest.raises(ConfigError):
        parse_inventory(text, live=True)


# -- private nodes: host keys, lease, keep ----------------------------------------------------
def test_a_private_node_names_its_own_known_hosts_lease_and_keep(tmp_path):
    known = tmp_path / "lab_known_hosts"
    known.write_text("")
    text = (f"private:\n  - {{name: lab, host: h, key: k, slots: 1, known_hosts: {known}, grace: 30m, lease: 2h, "
            "keep: 1d}\n  - {name: me, local: true, slots: 1}\n")
    lab, me = parse_inventory(text, live=False).private
    assert (lab.known_hosts, lab.grace_s, lab.lease_s, lab.keep_s) == (str(known), 1800.0, 7200.0, 86400.0)
    assert (me.known_hosts, me.grace_s, me.lease_s, me.keep_s) == (None, 600.0, 3600.0, 0.0)  # the defaults


def test_a_lease_no_longer_than_the_grace_is_refused():
    with pytest.raises(ConfigError) as exc:
        parse_inventory("private:\n  - {name: lab, host: h, key: k, slots: 1, grace: 1h}\n", "inv.yaml")
    assert rendered(exc) == ["inv.yaml:2: private[0].lease: the lease (3600 s) must be longer than the grace "
                             "(3600 s): the node's agent would stop its tasks while the broker still waits for "
                             "the node"]


def test_relative_key_and_known_hosts_are_read_from_the_base_directory(tmp_path):
    text = "private:\n  - {name: lab, host: h, key: keys/k, known_hosts: keys/kh, slots: 1}\n"
    node = parse_inventory(text, base=tmp_path).private[0]
    assert (node.key, node.known_hosts) == (str(tmp_path / "keys/k"), str(tmp_path / "keys/kh"))


def test_live_refuses_a_missing_known_hosts_and_bad_lease_or_keep(tmp_path):
    key = _key(tmp_path, 0o600)
    text = (f"private:\n  - {{name: lab, host: h, key: {key}, slots: 1, known_hosts: {tmp_path}/nope, lease: 0s, "
            "keep: -1}\n"
            "  - {name: me, local: true, slots: 1, known_hosts: x}\n")
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml", live=True)
    assert rendered(exc) == [
        f"inv.yaml:2: private[0].known_hosts: known_hosts file not found: {tmp_path}/nope",
        "inv.yaml:2: private[0].lease: must be longer than 0 seconds, got the string '0s'",
        "inv.yaml:2: private[0].keep: a duration must be a finite number of seconds >= 0, got -1",
        "inv.yaml:3: private[1].known_hosts: known_hosts only apply to SSH nodes (this one is local: true)",
    ]


# -- all problems at once -----------------------------------------------------------------
def test_every_problem_is_reported_in_line_order():
    text = """\
aws:
  types:
    - name: a
      slots: 0
      speed: fast
      price: -0.1
      limit: 1
    - {name: a, slots: 1, speed: 1, price: 1, limit: 1, bot: 3s}
private:
  - {name: p, slots: 1}
"""
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml")
    assert rendered(exc) == [
        "inv.yaml:4: aws.types[0].slots: expected an integer >= 1, got 0",
        "inv.yaml:5: aws.types[0].speed: expected a number > 0, got the string 'fast'",
        "inv.yaml:6: aws.types[0].price: expected a number >= 0, got -0.1",
        "inv.yaml:8: aws.types[1].name: duplicate EC2 type name 'a' (first used on line 3)",
        "inv.yaml:8: aws.types[1].bot: unknown key 'bot' (did you mean 'boot'?)",
        "inv.yaml:10: private[0]: a private node needs host: (reached over SSH) or local: true",
    ]
    assert exc.value.render().startswith("6 problems found; nothing was started:")


def test_missing_inventory_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_inventory(tmp_path / "nope.yaml")
    assert rendered(exc) == [f"{tmp_path / 'nope.yaml'}: inventory file not found"]


# -- round trip: any valid inventory written as YAML reads back equal ---------------------
_names = st.from_regex(r"[a-z][a-z0-9]{0,6}(\.[a-z0-9]{1,6})?", fullmatch=True)
_speeds = st.floats(min_value=0.01, max_value=100, allow_nan=False)
_billings = st.sampled_from([Billing.hourly(), Billing.per_second(), Billing.custom(600, 60)])


@st.composite
def inventories(draw) -> Inventory:
    private_names = draw(st.lists(_names, max_size=3, unique=True))
    type_names = draw(st.lists(_names.filter(lambda n: n not in private_names), max_size=4, unique=True))
    if not private_names and not type_names:
        type_names = ["only.one"]
    private = tuple(
        PrivateNode(
            name=name,
            slots=draw(st.integers(1, 64)),
            speed=draw(_speeds),
            cost_per_hour=draw(st.floats(0, 5, allow_nan=False)),
            local=True,
        )
        for name in private_names
    )
    types = tuple(
        MachineType(
            name=name,
            slots=draw(st.integers(1, 96)),
            speed=draw(_speeds),
            price_per_hour=draw(st.floats(0, 30, allow_nan=False)),
            limit=draw(st.integers(0, 100)),
            boot_s=float(draw(st.integers(0, 600))),
            billing=draw(_billings),
        )
        for name in type_names
    )
    # Some of the EC2 types are offered on the spot market too, under the same name.
    spot = tuple(
        MachineType(
            name=spot_key(t.name),
            slots=t.slots,
            speed=t.speed,
            price_per_hour=draw(st.floats(0, 30, allow_nan=False)),
            limit=draw(st.integers(0, 100)),
            boot_s=t.boot_s,
            billing=draw(_billings),
            market=SPOT,
            ec2_type=t.name,
            interruptions_per_hour=draw(st.floats(0, 2, allow_nan=False)),
            max_price_per_hour=draw(st.none() | st.floats(30, 60, allow_nan=False)),
        )
        for t in types
        if draw(st.booleans())
    )
    return Inventory(private=private, types=types + spot, aws=AwsSettings(), source="<inventory>")  # as the loader sets it


def _as_yaml(inventory: Inventory) -> str:
    def billing(b: Billing) -> object:
        return b.name if b.name in ("hourly", "per-second") else {"unit": b.unit_s, "minimum": b.minimum_s}

    document = {
        "private": [
            {"name": n.name, "local": n.local, "slots": n.slots, "speed": n.speed, "cost_per_hour": n.cost_per_hour}
            for n in inventory.private
        ],
        "aws": {
            "types": [
                {
                    "name": t.instance_type,
                    **({"market": "spot", "interruptions_per_hour": t.interruptions_per_hour} if t.is_spot else {}),
                    **({"max_price": t.max_price_per_hour} if t.max_price_per_hour is not None else {}),
                    "slots": t.slots,
                    "speed": t.speed,
                    "price": t.price_per_hour,
                    "limit": t.limit,
                    "boot": f"{t.boot_s:g}s",
                    "billing": billing(t.billing),
                }
                for t in inventory.types
            ]
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


@settings(max_examples=60, deadline=None)
@given(inventories())
def test_any_valid_inventory_round_trips_through_yaml(inventory):
    assert parse_inventory(_as_yaml(inventory)) == inventory


def test_unquoted_exponent_is_a_number_but_a_quoted_one_stays_text():
    text = "aws:\n  types:\n    - {{name: t, slots: 1, speed: 1, price: {price}, limit: 1}}\n"
    assert parse_inventory(text.format(price="17e-2")).types[0].price_per_hour == pytest.approx(0.17)
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text.format(price="'17e-2'"), "inv.yaml")
    assert rendered(exc) == ["inv.yaml:3: aws.types[0].price: expected a number >= 0, got the string '17e-2'"]


def test_an_ssh_node_without_a_key_is_refused_by_name():
    """Regression: an SSH node with no key passed validate and run, then was lost at run time
    with a JSON-only message ("has no key to log in with")."""
    with pytest.raises(ConfigError) as info:
        parse_inventory("private:\n  - {name: lab, host: lab.invalid, user: alice, slots: 2}\n", "inv.yaml")
    assert [(p.line, p.field) for p in info.value.problems] == [(2, "private[0].key")]
    assert "an SSH node needs key:" in info.value.render()
    # user may be left out: ssh's default, the local login name
    assert parse_inventory("private:\n  - {name: lab, host: lab.invalid, key: /k/id, slots: 2}\n").private[0].user is None
