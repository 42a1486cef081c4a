"""The master-agent wire protocol, sans I/O: bytes in, events out, bytes to send.

Framing. One JSON object per line: UTF-8, compact separators, terminated by ``\\n``; the
object's ``"type"`` names the message, the other keys are its fields. A line longer than
``max_line_bytes`` (default 1 MiB) is refused. Unknown keys are ignored (so a later
protocol can add optional fields); a missing required field, a field of the wrong type,
NaN or infinity, an unknown type, or a line that is not a JSON object is the peer's
error (:class:`RemoteProtocolError`).

Conversation (each side sends its ``Hello`` first; nothing else is accepted before it)::

    master                                  agent
    Hello(role="master", protocol=1)   ->
                                       <-   Hello(role="agent", protocol=1, node, slots,
                                                  running, pending_results)
                                       <-   Result x pending_results   (replayed until acked)
    Run, Run, ...   (one write)        ->
                                       <-   Started, Progress, Result, ...
    Ack, Cancel, Ping                  ->
                                       <-   Pong
                                       <-   Interruption   (spot notice: after each Hello
                                                            once read, and when first read)
    Shutdown(drain)                    ->   (no Run after it)

Every task message carries ``(task, attempt)``, so a replayed message is recognised and
handled idempotently. A version mismatch surfaces as a :class:`RemoteProtocolError` on
receiving the peer's ``Hello``, naming both versions.

Usage, the same at both ends::

    conn = Connection("master")
    wire_bytes = conn.send(Hello(role="master"))
    conn.receive_data(incoming)          # b"" means the peer closed the stream
    while (event := conn.next_event()) is not NEED_DATA: ...

Each side of a connection has a state (``IDLE`` until its Hello, then ``OPEN``; the master
moves to ``DRAINING`` when it sends ``Shutdown``); which message a side may send in which
state is the one table :data:`TRANSITIONS`. Breaking it ourselves raises
:class:`LocalProtocolError`; the peer breaking it raises :class:`RemoteProtocolError`.

Runs on Python 3.8 or later (nodes carry old interpreters): annotations stay strings and
the field checks are keyed by their text.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterable, Tuple, Union

PROTOCOL_VERSION = 1
DEFAULT_MAX_LINE_BYTES = 1 << 20
ROLES = ("master", "agent")


class ProtocolError(Exception):
    """The conversation broke the protocol."""


class LocalProtocolError(ProtocolError):
    """This side tried to send something the protocol forbids (a bug in the caller)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; the connection cannot continue."""


# --------------------------------------------------------------------------- secrets

# Which entries of a Run's ``env`` hold credentials: those whose names contain one of these
# parts (case-insensitive). Both ends use this one rule: the broker masks their values in its
# logs and journal, the agent in its journal, its log and the Results it sends. Values
# shorter than MIN_SECRET_LEN are left alone (they would mask ordinary words and numbers).
SECRET_NAME_PARTS = (
    "secret", "password", "passwd", "token", "private_key", "credential", "passphrase", "api_key", "apikey",
    "access_key",
)  # fmt: skip
MIN_SECRET_LEN = 6
MASK = "***"


def looks_secret(name: str) -> bool:
    """Whether an environment variable (or log key) name looks like it holds a credential."""
    lowered = name.lower()
    return any(part in lowered for part in SECRET_NAME_PARTS)


def secret_values(env: Dict[str, str]) -> Tuple[str, ...]:
    """The values of ``env``'s secret-looking entries worth masking, longest first."""
    values = {v for k, v in env.items() if looks_secret(k) and isinstance(v, str) and len(v) >= MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


def mask_text(text: str, secrets: Any) -> str:
    """``text`` with every occurrence of each of ``secrets`` (longest first) replaced by MASK."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


# --------------------------------------------------------------------------- messages

Key = Tuple[str, int]  # (task id, attempt number)


@dataclass(frozen=True)
class Hello:
    """First message of each side. The agent's tells what it is doing right now."""

    TYPE: ClassVar[str] = "hello"
    role: str
    protocol: int = PROTOCOL_VERSION
    node: str = ""
    slots: int = 0
    agent_version: str = ""
    running: tuple[tuple[str, int], ...] = ()  # accepted and not finished (started or queued)
    pending_results: int = 0  # results the agent replays right after this Hello


@dataclass(frozen=True)
class Run:
    """Run ``command`` with ``/bin/sh -c``; ``timeout_s=None`` means no limit."""

    TYPE: ClassVar[str] = "run"
    task: str
    attempt: int
    command: str
    timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class Started:
    TYPE: ClassVar[str] = "started"
    task: str
    attempt: int
    pid: int


@dataclass(frozen=True)
class Progress:
    """The task printed ``BROKER_PROGRESS <fraction>`` after ``elapsed_s`` seconds."""

    TYPE: ClassVar[str] = "progress"
    task: str
    attempt: int
    fraction: float
    elapsed_s: float


@dataclass(frozen=True)
class Result:
    """How an attempt ended. ``exit_code`` is negative for a signal, ``None`` if it never ran.

    ``runtime_s`` is measured on the node (monotonic clock). The tails are the last few KiB
    of each stream; the full streams are in the ``*_path`` files on the node (``None`` when
    the stream was empty). ``error`` says why the agent could not run or follow the task.
    """

    TYPE: ClassVar[str] = "result"
    task: str
    attempt: int
    exit_code: int | None
    runtime_s: float
    timed_out: bool = False
    cancelled: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_path: str | None = None
    stderr_path: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not (self.timed_out or self.cancelled or self.error)


@dataclass(frozen=True)
class Ack:
    """The master has recorded this Result; the agent may forget it."""

    TYPE: ClassVar[str] = "ack"
    task: str
    attempt: int


@dataclass(frozen=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    task: str
    attempt: int


@dataclass(frozen=True)
class Ping:
    TYPE: ClassVar[str] = "ping"
    seq: int


@dataclass(frozen=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    seq: int


@dataclass(frozen=True)
class Shutdown:
    """Stop the agent: ``drain`` finishes accepted tasks first, otherwise they are cancelled."""

    TYPE: ClassVar[str] = "shutdown"
    drain: bool = True


@dataclass(frozen=True)
class Interruption:
    """The cloud takes this node back: EC2's two-minute spot notice, read by the agent from
    the instance metadata (``spot/instance-action``). ``action`` and ``time`` are the
    document's (``terminate``, ``2026-11-24T13:08:00Z``); ``in_s`` is how long from this
    message to that time on the node's clock (0 when it has passed). The agent sends it
    once when it reads the notice, and again after its Hello on every new connection."""

    TYPE: ClassVar[str] = "interruption"
    action: str
    time: str
    in_s: float


@dataclass(frozen=True)
class ConnectionClosed:
    """The peer closed the stream cleanly (not a message: never sent, only received)."""


Message = Union[Hello, Run, Started, Progress, Result, Ack, Cancel, Ping, Pong, Shutdown, Interruption]
MESSAGE_TYPES: Tuple[type, ...] = (Hello, Run, Started, Progress, Result, Ack, Cancel, Ping, Pong, Shutdown,
                                   Interruption)


def key_of(message: Any) -> Key:
    """``(task, attempt)`` of a task message."""
    return (message.task, message.attempt)


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()
"""Returned by :meth:`Connection.next_event` when no complete line is buffered."""


# --------------------------------------------------------------------------- states


class State(enum.Enum):
    IDLE = "idle"  # has not sent its Hello yet
    OPEN = "open"
    DRAINING = "draining"  # the master asked the agent to shut down
    ERROR = "error"  # broke the protocol; nothing more is read from it


_S = State
TRANSITIONS: Dict[Tuple[str, State, type], State] = {
    ("master", _S.IDLE, Hello): _S.OPEN,
    ("master", _S.OPEN, Run): _S.OPEN,
    ("master", _S.OPEN, Ack): _S.OPEN,
    ("master", _S.OPEN, Cancel): _S.OPEN,
    ("master", _S.OPEN, Ping): _S.OPEN,
    ("master", _S.OPEN, Shutdown): _S.DRAINING,
    ("master", _S.DRAINING, Ack): _S.DRAINING,
    ("master", _S.DRAINING, Cancel): _S.DRAINING,
    ("master", _S.DRAINING, Ping): _S.DRAINING,
    ("agent", _S.IDLE, Hello): _S.OPEN,
    ("agent", _S.OPEN, Started): _S.OPEN,
    ("agent", _S.OPEN, Progress): _S.OPEN,
    ("agent", _S.OPEN, Result): _S.OPEN,
    ("agent", _S.OPEN, Pong): _S.OPEN,
    ("agent", _S.OPEN, Interruption): _S.OPEN,
}
"""(sender role, sender state, message class) -> the sender's next state; absent = forbidden."""


# --------------------------------------------------------------------------- field codecs


def _check_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _check_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("an integer")
    return value


def _check_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError("a finite number")
    return float(value)


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("true or false")
    return value


def _check_env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise TypeError("an object of strings")
    return value


def _check_keys(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, list):
        raise TypeError("a list of [task, attempt] pairs")
    pairs = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2):
            raise TypeError("a list of [task, attempt] pairs")
        pairs.append((_check_str(item[0]), _check_int(item[1])))
    return tuple(pairs)


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check_optional(value: Any) -> Any:
        return None if value is None else check(value)

    return check_optional


_CHECKS: Dict[str, Callable[[Any], Any]] = {  # keyed by the annotation's text
    "str": _check_str,
    "int": _check_int,
    "float": _check_float,
    "bool": _check_bool,
    "str | None": _optional(_check_str),
    "int | None": _optional(_check_int),
    "float | None": _optional(_check_float),
    "dict[str, str]": _check_env,
    "tuple[tuple[str, int], ...]": _check_keys,
}


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    check: Callable[[Any], Any]
    required: bool


_SPECS: Dict[type, Tuple[_FieldSpec, ...]] = {
    cls: tuple(
        _FieldSpec(
            f.name,
            _CHECKS[f.type],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )
    for cls in MESSAGE_TYPES
}
_BY_TYPE: Dict[str, type] = {cls.TYPE: cls for cls in MESSAGE_TYPES}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


# Made once: json.dumps and json.loads with options build an encoder or decoder per call, a
# cost paid for every Run, Ack, Started and Result of every task.
def one_shot_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` with its C encoder made once: ``JSONEncoder.encode`` builds one on
    every call, a third of a short message's encoding. Same bytes, from the encoder's own
    options; no circular-reference check (a RecursionError falls back to ``encoder.encode``,
    which names the problem). The broker's event log uses it too."""
    make = json.encoder.c_make_encoder
    if make is None or encoder.indent is not None:
        return encoder.encode
    strings = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    c_encode = make(None, encoder.default, strings, None, encoder.key_separator, encoder.item_separator,
                    encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)

    def encode(obj: Any) -> str:
        try:
            return "".join(c_encode(obj, 0))
        except RecursionError:
            return encoder.encode(obj)

    return encode


_ENCODE = one_shot_encoder(json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False))
_DECODE = json.JSONDecoder(parse_constant=_reject_constant).decode


def _loads(line: Any) -> Any:
    """``json.loads(line, parse_constant=_reject_constant)`` with the one decoder."""
    if isinstance(line, (bytes, bytearray)):
        text = line.decode(json.detect_encoding(line), "surrogatepass")
    else:
        text = line
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _DECODE(text)


def encode(message: Message) -> bytes:
    """One message as its wire line (with the trailing newline). No state is involved."""
    spec = _SPECS.get(type(message))
    if spec is None:
        raise LocalProtocolError(f"{message!r} is not a protocol message")
    obj: dict[str, Any] = {"type": message.TYPE}
    for f in spec:
        obj[f.name] = getattr(message, f.name)
    try:
        text = _ENCODE(obj)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"cannot encode {message.TYPE}: {exc}") from exc
    return text.encode("utf-8") + b"\n"


def decode(line: bytes) -> Message:
    """One wire line (newline optional) as a message; :class:`RemoteProtocolError` if malformed.

    Whatever is wrong with the line (not UTF-8, not JSON, nested too deep for the parser,
    too big for memory, a field of the wrong type) ends as that one protocol error, so a
    reader on either end never dies of a bad line with some other exception."""
    try:
        return _decode(line)
    except RemoteProtocolError:
        raise
    except (ValueError, RecursionError, MemoryError, TypeError, AttributeError) as exc:
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError: nesting
        raise RemoteProtocolError(f"not a protocol line ({type(exc).__name__}: {exc}): {_preview(line)}") from None


def _decode(line: bytes) -> Message:
    try:
        obj = _loads(line)
    except ValueError as exc:
        raise RemoteProtocolError(f"not a JSON line ({exc}): {_preview(line)}") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"a message must be a JSON object: {_preview(line)}")
    type_name = obj.get("type")
    cls = _BY_TYPE.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        known = ", ".join(sorted(_BY_TYPE))
        raise RemoteProtocolError(f"unknown message type {type_name!r} (known: {known})")
    kwargs = {}
    for f in _SPECS[cls]:
        if f.name not in obj:
            if f.required:
                raise RemoteProtocolError(f"{type_name} lacks the field {f.name!r}")
            continue
        try:
            kwargs[f.name] = f.check(obj[f.name])
        except TypeError as exc:
            raise RemoteProtocolError(
                f"{type_name}.{f.name} must be {exc}, got {obj[f.name]!r}"
            ) from None
    return cls(**kwargs)


def _preview(line: bytes, limit: int = 80) -> str:
    text = repr(bytes(line[:limit]))
    return text + ("..." if len(line) > limit else "")


# --------------------------------------------------------------------------- connection


class Connection:
    """One end of a master-agent conversation; ``role`` is ``"master"`` or ``"agent"``.

    Not thread-safe: a caller that receives on one thread and sends on another serialises
    them itself (the two directions share no state, but the object does not promise it).
    """

    def __init__(self, role: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, skip: Iterable[str] = ()) -> None:
        """``skip``: types of the peer's messages that this end has no use for (the daemon's
        loop and ``Started``): once the peer's Hello is in, a line that opens as
        :func:`encode` opens such a message is dropped without being decoded."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        self.our_role = role
        self.their_role = ROLES[1 - ROLES.index(role)]
        self.our_state = State.IDLE
        self.their_state = State.IDLE
        self.their_hello: Hello | None = None
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline
        self._eof = False
        self._error: RemoteProtocolError | None = None
        self._skip = tuple(b'{"type":"' + name.encode() + b'",' for name in skip)

    # ----------------------------------------------------------------- sending

    def send(self, message: Message) -> bytes:
        """Check that we may send ``message`` now, advance our state, return its bytes."""
        next_state = TRANSITIONS.get((self.our_role, self.our_state, type(message)))
        if next_state is None:
            raise LocalProtocolError(self._forbidden(self.our_role, self.our_state, message))
        if isinstance(message, Hello):
            if message.role != self.our_role:
                raise LocalProtocolError(f"a {self.our_role} must say role={self.our_role!r} in its Hello")
            if message.protocol != PROTOCOL_VERSION:
                raise LocalProtocolError(f"this side speaks protocol {PROTOCOL_VERSION}, not {message.protocol}")
        data = encode(message)
        if len(data) > self.max_line_bytes:
            raise LocalProtocolError(
                f"{message.TYPE} encodes to {len(data)} bytes, over the {self.max_line_bytes}-byte line limit"
            )
        self.our_state = next_state
        return data

    def send_all(self, messages: list[Message]) -> bytes:
        """Several messages as one write (batching); all or nothing on a protocol error."""
        saved = self.our_state
        try:
            return b"".join([self.send(m) for m in messages])
        except LocalProtocolError:
            self.our_state = saved
            raise

    # ----------------------------------------------------------------- receiving

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer; ``b""`` means the peer closed the stream."""
        if self._eof:
            raise LocalProtocolError("receive_data after the end of the stream")
        if data:
            self._buffer += data
        else:
            self._eof = True

    def next_event(self) -> Message | ConnectionClosed | _NeedData:
        """The next complete message, :data:`NEED_DATA`, or :class:`ConnectionClosed` at the end."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except RemoteProtocolError as exc:
            self._error = exc
            self.their_state = State.ERROR
            raise

    def _next_event(self) -> Message | ConnectionClosed | _NeedData:
        while True:
            line = self._next_line()
            if not isinstance(line, bytes):
                return line
            if not (self._skip and self.their_state is State.OPEN and line.startswith(self._skip)):
                return self._message(line)

    def _next_line(self) -> bytes | ConnectionClosed | _NeedData:
        end = self._buffer.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(self._buffer)
            if len(self._buffer) > self.max_line_bytes:
                raise RemoteProtocolError(f"a line exceeds the {self.max_line_bytes}-byte limit")
            if self._eof:
                if self._buffer:
                    raise RemoteProtocolError(f"stream ended inside a message: {_preview(self._buffer)}")
                return ConnectionClosed()
            return NEED_DATA
        if end + 1 > self.max_line_bytes:
            raise RemoteProtocolError(f"a line exceeds the {self.max_line_bytes}-byte limit")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._scanned = 0
        return line

    def _message(self, line: bytes) -> Message:
        message = decode(line)
        next_state = TRANSITIONS.get((self.their_role, self.their_state, type(message)))
        if next_state is None:
            raise RemoteProtocolError(self._forbidden(self.their_role, self.their_state, message))
        if isinstance(message, Hello):
            self._check_their_hello(message)
        self.their_state = next_state
        return message

    def _check_their_hello(self, hello: Hello) -> None:
        if hello.protocol != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                f"the {self.their_role} speaks protocol {hello.protocol}, this {self.our_role} speaks "
                f"{PROTOCOL_VERSION}: ship the same workers/agent.py and protocol.py to both ends"
            )
        if hello.role != self.their_role:
            raise RemoteProtocolError(f"the peer says it is a {hello.role!r}; expected a {self.their_role!r}")
        self.their_hello = hello

    @staticmethod
    def _forbidden(role: str, state: State, message: Any) -> str:
        name = getattr(message, "TYPE", type(message).__name__)
        if state is State.IDLE:
            return f"the {role} sent {name} before its Hello"
        if state is State.ERROR:
            return f"the {role} already broke the protocol"
        return f"the {role} may not send {name} while {state.value}"
