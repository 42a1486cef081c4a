"""The EC2 shell: a narrow, record-returning edge over boto3 (see ``fleet.py``)."""

from .errors import classify, kind_of_code
from .fleet import MANAGED_TAG, RUN_TAG, TOKEN_TAG, Ec2Fleet
from .records import (
    AwsFailure,
    CredentialCheck,
    DescribeOutcome,
    InstanceRecord,
    InstanceState,
    LaunchErrorKind,
    LaunchOutcome,
    Reconciliation,
    TerminateOutcome,
    WaitOutcome,
)
from .retry import RetryPolicy

__all__ = [
    "AwsFailure",
    "CredentialCheck",
    "DescribeOutcome",
    "Ec2Fleet",
    "InstanceRecord",
    "InstanceState",
    "LaunchErrorKind",
    "LaunchOutcome",
    "MANAGED_TAG",
    "RUN_TAG",
    "Reconciliation",
    "RetryPolicy",
    "TOKEN_TAG",
    "TerminateOutcome",
    "WaitOutcome",
    "classify",
    "kind_of_code",
]
