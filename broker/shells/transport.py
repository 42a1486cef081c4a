"""The byte-stream contract between the master and one worker agent.

A transport moves the agent protocol's bytes and nothing else; framing and meaning live in
``workers/protocol.py``. Implementations: local pipes (``local_transport.py``) and an SSH
channel (``ssh.py``). Both behave the same:

- ``send`` writes all of ``data`` or raises :class:`TransportClosed`;
- ``recv`` returns the next bytes available (at most ``max_bytes``), waiting up to
  ``timeout_s`` (``None`` = forever); it returns ``None`` on timeout and ``b""`` once the
  peer has closed the stream (end of file);
- ``close`` is idempotent and never raises.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class TransportClosed(ConnectionError):
    """The stream is gone: the peer closed it, the process died, or the network dropped."""


@runtime_checkable
class Transport(Protocol):
    def send(self, data: bytes) -> None: ...

    def recv(self, max_bytes: int = 65536, timeout_s: float | None = None) -> bytes | None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...
