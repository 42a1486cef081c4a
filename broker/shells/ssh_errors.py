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
