"""The inventory file: where tasks can run (private nodes) and what can be rented (EC2 types).

Schema (every key but the marked ones optional)::

    private:                      # nodes you own
      - name: lab-a               # required, unique
        local: true               # this machine; or host: (then user, key, port; port 22)
        slots: 2                  # required, integer >= 1
        speed: 1.0                # > 0 reference seconds per second, default 1
        cost_per_hour: 0          # USD >= 0, default 0
        known_hosts: ~/.ssh/known_hosts   # SSH nodes: the file holding the node's host key
        grace: 10m                # a node that stops answering keeps its tasks this long
                                  # while the broker reconnects; then they are re-queued.
                                  # A node that does not answer at start is tried this long
        lease: 1h                 # the node's agent cancels its tasks and exits after this
                                  # long without a broker (a crash nobody resumed)
        keep: 0s                  # how long a finished run's state stays on the node
                                  # (~/.broker/runs/<run>/) once its results are safe
    aws:
      region, ami, key_name, security_group, subnet, instance_profile: strings
      tags: {key: value}          # extra tags on every instance, string values
      billing: hourly | per-second | {unit: 1h, minimum: 60s}     # default hourly
      user: ec2-user              # SSH login on the instances (the AMI's default user)
      key: ~/.ssh/broker.pem      # private key of key_name (`broker run` needs it to rent)
      address: public             # public | private: the IP used to reach an instance
      host_key_policy: console    # console | known-hosts | accept-new (see broker/shells/nodes.py)
      known_hosts: ~/.ssh/known_hosts   # the file checked under known-hosts
      ssh_port: 22
      ssh_timeout: 5m             # boot done -> agent attached, else the instance is released
      agent_dir: ~/.broker        # on the instances: agent/ (shipped), runs/<run>/<id>/ (state)
      user_data: deploy/user-data.sh   # a file passed to every launch as EC2 user-data (<= 16 KB);
                                  # relative to the inventory's directory
      types:
        - name: c5.xlarge         # required, unique
          slots: 4                # required, integer >= 1
          speed: 5                # required, > 0
          price: 0.17             # required, USD per hour >= 0
          limit: 20               # required, integer >= 0: most instances running at once
          boot: 90s               # launch to ready, default 0
          pending_timeout: 10m    # still pending in EC2 this long after launch: terminated and
                                  # counted as a launch failure of the type (default 10m)
          billing: ...            # overrides aws.billing for this type
        - name: c5.xlarge         # the same EC2 type once more, on the spot market
          market: spot            # on-demand (default) | spot; the broker calls it c5.xlarge@spot
          price: 0.05             # the spot price the plan counts on (USD per hour), and/or
          max_price: 0.08         # the cap sent to EC2 (default: EC2's, the on-demand price);
                                  # with max_price alone the plan counts on the cap
          interruptions_per_hour: 0.05   # rate of interruptions per running instance, or
          interruption_bucket: "<5%"     # the Spot Instance Advisor's monthly bucket:
                                  # <5%, 5-10%, 10-15%, 15-20%, >20% (see SPOT_BUCKETS)
          slots: 4, speed: 5, limit: 20, boot: 90s   # as above; billing defaults to
                                  # per-second, as EC2 bills spot

Two entries of ``aws.types`` may share a ``name`` only if one is on-demand and one spot.

An inventory of types alone is enough to plan and simulate. ``live=True`` (a real run)
additionally demands the AWS connection fields ``region``, ``ami``, ``key_name`` and
``security_group`` when any type is declared (``rents=False``: a run that will not rent,
see ``broker/core/rent.py``, is not asked for them), and checks that every SSH key file
exists and is readable by its owner only, as ``ssh`` itself insists, and that every
``known_hosts`` file exists. Relative key and ``known_hosts`` paths are taken from ``base``
(default: the current directory), so a command run elsewhere later (``broker down``) can
read the inventory as the run did.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from broker.core.billing import Billing
from broker.core.model import MARKETS, ON_DEMAND, SPOT, Inventory, MachineType, PrivateNode, spot_key

from .aws import AwsSettings
from .errors import ConfigError, Problem
from .fields import Checker, join, suggestion
from .yamlsource import Node, load_yaml

_LIVE_AWS_FIELDS = ("region", "ami", "key_name", "security_group")
_OPTIONAL_AWS_FIELDS = ("subnet", "instance_profile")
_SSH_AWS_FIELDS = (
    "user", "key", "address", "host_key_policy", "known_hosts", "ssh_port", "ssh_timeout", "agent_dir",
)
_ADDRESSES = ("public", "private")
_HOST_KEY_POLICIES = ("console", "known-hosts", "accept-new")
_BILLING_NAMES = {"hourly": Billing.hourly, "per-second": Billing.per_second}


def load_inventory(path: str | os.PathLike[str], *, live: bool = False, rents: bool = True,
                   base: str | os.PathLike[str] | None = None) -> Inventory:
    """Read and validate the inventory at ``path``; :class:`ConfigError` lists every problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(source, None, "inventory file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(source, None, f"cannot read the inventory file: {exc}")]) from None
    return parse_inventory(text, source, live=live, rents=rents, base=base)


def parse_inventory(text: str, source: str = "<inventory>", *, live: bool = False, rents: bool = True,
                    base: str | os.PathLike[str] | None = None) -> Inventory:
    """Validate inventory YAML ``text``; ``source`` names it in messages and in ``Inventory.source``."""
    root = load_yaml(text, source)
    check = Checker(source)
    check.base = base  # relative key and known_hosts paths are taken from here
    top = check.mapping(root, "", optional=("private", "aws")) or {}
    private = _private_nodes(check, top.get("private"), live)
    aws, types = _aws_section(check, top.get("aws"), live and rents)
    for clash in sorted({n.name for n in private} & {t.name for t in types}):
        check.problem(None, f"the name '{clash}' is used by a private node and an EC2 type; names must differ", None)
    if not check.problems and not private and not types:
        check.problem(None, "the inventory declares no private nodes and no EC2 types: nothing could run a task", None)
    check.raise_if_any()
    return Inventory(private=tuple(private), types=tuple(types), aws=aws, source=source)


def _check_unique_names(check: Checker, items: tuple[Node, ...], path: str, what: str) -> None:
    """Report every item whose ``name`` repeats an earlier one's, citing both lines."""
    first_line: dict[str, int] = {}
    for index, item in enumerate(items):
        name_node = item.value.get("name") if item.is_mapping else None
        if name_node is None or not isinstance(name_node.value, str):
            continue
        name = name_node.value
        if name in first_line:
            check.problem(
                join(join(path, index), "name"),
                f"duplicate {what} name '{name}' (first used on line {first_line[name]})",
                name_node.where,
            )
        else:
            first_line[name] = name_node.where


# -- private nodes ------------------------------------------------------------------------
def _private_nodes(check: Checker, node: Node | None, live: bool) -> list[PrivateNode]:
    items = check.sequence(node, "private") or ()
    _check_unique_names(check, items, "private", "private node")
    parsed = (_private_node(check, item, join("private", index), live) for index, item in enumerate(items))
    return [p for p in parsed if p is not None]


def _private_node(check: Checker, item: Node, path: str, live: bool) -> PrivateNode | None:
    fields = check.mapping(
        item,
        path,
        required=("name", "slots"),
        optional=("local", "host", "user", "key", "port", "speed", "cost_per_hour", *_AGENT_FIELDS),
    )
    if fields is None:
        return None
    before = len(check.problems)
    name = check.string(fields["name"], join(path, "name")) if "name" in fields else None
    slots = check.integer(fields["slots"], join(path, "slots"), minimum=1) if "slots" in fields else None
    speed = check.number(fields["speed"], join(path, "speed"), positive=True) if "speed" in fields else 1.0
    cost = (
        check.number(fields["cost_per_hour"], join(path, "cost_per_hour"), minimum=0)
        if "cost_per_hour" in fields
        else 0.0
    )
    local = check.boolean(fields["local"], join(path, "local")) if "local" in fields else False
    host = check.string(fields["host"], join(path, "host")) if "host" in fields else None
    user = check.string(fields["user"], join(path, "user")) if "user" in fields else None
    port = check.integer(fields["port"], join(path, "port"), minimum=1, maximum=65535) if "port" in fields else 22
    key = _key_path(check, fields["key"], join(path, "key"), live) if "key" in fields else None
    agent = _agent_fields(check, fields, path, live)

    ssh_fields = [k for k in ("host", "user", "key", "port", "known_hosts") if k in fields]
    if local and "host" in fields:
        check.problem(join(path, "host"), "give either local: true or host, not both", fields["host"].where)
    elif local and ssh_fields:
        check.problem(
            join(path, ssh_fields[0]),
            f"{', '.join(ssh_fields)} only apply to SSH nodes (this one is local: true)",
            fields[ssh_fields[0]].where,
        )
    elif not local and "host" not in fields and "local" not in fields:
        check.problem(path, "a private node needs host: (reached over SSH) or local: true", item.line)
    elif not local and "host" not in fields:
        check.problem(join(path, "local"), "local: false needs a host: to reach the node over SSH", fields["local"].where)
    elif not local and "key" not in fields:
        # Without it the node validated, then was lost at run time ("has no key to log in
        # with", in a JSON line only). `user` may be left out: ssh's default, the local login.
        check.problem(join(path, "key"), f"an SSH node needs key: (the private key file that logs in to "
                      f"{host or 'its host'}; user: defaults to your login name here)", item.line)

    if len(check.problems) > before or name is None or slots is None:
        return None
    return PrivateNode(
        name=name,
        slots=slots,
        speed=speed,
        cost_per_hour=cost,
        local=bool(local),
        host=host,
        user=user,
        key=key,
        port=port,
        **agent,
    )


_AGENT_FIELDS = ("known_hosts", "grace", "lease", "keep")


def _agent_fields(check: Checker, fields: dict[str, Node], path: str, live: bool) -> dict[str, object]:
    """A private node's ``known_hosts`` (must exist for a live run), ``grace``, ``lease`` (longer
    than the grace: an agent must not give up on a broker that still waits for it) and ``keep``."""
    out: dict[str, object] = {}
    if "known_hosts" in fields:
        node = fields["known_hosts"]
        text = check.string(node, join(path, "known_hosts"), what="a path to a known_hosts file")
        if text is not None:
            known = _local_path(check, text)
            if live and "host" in fields and not os.path.isfile(known):
                check.problem(join(path, "known_hosts"), f"known_hosts file not found: {known}", node.where)
            out["known_hosts"] = known
    if "grace" in fields:
        grace = check.duration(fields["grace"], join(path, "grace"))
        if grace is not None:
            out["grace_s"] = grace
    if "lease" in fields:
        lease = check.duration(fields["lease"], join(path, "lease"), positive=True)
        if lease is not None:
            out["lease_s"] = lease
    defaults = PrivateNode(name="", slots=1)
    grace_s = float(out.get("grace_s", defaults.grace_s))  # type: ignore[arg-type]
    lease_s = float(out.get("lease_s", defaults.lease_s))  # type: ignore[arg-type]
    if ("grace" in fields or "lease" in fields) and lease_s <= grace_s:
        where = fields["lease"] if "lease" in fields else fields["grace"]
        check.problem(join(path, "lease"), f"the lease ({lease_s:g} s) must be longer than the grace "
                      f"({grace_s:g} s): the node's agent would stop its tasks while the broker still "
                      "waits for the node", where.where)
    if "keep" in fields:
        keep = check.duration(fields["keep"], join(path, "keep"))  # never negative
        if keep is not None:
            out["keep_s"] = keep
    return out


def _local_path(check: Checker, text: str) -> str:
    """``text`` with ``~`` expanded and, when relative, taken from the checker's base directory."""
    path = os.path.expanduser(text)
    base = getattr(check, "base", None)
    if base is not None and not os.path.isabs(path):
        path = os.path.join(os.fspath(base), path)
    return path


def _key_path(check: Checker, node: Node, path: str, live: bool) -> str | None:
    """The SSH key file with ``~`` expanded; when ``live``, it must exist and be private to its owner."""
    text = check.string(node, path, what="a path to an SSH private key")
    if text is None:
        return None
    key = _local_path(check, text)
    if not live:
        return key
    try:
        mode = os.stat(key).st_mode
    except FileNotFoundError:
        check.problem(path, f"SSH key file not found: {key}", node.where)
        return None
    except OSError as exc:
        check.problem(path, f"cannot read SSH key file {key}: {exc.strerror}", node.where)
        return None
    if not stat.S_ISREG(mode):
        check.problem(path, f"SSH key {key} is not a regular file", node.where)
        return None
    if mode & 0o077:
        check.problem(
            path,
            f"SSH key {key} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"ssh refuses such keys: run chmod 600 {key}",
            node.where,
        )
        return None
    return key


# -- AWS ----------------------------------------------------------------------------------
def _aws_section(check: Checker, node: Node | None, live: bool) -> tuple[AwsSettings, list[MachineType]]:
    fields = check.mapping(
        node,
        "aws",
        optional=(*_LIVE_AWS_FIELDS, *_OPTIONAL_AWS_FIELDS, "tags", "billing", "types", *_SSH_AWS_FIELDS,
                  "user_data"),
    )
    if fields is None:
        return AwsSettings(), []
    ssh = _aws_ssh(check, fields, live)
    strings = {
        key: check.string(fields[key], join("aws", key))
        for key in (*_LIVE_AWS_FIELDS, *_OPTIONAL_AWS_FIELDS)
        if key in fields
    }
    tags = _tags(check, fields.get("tags"))
    default_billing = _billing(check, fields["billing"], "aws.billing") if "billing" in fields else Billing.hourly()
    types = _machine_types(check, fields.get("types"), default_billing or Billing.hourly())
    if live and "types" in fields and fields["types"].is_sequence and fields["types"].value:
        where = node.where if node is not None else None
        for key in _LIVE_AWS_FIELDS:
            if key not in fields:
                check.problem(join("aws", key), f"a live run that rents EC2 instances needs aws.{key}", where)
    user_data = _user_data(check, fields["user_data"]) if "user_data" in fields else None
    return AwsSettings(tags=tags, user_data=user_data, **strings, **ssh), types


# EC2 refuses user-data over 16 KB (before its base64 encoding).
_USER_DATA_MAX_BYTES = 16 * 1024


def _user_data(check: Checker, node: Node) -> str | None:
    """The text of the ``aws.user_data`` file (a path relative to the inventory's directory)."""
    text = check.string(node, "aws.user_data", what="a path to a user-data file")
    if text is None:
        return None
    path = Path(os.path.expanduser(text))
    if not path.is_absolute():
        path = Path(check.file).parent / path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        check.problem("aws.user_data", f"user-data file not found: {path}", node.where)
        return None
    except OSError as exc:
        check.problem("aws.user_data", f"cannot read user-data file {path}: {exc.strerror}", node.where)
        return None
    if len(data) > _USER_DATA_MAX_BYTES:
        check.problem("aws.user_data", f"user-data file {path} has {len(data)} bytes; EC2 takes at most "
                      f"{_USER_DATA_MAX_BYTES}", node.where)
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        check.problem("aws.user_data", f"user-data file {path} is not UTF-8 text", node.where)
        return None


def _aws_ssh(check: Checker, fields: dict[str, Node], live: bool) -> dict[str, object]:
    """How instances are reached over SSH: login, key file, address, host-key policy, timeout."""
    out: dict[str, object] = {}
    if "user" in fields:
        out["user"] = check.string(fields["user"], "aws.user") or "ec2-user"
    if "key" in fields:
        out["key"] = _key_path(check, fields["key"], "aws.key", live)
    for key, choices in (("address", _ADDRESSES), ("host_key_policy", _HOST_KEY_POLICIES)):
        if key in fields:
            value = check.string(fields[key], join("aws", key))
            if value is not None and value not in choices:
                check.problem(join("aws", key), f"unknown value {value!r}" + suggestion(value, choices),
                              fields[key].where)
            elif value is not None:
                out[key] = value
    if "known_hosts" in fields:
        text = check.string(fields["known_hosts"], "aws.known_hosts", what="a path to a known_hosts file")
        if text is not None:
            out["known_hosts"] = os.path.expanduser(text)
    if "agent_dir" in fields:
        out["agent_dir"] = check.string(fields["agent_dir"], "aws.agent_dir", what="a directory on the instances") \
            or "~/.broker"
    if "ssh_port" in fields:
        out["ssh_port"] = check.integer(fields["ssh_port"], "aws.ssh_port", minimum=1, maximum=65535) or 22
    if "ssh_timeout" in fields:
        out["ssh_timeout_s"] = check.duration(fields["ssh_timeout"], "aws.ssh_timeout", positive=True) or 300.0
    return out


def _tags(check: Checker, node: Node | None) -> dict[str, str]:
    """Extra instance tags; keys beginning with ``aws:`` belong to AWS and are refused."""
    tags = check.string_map(node, "aws.tags", what="tag key", identifier_keys=False)
    members = node.value if node is not None and node.is_mapping else {}
    for key, member in members.items():
        if key.lower().startswith("aws:"):
            check.problem(join("aws.tags", key), "tag keys starting with 'aws:' are reserved by AWS", member.where)
    return tags or {}


def _billing(check: Checker, node: Node, path: str) -> Billing | None:
    """``hourly``, ``per-second``, or ``{unit: DURATION, minimum: DURATION}`` (minimum default 0)."""
    if isinstance(node.value, str):
        make = _BILLING_NAMES.get(node.value)
        if make is None:
            check.problem(
                path,
                f"unknown billing model '{node.value}'{suggestion(node.value, _BILLING_NAMES)}; "
                "or give {unit: ..., minimum: ...}",
                node.where,
            )
            return None
        return make()
    if not node.is_mapping:
        check.problem(path, "expected hourly, per-second or {unit: DURATION, minimum: DURATION}", node.where)
        return None
    fields = check.mapping(node, path, required=("unit",), optional=("minimum",))
    if fields is None or "unit" not in fields:
        return None
    unit_s = check.duration(fields["unit"], join(path, "unit"), positive=True)
    minimum_s = check.duration(fields["minimum"], join(path, "minimum")) if "minimum" in fields else 0.0
    if unit_s is None or minimum_s is None:
        return None
    return Billing.custom(unit_s, minimum_s)


def _machine_types(check: Checker, node: Node | None, default_billing: Billing) -> list[MachineType]:
    items = check.sequence(node, "aws.types") or ()
    _check_unique_types(check, items)
    parsed = (_machine_type(check, item, join("aws.types", index), default_billing) for index, item in enumerate(items))
    return [t for t in parsed if t is not None]


def _check_unique_types(check: Checker, items: tuple[Node, ...]) -> None:
    """An EC2 type may appear once per market; report a repeat, citing the first line."""
    first_line: dict[tuple[str, object], int] = {}
    for index, item in enumerate(items):
        fields = item.value if item.is_mapping else {}
        name_node = fields.get("name")
        if name_node is None or not isinstance(name_node.value, str):
            continue
        market_node = fields.get("market")
        market = market_node.value if market_node is not None else ON_DEMAND
        key = (name_node.value, market)
        if key in first_line:
            check.problem(join(join("aws.types", index), "name"),
                          f"duplicate EC2 type name '{name_node.value}'"
                          + (" in the spot market" if market == SPOT else "")
                          + f" (first used on line {first_line[key]})",
                          name_node.where)
        else:
            first_line[key] = name_node.where


# Spot Instance Advisor buckets: the share of a type's spot instances AWS interrupted in the
# last month. The plan counts on the bucket's upper edge (">20%" is open: taken as 50%) and
# turns it into a rate per running hour of a Poisson process, -ln(1 - share) / 730 h.
SPOT_BUCKETS = {"<5%": 0.05, "5-10%": 0.10, "10-15%": 0.15, "15-20%": 0.20, ">20%": 0.50}
_HOURS_PER_MONTH = 730.0


def bucket_rate_per_hour(bucket: str) -> float:
    """Interruptions per running hour that the plan counts on for an advisor ``bucket``."""
    return -math.log(1.0 - SPOT_BUCKETS[bucket]) / _HOURS_PER_MONTH


def _machine_type(check: Checker, item: Node, path: str, default_billing: Billing) -> MachineType | None:
    fields = check.mapping(
        item,
        path,
        required=("name", "slots", "speed", "limit"),
        optional=("price", "boot", "billing", "pending_timeout", "market", *_SPOT_FIELDS),
    )
    if fields is None:
        return None
    before = len(check.problems)
    name = check.string(fields["name"], join(path, "name")) if "name" in fields else None
    if name is not None and "@" in name:
        check.problem(join(path, "name"), f"'{name}' is not an EC2 type name ('@' is not allowed; "
                      "say market: spot for a spot offer)", fields["name"].where)
    market = _market(check, fields, path)
    spot = _spot_fields(check, fields, path, market) if market is not None else None
    slots = check.integer(fields["slots"], join(path, "slots"), minimum=1) if "slots" in fields else None
    speed = check.number(fields["speed"], join(path, "speed"), positive=True) if "speed" in fields else None
    price = check.number(fields["price"], join(path, "price"), minimum=0) if "price" in fields else None
    if price is None and market == ON_DEMAND and "price" not in fields:
        check.problem(join(path, "price"), "missing required key 'price'", item.where)
    limit = check.integer(fields["limit"], join(path, "limit"), minimum=0) if "limit" in fields else None
    boot_s = check.duration(fields["boot"], join(path, "boot")) if "boot" in fields else 0.0
    type_default = Billing.per_second() if market == SPOT else default_billing
    billing = _billing(check, fields["billing"], join(path, "billing")) if "billing" in fields else type_default
    pending_s = (check.duration(fields["pending_timeout"], join(path, "pending_timeout"), positive=True)
                 if "pending_timeout" in fields else 600.0)
    if len(check.problems) > before or None in (name, market, spot, slots, speed, limit, boot_s, billing, pending_s):
        return None
    rate, max_price = spot
    if market == SPOT and price is not None and max_price is not None and price > max_price:
        check.problem(join(path, "price"), f"price {price:g} is above max_price {max_price:g}: EC2 would never "
                      "sell at the price the plan counts on", fields["price"].where)
        return None
    return MachineType(
        name=spot_key(name) if market == SPOT else name,
        slots=slots,
        speed=speed,
        price_per_hour=price if price is not None else max_price,
        limit=limit,
        boot_s=boot_s,
        billing=billing,
        pending_timeout_s=pending_s,
        market=market,
        ec2_type=name if market == SPOT else "",
        interruptions_per_hour=rate,
        max_price_per_hour=max_price,
    )


_SPOT_FIELDS = ("max_price", "interruptions_per_hour", "interruption_bucket")


def _market(check: Checker, fields: dict[str, Node], path: str) -> str | None:
    if "market" not in fields:
        return ON_DEMAND
    node = fields["market"]
    value = check.string(node, join(path, "market"))
    if value is not None and value not in MARKETS:
        check.problem(join(path, "market"), f"unknown market {value!r}{suggestion(value, MARKETS)}; "
                      f"expected {' or '.join(MARKETS)}", node.where)
        return None
    return value


def _spot_fields(check: Checker, fields: dict[str, Node], path: str,
                 market: str) -> tuple[float, float | None] | None:
    """``(interruptions_per_hour, max_price)`` of a spot entry; ``(0, None)`` on-demand, which
    may not carry spot fields."""
    if market == ON_DEMAND:
        for key in _SPOT_FIELDS:
            if key in fields:
                check.problem(join(path, key), f"'{key}' applies to spot offers only; add market: spot",
                              fields[key].where)
        return 0.0, None
    max_price = (check.number(fields["max_price"], join(path, "max_price"), positive=True)
                 if "max_price" in fields else None)
    if "price" not in fields and "max_price" not in fields:
        check.problem(path, "a spot offer needs a price (the spot price the plan counts on) "
                      "or a max_price (the cap; the plan then counts on the cap)", None)
    has_rate, has_bucket = "interruptions_per_hour" in fields, "interruption_bucket" in fields
    if has_rate == has_bucket:
        check.problem(path, "a spot offer needs exactly one of interruptions_per_hour and "
                      f"interruption_bucket ({', '.join(SPOT_BUCKETS)})", None)
        return None
    if has_rate:
        rate = check.number(fields["interruptions_per_hour"], join(path, "interruptions_per_hour"), minimum=0)
        return None if rate is None else (rate, max_price)
    node = fields["interruption_bucket"]
    bucket = check.string(node, join(path, "interruption_bucket"))
    if bucket is None:
        return None
    if bucket not in SPOT_BUCKETS:
        check.problem(join(path, "interruption_bucket"), f"unknown bucket {bucket!r}"
                      f"{suggestion(bucket, SPOT_BUCKETS)}; expected one of {', '.join(SPOT_BUCKETS)}",
                      node.where)
        return None
    return bucket_rate_per_hour(bucket), max_price
