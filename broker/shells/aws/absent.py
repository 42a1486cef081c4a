"""The fleet of a live run that does not talk to EC2: no request ever leaves this machine.

Used by ``broker run`` when the run can never rent (``broker/core/rent.py``: no type, or a
budget that cannot pay a billing unit), and when the inventory's ``aws`` section lacks what
renting takes (``region``, ``ami``, ``key_name``, ``security_group``, ``aws.key``): such a
run works on the private nodes, needs no credentials and no route to AWS, and a plan that
wants an instance gets a launch failure saying what is missing (the type is then avoided
and the run re-planned around it, as for an EC2 capacity refusal) instead of a call.

Same interface as :class:`~broker.shells.aws.Ec2Fleet` for what the daemon uses.
"""

from __future__ import annotations

from typing import Iterable

from .records import (
    AwsFailure,
    DescribeOutcome,
    LaunchErrorKind,
    LaunchOutcome,
    Reconciliation,
    TerminateOutcome,
    WaitOutcome,
)

NOT_CONFIGURED = "Ec2NotConfigured"


class NoEc2Fleet:
    """A fleet without EC2: it launches nothing (``reason`` says why) and holds nothing."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        self.calls = 0  # requests sent to AWS: always 0 (tests read it)

    def launch(self, type_name: str, count: int, *, client_token: str, user_data: str | None = None,
               max_price_per_hour: float | None = None) -> LaunchOutcome:
        failure = AwsFailure(LaunchErrorKind.LIMIT, NOT_CONFIGURED,
                             f"{count} x {type_name} not launched, nothing was asked of EC2: {self.reason}")
        return LaunchOutcome(type_name=type_name, requested=count, client_token=client_token, failure=failure)

    def describe(self) -> DescribeOutcome:
        return DescribeOutcome()

    def reconcile(self, known_ids: Iterable[str]) -> Reconciliation:
        known = tuple(known_ids)
        if known:  # a journal with instances is never given this fleet; say so if it is
            return Reconciliation(failure=AwsFailure(LaunchErrorKind.INVALID, NOT_CONFIGURED, self.reason))
        return Reconciliation()

    def wait_running(self, instance_ids: Iterable[str], timeout_s: float, *, poll_s: float = 5.0) -> WaitOutcome:
        return WaitOutcome(not_running=tuple(instance_ids))

    def address_of(self, instance_id: str, which: str = "public") -> str | None:
        return None

    def console_output(self, instance_id: str) -> str | None:
        return None

    def terminate(self, instance_ids: Iterable[str]) -> TerminateOutcome:
        return TerminateOutcome(refused=tuple(instance_ids))
