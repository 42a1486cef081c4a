"""What the EC2 edge hands back: closed enums and frozen records, never vendor objects.

The controller reads these in its next snapshot (STYLE.md habit 3): a failed launch is an
:class:`AwsFailure` inside a :class:`LaunchOutcome`, not an exception. Vendor states and
error codes are translated here, at the edge, into closed enums with an UNKNOWN member.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


class InstanceState(enum.Enum):
    """Life-cycle of an instance, as EC2 reports it (``State.Name``)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"

    @classmethod
    def from_vendor(cls, name: str | None) -> "InstanceState":
        for state in cls:
            if state.value == name:
                return state
        return cls.UNKNOWN

    @property
    def gone(self) -> bool:
        """True once the instance can never run a task again (and stops being billed)."""
        return self in (InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED)


class LaunchErrorKind(enum.Enum):
    """Why an EC2 call failed, in the terms the controller acts on.

    CAPACITY and LIMIT make the planner drop the type and re-plan; THROTTLED and TIMEOUT are
    retried here first (bounded) and reported only when retries ran out; INVALID and AUTH
    need the user; PARTIAL means fewer instances than asked exist (the ones that do are in
    the outcome). The same kinds classify failures of describe and terminate calls.
    """

    CAPACITY = "capacity"
    LIMIT = "limit"
    THROTTLED = "throttled"
    INVALID = "invalid"
    AUTH = "auth"
    TIMEOUT = "timeout"
    PARTIAL = "partial"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class AwsFailure:
    """A failed EC2 call: its kind, the vendor's error code (or exception name), a message.

    Messages come from the vendor's error text or are written here; credentials never are.
    """

    kind: LaunchErrorKind
    code: str
    message: str

    def render(self) -> str:
        return f"{self.kind.value}: {self.code}: {self.message}" if self.code else f"{self.kind.value}: {self.message}"


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One EC2 instance as last described. IPs are informational: nothing here contacts them."""

    id: str
    type_name: str
    state: InstanceState
    launched_at_s: float  # epoch seconds (EC2 LaunchTime, one-second resolution)
    private_ip: str | None = None
    public_ip: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    state_reason: str | None = None  # EC2's StateReason code, e.g. Server.SpotInstanceTermination

    @property
    def interrupted(self) -> bool:
        """EC2 took this spot instance back (not we, not the user)."""
        return self.state_reason == SPOT_TERMINATION


SPOT_TERMINATION = "Server.SpotInstanceTermination"


@dataclass(frozen=True, slots=True)
class DescribeOutcome:
    """This run's instances as EC2 lists them, or the failure that kept them from view."""

    instances: tuple[InstanceRecord, ...] = ()
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    """The result of one ``launch(type, count)``.

    ``instances`` are those that exist under the client token (all of them on success, some
    on PARTIAL, none on other failures). ``reused`` says they were found by the idempotency
    guard rather than created by this call; ``attempts`` counts RunInstances attempts.
    """

    type_name: str
    requested: int
    client_token: str
    instances: tuple[InstanceRecord, ...] = ()
    failure: AwsFailure | None = None
    attempts: int = 0
    reused: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def instance_ids(self) -> tuple[str, ...]:
        return tuple(i.id for i in self.instances)


@dataclass(frozen=True, slots=True)
class TerminateOutcome:
    """The result of ``terminate(ids)``; every asked id lands in exactly one field.

    ``refused`` ids do not carry this run's tag (or do not exist) and were never sent to
    TerminateInstances; ``already_terminated`` were ours and gone already; ``failed`` were
    ours but the call failed with ``failure``.
    """

    terminated: tuple[str, ...] = ()
    already_terminated: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The journal's instance ids against what EC2 holds under this run's tag.

    - ``adopted``: tagged with this run but unknown to the journal (launched just before a
      crash, say), in any state, so their spend is counted too;
    - ``missing``: known to the journal but absent from EC2 or terminated there;
    - ``strays``: known to the journal but held by EC2 *without* this run's tag; the broker
      never touches them and reports them for a human to look at.
    """

    adopted: tuple[InstanceRecord, ...] = ()
    missing: tuple[str, ...] = ()
    strays: tuple[str, ...] = ()
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class WaitOutcome:
    """After ``wait_running``: which instances run, which do not (yet), and why not."""

    running: tuple[InstanceRecord, ...] = ()
    not_running: tuple[str, ...] = ()
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class CredentialCheck:
    """Whether the configured credentials work; ``message`` is for the user either way."""

    ok: bool
    message: str
    identity_arn: str | None = None
