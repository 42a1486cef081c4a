"""Translate what boto3 raises into an :class:`AwsFailure` with a closed kind.

EC2 error codes (``ClientError.response["Error"]["Code"]``) and botocore's own exceptions
map to :class:`LaunchErrorKind`. Only THROTTLED and TIMEOUT are worth retrying: a retry
reuses the client token, so a request whose response was lost cannot launch twice. Capacity
and limit errors are not retried here; the planner re-plans without the type instead.
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from .records import AwsFailure, LaunchErrorKind

_CODES: dict[str, LaunchErrorKind] = {
    # capacity: the zone has no room for this type right now
    "InsufficientInstanceCapacity": LaunchErrorKind.CAPACITY,
    "InsufficientHostCapacity": LaunchErrorKind.CAPACITY,
    "InsufficientCapacity": LaunchErrorKind.CAPACITY,
    # spot: no spot capacity at the price asked (a cap below the spot price) is capacity too;
    # MaxSpotInstanceCountExceeded (the spot quota) is a limit below: both cool the type down
    "SpotMaxPriceTooLow": LaunchErrorKind.CAPACITY,
    # account quotas
    "InstanceLimitExceeded": LaunchErrorKind.LIMIT,
    "VcpuLimitExceeded": LaunchErrorKind.LIMIT,
    "MaxSpotInstanceCountExceeded": LaunchErrorKind.LIMIT,
    # API rate limits
    "RequestLimitExceeded": LaunchErrorKind.THROTTLED,
    "Throttling": LaunchErrorKind.THROTTLED,
    "ThrottlingException": LaunchErrorKind.THROTTLED,
    "RequestThrottled": LaunchErrorKind.THROTTLED,
    # credentials and permissions (checked before the generic "Invalid*" rule below)
    "AuthFailure": LaunchErrorKind.AUTH,
    "UnauthorizedOperation": LaunchErrorKind.AUTH,
    "InvalidClientTokenId": LaunchErrorKind.AUTH,
    "ExpiredToken": LaunchErrorKind.AUTH,
    "ExpiredTokenException": LaunchErrorKind.AUTH,
    "SignatureDoesNotMatch": LaunchErrorKind.AUTH,
    "IncompleteSignature": LaunchErrorKind.AUTH,
    "MissingAuthenticationToken": LaunchErrorKind.AUTH,
    "AccessDenied": LaunchErrorKind.AUTH,
    "AccessDeniedException": LaunchErrorKind.AUTH,
    "OptInRequired": LaunchErrorKind.AUTH,
    "Blocked": LaunchErrorKind.AUTH,
}

# Families of codes EC2 uses for bad requests: InvalidAMIID.NotFound, InvalidParameterValue,
# InvalidKeyPair.NotFound, MissingParameter, Unsupported, ...
_INVALID_PREFIXES = ("Invalid", "Missing", "Unsupported", "Malformed")

RETRYABLE = frozenset({LaunchErrorKind.THROTTLED, LaunchErrorKind.TIMEOUT})

_NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "or run on a host with an instance role"
)


def kind_of_code(code: str) -> LaunchErrorKind:
    """The kind of an EC2 error code; UNKNOWN for codes not listed."""
    if code in _CODES:
        return _CODES[code]
    if code.startswith(_INVALID_PREFIXES):
        return LaunchErrorKind.INVALID
    return LaunchErrorKind.UNKNOWN


def classify(exc: Exception) -> AwsFailure:
    """An :class:`AwsFailure` for an exception raised by a boto3 call.

    Messages never include credentials: botocore's credential errors are replaced by our own
    text, and vendor messages are passed on as EC2 wrote them.
    """
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        message = str(error.get("Message") or exc)
        return AwsFailure(kind_of_code(code), code, message)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AwsFailure(LaunchErrorKind.AUTH, type(exc).__name__, _NO_CREDENTIALS)
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, ConnectionClosedError, EndpointConnectionError)):
        return AwsFailure(LaunchErrorKind.TIMEOUT, type(exc).__name__, str(exc))
    if isinstance(exc, (ParamValidationError, NoRegionError)):
        return AwsFailure(LaunchErrorKind.INVALID, type(exc).__name__, str(exc))
    if isinstance(exc, BotoCoreError):
        return AwsFailure(LaunchErrorKind.UNKNOWN, type(exc).__name__, str(exc))
    raise TypeError(f"not an AWS error: {exc!r}") from exc
