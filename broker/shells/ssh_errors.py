"""What can go wrong reaching or using a node over SSH (:mod:`broker.shells.ssh`)."""

from __future__ import annotations


class SshError(ConnectionError):
    """Reaching or using a node over SSH failed; the message says what to do about it."""


class HostUnreachable(SshError):
    """No TCP connection, or no SSH handshake, with the node."""


class HostKeyUnknown(SshError):
    """The node's host key is not in known_hosts and trust-on-first-use was not asked for."""


class HostKeyChanged(SshError):
    """The node presented a key different from the one in known_hosts (never accepted)."""


class AuthenticationFailed(SshError):
    """The node refused our key."""


class KeyFileRejected(SshError):
    """The private key file is missing, unreadable, too open, encrypted, or not a key."""


class RemoteCommandTimeout(SshError, TimeoutError):
    """A set-up command did not finish within its timeout (its channel was closed)."""


def is_refusal(exc: BaseException) -> bool:
    """Whether reaching a private node failed in a way no wait mends: its host key unknown or
    changed, our key refused or unusable, no key or host to use (``ValueError``: the
    inventory's to fix)."""
    import paramiko

    return isinstance(exc, (HostKeyChanged, HostKeyUnknown, KeyFileRejected, AuthenticationFailed,
                            paramiko.AuthenticationException, ValueError))


def is_transient(exc: BaseException) -> bool:
    """Whether a failure to reach a node is worth retrying: no route, no answer, a dropped
    link (never a refusal, see :func:`is_refusal`)."""
    import paramiko

    return isinstance(exc, (EOFError, OSError, paramiko.SSHException)) and not is_refusal(exc)


def raise_with(exc: BaseException, more: str) -> None:
    """Raise ``exc`` again with ``more`` added to its message (as is if its type will not take one)."""
    try:
        again = type(exc)(f"{exc}{more}")
    except Exception:  # noqa: BLE001 - an exception type with another signature
        raise exc from None
    raise again from exc
