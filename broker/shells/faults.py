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
``STUCK_PENDING``     RunInstances succeeds, but its instances never leave ``pending``: every
                      later DescribeInstances shows them pending while EC2 runs them
====================  ==============================================================

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
an exception at ``after-call`` follows a call that really happened.
"""

from __future__ import annotations

import enum
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError


class FaultKind(enum.Enum):
    CAPACITY = "capacity"
    LIMIT = "limit"
    VCPU_LIMIT = "vcpu_limit"
    THROTTLE = "throttle"
    READ_TIMEOUT = "read_timeout"
    LOST_RESPONSE = "lost_response"
    PARTIAL = "partial"
    STUCK_PENDING = "stuck_pending"

    def applies_to(self, operation: str) -> bool:
        """Launch-only faults apply to RunInstances; the rest to any operation."""
        return operation == "RunInstances" or self not in _LAUNCH_ONLY


_LAUNCH_ONLY = frozenset({FaultKind.CAPACITY, FaultKind.LIMIT, FaultKind.VCPU_LIMIT, FaultKind.PARTIAL,
                          FaultKind.STUCK_PENDING})

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
    """Injects the faults a schedule names into the calls of the clients it is attached to."""

    def __init__(self, schedule: Schedule) -> None:
        self._schedule = schedule
        self._lock = threading.Lock()
        self._calls = 0
        self._operation_calls: dict[str, int] = {}
        self.log: list[Injection] = []
        self._attached: list[Any] = []
        self.on_inject: Callable[[Injection], None] | None = None  # told of every injection
        self.stuck: set[str] = set()  # instances launched under STUCK_PENDING: described as pending

    # -- schedules -------------------------------------------------------------------------
    @classmethod
    def scripted(cls, script: Mapping[str, Sequence[FaultKind | None]]) -> "FaultInjector":
        """The n-th call of operation ``op`` gets ``script[op][n]``; ``None`` or past the end:
        no fault. Operation names are EC2's (``RunInstances``, ``DescribeInstances``)."""
        for operation, kinds in script.items():
            for kind in kinds:
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
        context["broker_fault"] = kind
        injection = Injection(call, operation, operation_call, kind, detail)
        with self._lock:
            self.log.append(injection)
        if self.on_inject is not None:
            self.on_inject(injection)

    def _before_call(self, model: Any, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict] | None:
        kind = context.get("broker_fault")
        if kind is FaultKind.READ_TIMEOUT:
            raise ReadTimeoutError(endpoint_url=f"(injected) ec2 {model.name}")
        if kind in _ERROR_RESPONSES:
            status, code, message = _ERROR_RESPONSES[kind]
            parsed = {
                "Error": {"Code": code, "Message": message},
                "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "injected-fault"},
            }
            return AWSResponse(url="", status_code=status, headers={}, raw=None), parsed
        return None

    def _after_call(self, model: Any, context: dict[str, Any], parsed: Any = None, **_: Any) -> None:
        if isinstance(parsed, dict):
            self._keep_stuck_pending(model.name, context.get("broker_fault"), parsed)
        if context.get("broker_fault") is FaultKind.LOST_RESPONSE:
            raise ReadTimeoutError(endpoint_url=f"(injected, after the call was carried out) ec2 {model.name}")


    def _keep_stuck_pending(self, operation: str, kind: FaultKind | None, parsed: dict) -> None:
        """STUCK_PENDING: note the instances a RunInstances launched; show every one of them
        that still runs as ``pending`` in each DescribeInstances answer."""
        if operation == "RunInstances" and kind is FaultKind.STUCK_PENDING:
            with self._lock:
                self.stuck.update(i["InstanceId"] for i in parsed.get("Instances", ()))
        elif operation == "DescribeInstances" and self.stuck:
            for reservation in parsed.get("Reservations", ()):
                for instance in reservation.get("Instances", ()):
                    if instance.get("InstanceId") in self.stuck and instance.get("State", {}).get("Name") == "running":
                        instance["State"] = {"Code": 0, "Name": "pending"}


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
    FaultKind.STUCK_PENDING: ("pending_never_runs",),
}.items():
    for _name in (_kind.value, *_names):
        _SPEC_NAMES[_name.lower()] = _kind
_SPEC_CANONICAL = ("insufficient_capacity", "instance_limit", "vcpu_limit", "throttle", "timeout", "lost_response",
                   "partial", "stuck_pending")


@dataclass
class SpecEntry:
    """One entry of a fault spec: ``kind`` on the next ``times`` calls that match ``target``
    (an EC2 operation such as ``DescribeInstances``, or an instance type, which means
    RunInstances of that type; ``None``: RunInstances)."""

    kind: FaultKind
    target: str | None
    times: int

    def matches(self, operation: str, params: Mapping[str, Any]) -> bool:
        if not self.kind.applies_to(operation):
            return False
        if self.kind is FaultKind.PARTIAL and int(params.get("MaxCount", 1)) < 2:
            return False  # half of one instance is not a partial launch: wait for a bigger one
        if self.target is None:
            return operation == "RunInstances"
        if "." in self.target:
            return operation == "RunInstances" and params.get("InstanceType") == self.target
        return operation == self.target


def parse_fault_spec(text: str, what: str = SPEC_ENV) -> list[SpecEntry]:
    """``KIND[:TARGET][:N],...``, e.g. ``insufficient_capacity:c5.large:1,throttle:RunInstances:2``.

    KIND: ``insufficient_capacity`` (or ``capacity``, ``InsufficientInstanceCapacity``),
    ``instance_limit`` (``limit``, ``InstanceLimitExceeded``), ``vcpu_limit``, ``throttle``
    (``request_limit``, ``RequestLimitExceeded``), ``timeout`` (``read_timeout``: the call never
    reached EC2), ``lost_response`` (carried out, its response lost), ``partial`` (half launched),
    ``stuck_pending`` (launched, but described as ``pending`` for ever).
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


class SpecFaultInjector(FaultInjector):
    """Injects the faults of a parsed spec: each entry on the next N calls it matches, the
    entries tried in the order given."""

    def __init__(self, entries: Sequence[SpecEntry]) -> None:
        super().__init__(lambda operation, index: None)
        self.entries = [SpecEntry(e.kind, e.target, e.times) for e in entries]  # own counters

    def _draw(self, operation: str, operation_call: int, params: Mapping[str, Any]) -> FaultKind | None:
        with self._lock:
            for entry in self.entries:
                if entry.times > 0 and entry.matches(operation, params):
                    entry.times -= 1
                    return entry.kind
        return None
