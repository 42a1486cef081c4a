"""Fault injection for an EC2 client: the failures moto does not emulate, on demand.

moto never runs out of capacity, never throttles and never loses a response; EC2 does all
three. A :class:`FaultInjector` attached to a boto3 EC2 client (moto's, in tests and the
dry-run) makes chosen calls fail the way EC2 would:

====================  ==============================================================
``CAPACITY``          RunInstances fails with ``InsufficientInstanceCapacity``
``LIMIT``             RunInstances fails with ``InstanceLimitExceeded``
``VCPU_LIMIT``        RunInstances fails with ``VcpuLimitExceeded``
``THROTTLE``          any call fails with ``RequestLimitExceeded``
``READ_TIMEOUT``      any call times out before EC2 sees it (nothing happened)
``LOST_RESPONSE``     any call is carried out, then its response is lost (read timeout):
                      the case that makes a naive retry launch twice
``PARTIAL``           RunInstances launches ``count // 2`` instances instead of ``count``
                      (only when ``count >= 2``; with one instance asked it is not injected)
``STUCK_PENDING``     the instances a RunInstances launches stay ``pending`` in every
                      DescribeInstances answer until they are terminated
``EVENTUAL``          (a setting, :attr:`FaultInjector.hide_s`) new instances are hidden
                      from DescribeInstances and refused by TerminateInstances
                      (``InvalidInstanceID.NotFound``) for that long after RunInstances
``OUTAGE``            (a setting, :meth:`FaultInjector.outage`) from the first RunInstances
                      on, every call fails for that long as if EC2 could not be reached
``SPOT_INTERRUPT``    (driven by :mod:`broker.shells.spot_faults`) EC2 takes a spot instance
                      back: a notice, then the instance terminated, described with
                      ``StateReason`` ``Server.SpotInstanceTermination``
====================  ==============================================================

Besides faults, the injector emulates what moto 5 does not do and EC2 does: a RunInstances
whose ``ClientToken`` an earlier RunInstances carried out (its response lost or not) returns
that call's instances and launches nothing (moto ignores the token and launches again). Each
such answer is logged as ``IDEMPOTENT``. The memory is the injector's: a new process (a
resumed daemon) starts without it, and relies on the fleet's own look-up by token tag.

Which call fails comes from a schedule: :meth:`FaultInjector.scripted` (the n-th call of an
operation gets the n-th entry) or :meth:`FaultInjector.seeded` (each call draws a fault with
given probabilities from a seeded generator, so a property test can replay a failing case).
Every fault actually injected is appended to :attr:`FaultInjector.log`.

Mechanism: botocore's event hooks on the real client, rather than a wrapper object or a
``Stubber``. A ``Stubber`` replaces every response, so it cannot be combined with moto; a
wrapper object is bypassed by anything that reaches the client directly (waiters,
paginators, ``client.exceptions``) and fails ``isinstance``/``hasattr`` checks. Hooks sit
inside the genuine client at the points where real failures arise: an error response
returned at ``before-call`` is turned into the modelled ``ClientError`` by botocore's own
code, a parameter change at ``before-parameter-build`` reaches moto as a real request, and
an exception at ``after-call`` follows a call that really happened, and an answer rewritten
at ``after-call`` (an instance hidden, a state held at ``pending``) is what every caller sees,
boto3's waiters included.

Durations (:attr:`FaultInjector.hide_s`, an outage) are read on the injector's ``clock``
(wall seconds by default; the dry run passes its run clock, so that ``eventual:30`` hides an
instance for 30 s of run time whatever ``--time-scale``).
"""

from __future__ import annotations

import copy
import enum
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError


class FaultKind(enum.Enum):
    CAPACITY = "capacity"
    LIMIT = "limit"
    VCPU_LIMIT = "vcpu_limit"
    THROTTLE = "throttle"
    READ_TIMEOUT = "read_timeout"
    LOST_RESPONSE = "lost_response"
    PARTIAL = "partial"
    STUCK_PENDING = "stuck_pending"
    EVENTUAL = "eventual"  # logged when an instance is hidden or refused; set by hide_s
    OUTAGE = "outage"  # logged for every call that failed in an outage; set by outage()
    IDEMPOTENT = "idempotent"  # not a fault: a RunInstances answered from its client token
    SPOT_INTERRUPT = "spot_interrupt"  # spot_faults.SpotInterrupter: a notice, then a termination

    def applies_to(self, operation: str) -> bool:
        """Launch-only faults apply to RunInstances; the rest to any operation."""
        return operation == "RunInstances" or self not in _LAUNCH_ONLY


_LAUNCH_ONLY = frozenset({FaultKind.CAPACITY, FaultKind.LIMIT, FaultKind.VCPU_LIMIT, FaultKind.PARTIAL,
                          FaultKind.STUCK_PENDING, FaultKind.IDEMPOTENT})
# Kinds that are settings of the injector rather than a schedule's draws.
_SETTINGS = frozenset({FaultKind.EVENTUAL, FaultKind.OUTAGE, FaultKind.IDEMPOTENT, FaultKind.SPOT_INTERRUPT})
_GONE_STATES = frozenset({"shutting-down", "terminated"})

# (HTTP status, EC2 error code, message) of the error responses EC2 sends.
_ERROR_RESPONSES: dict[FaultKind, tuple[int, str, str]] = {
    FaultKind.CAPACITY: (
        500,
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient capacity in the Availability Zone you requested.",
    ),
    FaultKind.LIMIT: (
        400,
        "InstanceLimitExceeded",
        "You have requested more instances than your current instance limit allows.",
    ),
    FaultKind.VCPU_LIMIT: (
        400,
        "VcpuLimitExceeded",
        "You have requested more vCPU capacity than your current vCPU limit allows.",
    ),
    FaultKind.THROTTLE: (503, "RequestLimitExceeded", "Request limit exceeded."),
}

Schedule = Callable[[str, int], "FaultKind | None"]
"""(operation name, 0-based index of this call among calls of that operation) -> fault."""


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault that was injected: the ``call``-th client call overall (0-based), the
    ``operation_call``-th of its operation, the kind, and what it did."""

    call: int
    operation: str
    operation_call: int
    kind: FaultKind
    detail: str = ""


class FaultInjector:
    """Injects the faults a schedule names into the calls of the clients it is attached to,
    and emulates EC2's client-token idempotency and (with :attr:`hide_s`) its eventual
    consistency."""

    def __init__(self, schedule: Schedule, clock: Callable[[], float] = time.monotonic) -> None:
        self._schedule = schedule
        self.clock = clock
        self._lock = threading.Lock()
        self._calls = 0
        self._operation_calls: dict[str, int] = {}
        self.log: list[Injection] = []
        self._attached: list[Any] = []
        self.on_inject: Callable[[Injection], None] | None = None  # told of every injection
        self.hide_s = 0.0  # EVENTUAL: how long a new instance is hidden (clock seconds)
        self._outage_s = 0.0
        self._outage_until: float | None = None  # set by the first RunInstances once outage() was asked
        self._by_token: dict[str, dict[str, Any]] = {}  # ClientToken -> the RunInstances answer
        self._born: dict[str, float] = {}  # instance -> clock when its RunInstances returned
        self._stuck: set[str] = set()  # instances held at pending
        self._said: set[tuple[str, str]] = set()  # (instance, kind) logged once
        self._interrupted: set[str] = set()  # spot instances EC2 took back (SPOT_INTERRUPT)

    def mark_interrupted(self, instance_id: str) -> None:
        """From now on DescribeInstances shows ``instance_id``'s end as a spot interruption."""
        with self._lock:
            self._interrupted.add(instance_id)

    def outage(self, seconds: float) -> None:
        """From the next RunInstances on, every call fails for ``seconds`` (``OUTAGE``)."""
        if seconds <= 0:
            raise ValueError("an outage lasts more than 0 s")
        self._outage_s = seconds

    # -- schedules -------------------------------------------------------------------------
    @classmethod
    def scripted(cls, script: Mapping[str, Sequence[FaultKind | None]]) -> "FaultInjector":
        """The n-th call of operation ``op`` gets ``script[op][n]``; ``None`` or past the end:
        no fault. Operation names are EC2's (``RunInstances``, ``DescribeInstances``)."""
        for operation, kinds in script.items():
            for kind in kinds:
                if kind in _SETTINGS:
                    raise ValueError(f"{kind.name} is a setting of the injector, not a scheduled fault")
                if kind is not None and not kind.applies_to(operation):
                    raise ValueError(f"{kind.name} cannot be injected into {operation}")
        frozen = {op: tuple(kinds) for op, kinds in script.items()}

        def schedule(operation: str, index: int) -> FaultKind | None:
            kinds = frozen.get(operation, ())
            return kinds[index] if index < len(kinds) else None

        return cls(schedule)

    @classmethod
    def seeded(
        cls,
        seed: int,
        rates: Mapping[FaultKind, float],
        operations: Sequence[str] = ("RunInstances",),
    ) -> "FaultInjector":
        """Each call of one of ``operations`` draws a fault: kind ``k`` with probability
        ``rates[k]`` among the kinds that apply to the operation, none with the rest."""
        if any(r < 0 for r in rates.values()) or sum(rates.values()) > 1.0 + 1e-12:
            raise ValueError("fault rates must be >= 0 and sum to at most 1")
        if set(rates) & _SETTINGS:
            raise ValueError("EVENTUAL, OUTAGE and IDEMPOTENT are settings of the injector, not drawn faults")
        rng = random.Random(seed)
        ordered = sorted(rates.items(), key=lambda item: item[0].value)  # draw order independent of dict order
        wanted = frozenset(operations)

        def schedule(operation: str, index: int) -> FaultKind | None:
            if operation not in wanted:
                return None
            u = rng.random()
            for kind, rate in ordered:
                if not kind.applies_to(operation):
                    continue
                if u < rate:
                    return kind
                u -= rate
            return None

        return cls(schedule)

    # -- attaching ---------------------------------------------------------------------------
    def attach(self, client: Any) -> Any:
        """Hook into ``client`` (a boto3 EC2 client) and return it, for chaining."""
        events = client.meta.events
        tag = f"broker-faults-{id(self)}"
        events.register("before-parameter-build.ec2", self._decide, unique_id=f"{tag}-decide")
        events.register("before-call.ec2", self._before_call, unique_id=f"{tag}-before")
        events.register("after-call.ec2", self._after_call, unique_id=f"{tag}-after")
        self._attached.append(client)
        return client

    def detach(self) -> None:
        """Remove the hooks from every client this injector was attached to."""
        tag = f"broker-faults-{id(self)}"
        for client in self._attached:
            events = client.meta.events
            events.unregister("before-parameter-build.ec2", unique_id=f"{tag}-decide")
            events.unregister("before-call.ec2", unique_id=f"{tag}-before")
            events.unregister("after-call.ec2", unique_id=f"{tag}-after")
        self._attached.clear()

    def injected(self, kind: FaultKind | None = None) -> list[Injection]:
        """The log, optionally only the injections of one kind."""
        return [i for i in self.log if kind is None or i.kind is kind]

    def _draw(self, operation: str, operation_call: int, params: Mapping[str, Any]) -> FaultKind | None:
        """This call's fault (a subclass may read the call's parameters)."""
        return self._schedule(operation, operation_call)

    def _note(self, injection: Injection) -> None:
        with self._lock:
            self.log.append(injection)
        if self.on_inject is not None:
            self.on_inject(injection)

    def _in_outage(self, operation: str) -> bool:
        """Whether this call falls in the outage (the first RunInstances starts it)."""
        with self._lock:
            if self._outage_s and self._outage_until is None and operation == "RunInstances":
                self._outage_until = self.clock() + self._outage_s
            return self._outage_until is not None and self.clock() < self._outage_until

    def _hidden(self, instance_id: str) -> bool:
        born = self._born.get(instance_id)
        return born is not None and self.hide_s > 0 and self.clock() - born < self.hide_s

    # -- hooks -------------------------------------------------------------------------------
    def _decide(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        """Draw this call's fault, apply PARTIAL to the parameters, and note it in ``context``
        (the per-call dict botocore passes to every later hook of the same call)."""
        operation = model.name
        with self._lock:
            call = self._calls
            self._calls += 1
            operation_call = self._operation_calls.get(operation, 0)
            self._operation_calls[operation] = operation_call + 1
        if operation == "RunInstances":
            context["broker_token"] = params.get("ClientToken")
        elif operation == "TerminateInstances":
            context["broker_terminate"] = list(params.get("InstanceIds", ()))
        if self._in_outage(operation):
            context["broker_fault"] = FaultKind.OUTAGE
            self._note(Injection(call, operation, operation_call, FaultKind.OUTAGE, "EC2 unreachable"))
            return
        kind = self._draw(operation, operation_call, params)
        if kind is None or not kind.applies_to(operation):
            return
        detail = ""
        if kind is FaultKind.PARTIAL:
            asked = int(params.get("MaxCount", 1))
            if asked < 2:
                return
            launched = asked // 2
            params["MinCount"] = params["MaxCount"] = launched
            detail = f"launched {launched} of {asked}"
        if kind is FaultKind.STUCK_PENDING:
            context["broker_stuck"] = True  # the launch goes ahead; its instances never run
            detail = "its instances stay pending"
        else:
            context["broker_fault"] = kind
        self._note(Injection(call, operation, operation_call, kind, detail))

    def _before_call(self, model: Any, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict] | None:
        kind = context.get("broker_fault")
        if kind is FaultKind.OUTAGE:
            raise EndpointConnectionError(endpoint_url=f"(injected outage) ec2 {model.name}")
        if kind is FaultKind.READ_TIMEOUT:
            raise ReadTimeoutError(endpoint_url=f"(injected) ec2 {model.name}")
        if kind in _ERROR_RESPONSES:
            return _error_response(*_ERROR_RESPONSES[kind])
        token = context.get("broker_token")
        with self._lock:
            earlier = copy.deepcopy(self._by_token.get(token)) if token else None
        if earlier is not None:  # EC2: the same token is the same launch
            ids = [i["InstanceId"] for i in earlier.get("Instances", ())]
            self._note(Injection(-1, model.name, -1, FaultKind.IDEMPOTENT, f"token {token}: {' '.join(ids)}"))
            context["broker_replayed"] = True
            return AWSResponse(url="", status_code=200, headers={}, raw=None), earlier
        hidden = [i for i in context.get("broker_terminate", ()) if self._hidden(i)]
        if hidden:
            for instance_id in hidden:
                self._note_once(instance_id, model.name, "refused: not known to EC2 yet")
            return _error_response(400, "InvalidInstanceID.NotFound",
                                   f"The instance IDs '{', '.join(hidden)}' do not exist")
        return None

    def _after_call(self, model: Any, context: dict[str, Any], parsed: Any = None, **_: Any) -> None:
        if isinstance(parsed, dict) and "Error" not in parsed:
            if model.name == "RunInstances" and not context.get("broker_replayed"):
                self._remember_launch(context, parsed)
            elif model.name == "DescribeInstances":
                self._rewrite_describe(parsed)
        if context.get("broker_fault") is FaultKind.LOST_RESPONSE:
            raise ReadTimeoutError(endpoint_url=f"(injected, after the call was carried out) ec2 {model.name}")

    def _remember_launch(self, context: dict[str, Any], parsed: dict[str, Any]) -> None:
        ids = [i["InstanceId"] for i in parsed.get("Instances", ())]
        now = self.clock()
        with self._lock:
            token = context.get("broker_token")
            if token:
                self._by_token[token] = copy.deepcopy(parsed)
            for instance_id in ids:
                self._born[instance_id] = now
            if context.get("broker_stuck"):
                self._stuck.update(ids)

    def _rewrite_describe(self, parsed: dict[str, Any]) -> None:
        """Hide the instances EC2 would not list yet; hold stuck ones at ``pending``."""
        reservations = []
        for reservation in parsed.get("Reservations", ()):
            kept = []
            for instance in reservation.get("Instances", ()):
                instance_id = instance.get("InstanceId", "")
                if self._hidden(instance_id):
                    self._note_once(instance_id, "DescribeInstances", "hidden: not listed by EC2 yet")
                    continue
                state = instance.get("State") or {}
                if instance_id in self._stuck and state.get("Name") not in _GONE_STATES:
                    instance["State"] = {"Code": 0, "Name": "pending"}
                    self._note_once(instance_id, "DescribeInstances", "held pending", FaultKind.STUCK_PENDING)
                if instance_id in self._interrupted and state.get("Name") in _GONE_STATES:
                    instance["StateReason"] = {"Code": "Server.SpotInstanceTermination",
                                               "Message": "Server.SpotInstanceTermination: Spot instance termination"}
                kept.append(instance)
            if kept:
                reservations.append({**reservation, "Instances": kept})
        if "Reservations" in parsed:
            parsed["Reservations"] = reservations

    def _note_once(self, instance_id: str, operation: str, detail: str,
                   kind: FaultKind = FaultKind.EVENTUAL) -> None:
        """Log ``kind`` for an instance once per operation (not at every describe)."""
        key = (instance_id, f"{kind.value}:{operation}")
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        self._note(Injection(-1, operation, -1, kind, f"{instance_id} {detail}"))


def _error_response(status: int, code: str, message: str) -> tuple[AWSResponse, dict]:
    """An error answer as EC2 sends it: botocore's own code turns it into a ``ClientError``."""
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "injected-fault"},
    }
    return AWSResponse(url="", status_code=status, headers={}, raw=None), parsed


# -- faults named in text (BROKER_DRY_RUN_FAULTS) ---------------------------------------------

SPEC_ENV = "BROKER_DRY_RUN_FAULTS"

# Names a spec may use for each kind: its own value, EC2's error code, and a plain alias.
_SPEC_NAMES: dict[str, FaultKind] = {}
for _kind, _names in {
    FaultKind.CAPACITY: ("insufficient_capacity", "InsufficientInstanceCapacity"),
    FaultKind.LIMIT: ("instance_limit", "InstanceLimitExceeded"),
    FaultKind.VCPU_LIMIT: ("VcpuLimitExceeded",),
    FaultKind.THROTTLE: ("request_limit", "RequestLimitExceeded"),
    FaultKind.READ_TIMEOUT: ("timeout",),
    FaultKind.LOST_RESPONSE: (),
    FaultKind.PARTIAL: ("partial_launch",),
    FaultKind.STUCK_PENDING: ("pending",),
    FaultKind.EVENTUAL: ("eventual_consistency",),
    FaultKind.OUTAGE: (),
    FaultKind.SPOT_INTERRUPT: ("spot_interruption",),
}.items():
    for _name in (_kind.value, *_names):
        _SPEC_NAMES[_name.lower()] = _kind
_SPEC_CANONICAL = ("insufficient_capacity", "instance_limit", "vcpu_limit", "throttle", "timeout", "lost_response",
                   "partial", "stuck_pending", "eventual", "outage", "spot_interrupt")
_DURATION_KINDS = (FaultKind.EVENTUAL, FaultKind.OUTAGE)  # KIND:SECONDS, settings rather than per call
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass
class SpecEntry:
    """One entry of a fault spec: ``kind`` on the next ``times`` calls that match ``target``
    (an EC2 operation such as ``DescribeInstances``, or an instance type, which means
    RunInstances of that type; ``None``: RunInstances)."""

    kind: FaultKind
    target: str | None
    times: int
    seconds: float = 0.0  # EVENTUAL and OUTAGE: how long
    rate: float = 0.0  # SPOT_INTERRUPT: interruptions per hour of run time, per instance of target

    def matches(self, operation: str, params: Mapping[str, Any]) -> bool:
        if not self.kind.applies_to(operation) or self.kind in _DURATION_KINDS or self.kind in _SETTINGS:
            return False
        if self.kind is FaultKind.PARTIAL and int(params.get("MaxCount", 1)) < 2:
            return False  # half of one instance is not a partial launch: wait for a bigger one
        if self.target is None:
            return operation == "RunInstances"
        if "." in self.target:  # the inventory's key: the offer tag (c5.xlarge@spot), else EC2's type
            return operation == "RunInstances" and _offer_of(params) == self.target
        return operation == self.target


def _offer_of(params: Mapping[str, Any]) -> Any:
    """The ``broker:offer`` tag a RunInstances carries (the fleet sets it), else its type."""
    for spec in params.get("TagSpecifications", ()):
        for tag in spec.get("Tags", ()):
            if tag.get("Key") == "broker:offer":
                return tag.get("Value")
    return params.get("InstanceType")


def parse_fault_spec(text: str, what: str = SPEC_ENV) -> list[SpecEntry]:
    """``KIND[:TARGET][:N],...``, e.g. ``insufficient_capacity:c5.large:1,throttle:RunInstances:2``.

    KIND: ``insufficient_capacity`` (or ``capacity``, ``InsufficientInstanceCapacity``),
    ``instance_limit`` (``limit``, ``InstanceLimitExceeded``), ``vcpu_limit``, ``throttle``
    (``request_limit``, ``RequestLimitExceeded``), ``timeout`` (``read_timeout``: the call never
    reached EC2), ``lost_response`` (carried out, its response lost), ``partial`` (half launched),
    ``stuck_pending`` (launched, never leaves ``pending``).
    ``eventual:SECONDS`` and ``outage:SECONDS`` take a duration instead (``30``, ``30s``, ``10m``:
    run time in a dry run): every instance is hidden from DescribeInstances and refused by
    TerminateInstances for that long after its RunInstances returned; every call fails as if
    EC2 were unreachable for that long from the first RunInstances on.
    ``spot_interrupt:TYPE:RATE`` (``spot_interrupt:c5.xlarge@spot:6``) takes the spot instances
    of TYPE back at RATE interruptions per hour of run time each: a two-minute notice its
    agent reads, then the instance terminated (``broker/shells/spot_faults.py``).
    TARGET: an instance type (``c5.large``: RunInstances of that type) or an EC2 operation
    (``RunInstances``, ``DescribeInstances``, ``TerminateInstances``); omitted: RunInstances.
    N: how many matching calls fail (default 1).
    Raises ValueError naming the entry that is wrong."""
    entries = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) > 3:
            raise ValueError(f"{what}: {item!r}: expected KIND[:TARGET][:N]")
        kind = _SPEC_NAMES.get(parts[0].strip().lower())
        if kind is None:
            known = ", ".join(_SPEC_CANONICAL)
            raise ValueError(f"{what}: {item!r}: unknown fault kind {parts[0]!r} (one of: {known})")
        if kind in _DURATION_KINDS:
            entries.append(SpecEntry(kind, None, 1, _duration(item, parts, what)))
            continue
        if kind is FaultKind.SPOT_INTERRUPT:
            entries.append(_spot_entry(item, parts, what))
            continue
        target, times = None, 1
        rest = [p.strip() for p in parts[1:]]
        if rest and rest[-1].isdigit():
            times = int(rest.pop())
        elif len(rest) == 2:
            raise ValueError(f"{what}: {item!r}: N must be a whole number, got {rest[-1]!r}")
        if rest:
            target = rest[0] or None
        if times < 1:
            raise ValueError(f"{what}: {item!r}: N must be at least 1")
        if target is not None and "." not in target and not (target[:1].isupper() and target.isalpha()):
            raise ValueError(f"{what}: {item!r}: target {target!r} is neither an instance type (c5.large) "
                             f"nor an EC2 operation (RunInstances)")
        if target is not None and "." not in target and not kind.applies_to(target):
            raise ValueError(f"{what}: {item!r}: {kind.value} can only be injected into RunInstances")
        entries.append(SpecEntry(kind, target, times))
    if not entries:
        raise ValueError(f"{what}: no fault named")
    return entries


def _spot_entry(item: str, parts: list[str], what: str) -> SpecEntry:
    """``spot_interrupt:TYPE:RATE``: the spot offer of TYPE (``@spot`` added if missing)."""
    usage = f"{what}: {item!r}: expected spot_interrupt:TYPE:RATE, e.g. spot_interrupt:c5.xlarge@spot:6"
    if len(parts) != 3 or not parts[1].strip():
        raise ValueError(usage)
    try:
        rate = float(parts[2])
    except ValueError:
        raise ValueError(usage + " (RATE: interruptions per hour of run time)") from None
    if not 0 < rate < float("inf"):
        raise ValueError(f"{what}: {item!r}: RATE must be more than 0 interruptions per hour")
    target = parts[1].strip()
    return SpecEntry(FaultKind.SPOT_INTERRUPT, target if target.endswith("@spot") else f"{target}@spot", 0,
                     rate=rate)


def _duration(item: str, parts: list[str], what: str) -> float:
    """The SECONDS of ``eventual:SECONDS`` / ``outage:SECONDS`` (a unit s, m or h allowed)."""
    text = parts[1].strip().lower() if len(parts) == 2 else ""
    unit = _UNITS.get(text[-1:], None) if text else None
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{what}: {item!r}: expected {parts[0].strip()}:SECONDS, e.g. {parts[0].strip()}:30 or "
                         f"{parts[0].strip()}:10m")
    return seconds


class SpecFaultInjector(FaultInjector):
    """Injects the faults of a parsed spec: each entry on the next N calls it matches, the
    entries tried in the order given."""

    def __init__(self, entries: Sequence[SpecEntry], clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(lambda operation, index: None, clock)
        self.entries = [SpecEntry(e.kind, e.target, e.times, e.seconds, e.rate) for e in entries]  # own counters
        for entry in self.entries:
            if entry.kind is FaultKind.EVENTUAL:
                self.hide_s = max(self.hide_s, entry.seconds)
            elif entry.kind is FaultKind.OUTAGE:
                self.outage(max(self._outage_s, entry.seconds))

    def _draw(self, operation: str, operation_call: int, params: Mapping[str, Any]) -> FaultKind | None:
        with self._lock:
            for entry in self.entries:
                if entry.times > 0 and entry.matches(operation, params):
                    entry.times -= 1
                    return entry.kind
        return None
