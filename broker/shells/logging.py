"""structlog set-up: JSON lines when not on a terminal, console rendering on one.

Event names are stable and dotted (``plan.solved``, ``instance.launch``, ``task.done``);
they are documented in the README's event catalogue. Secrets never reach a log line: the
``redact`` processor masks, at any depth, the values of keys that look like credentials
(``*secret*``, ``*token*``, ``*password*``, ``*passphrase*``, ``*credential*``,
``*private_key*``, ``*api_key*``, ``*access_key*``), and every occurrence of a registered
secret value inside any string (a task that prints its token to stderr). Registered values
are those of secret-looking environment variables (``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ...) when logging is configured, of secret-looking bag ``env``
entries when a run starts, and any passed to :func:`register_secret`. The daemon applies
the same masking to what it writes to the journal (:func:`mask_secrets`).

Levels: ``level`` is the console's. The files given as ``extra_files`` (a run's
``events.jsonl``) always receive every event, debug included, whatever the console shows:
they are the run's record. On a terminal at ``info`` the console shows only what a person
follows (:data:`broker.shells.events.CONSOLE_EVENTS`: plans, launches, releases, failures, the
run's start and end) and every warning and error; the per-task events appear at ``debug``.
Off a terminal the console gets every event at ``level`` and above, as JSON lines.
"""

from __future__ import annotations

import json as json_module
import logging
import os
import sys
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, TextIO

import structlog

from broker.shells.diskfull import DiskFull, is_disk_full

# One rule for the broker and its agents (workers/protocol.py): which names hold credentials,
# and how short a value is too short to mask (it would mask ordinary words and numbers).
from workers.protocol import MASK, looks_secret  # noqa: F401 - looks_secret is this module's API too
from workers.protocol import MIN_SECRET_LEN as _MIN_SECRET_LEN
from workers.protocol import one_shot_encoder

_secret_values: set[str] = set()
_longest_first: tuple[str, ...] = ()  # _secret_values, longest first (a secret inside another)
_secret_keys: dict[str, bool] = {}  # looks_secret, remembered per key (log keys are few)


def register_secret(value: str) -> None:
    """Mask ``value`` wherever it appears in a later log line (ignored if shorter than 6)."""
    global _longest_first
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LEN and value not in _secret_values:
        _secret_values.add(value)
        _longest_first = tuple(sorted(_secret_values, key=len, reverse=True))


def _secret_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    hit = _secret_keys.get(key)
    if hit is None:
        if len(_secret_keys) > 4096:  # keys from data (a fleet's type names): keep it bounded
            _secret_keys.clear()
        hit = _secret_keys[key] = looks_secret(key)
    return hit


def register_secrets_in(mapping: Any) -> None:
    """Register the values of a mapping's secret-looking names (``os.environ``, a bag's env)."""
    for name, value in dict(mapping).items():
        if looks_secret(str(name)):
            register_secret(value)


def mask_secrets(value: Any) -> Any:
    """``value`` with secret-named entries and registered secret values masked, at any depth."""
    if isinstance(value, str):
        for secret in _longest_first:
            if secret in value:
                value = value.replace(secret, MASK)
        return value
    if isinstance(value, dict):
        return {k: MASK if _secret_key(k) else mask_secrets(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(v) for v in value)
    return value


def _mask_flat(fields: dict[str, Any]) -> dict[str, Any]:
    """:func:`mask_secrets` of an event's fields, in one pass for the common flat case: a
    scalar that is not a string holds no secret, a string shorter than any secret holds none;
    a nested value goes through :func:`mask_secrets`."""
    out: dict[str, Any] = {}
    secrets = _longest_first
    for key, value in fields.items():
        hit = _secret_keys.get(key)
        if hit is None:
            hit = _secret_key(key)
        if hit:
            out[key] = MASK
        elif type(value) is str:
            if secrets and len(value) >= _MIN_SECRET_LEN:
                for secret in secrets:
                    if secret in value:
                        value = value.replace(secret, MASK)
            out[key] = value
        elif value is None or type(value) in (int, float, bool):
            out[key] = value
        else:
            out[key] = mask_secrets(value)
    return out


def redact(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return mask_secrets(event)


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
           "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL}


def configure_logging(
    level: str = "info",
    stream: TextIO | None = None,
    json: bool | None = None,
    extra_files: list[TextIO] | None = None,
    bind: dict[str, Any] | None = None,
) -> None:
    """Route structlog (and stdlib logging, e.g. APScheduler's tracebacks) to ``stream``.

    ``json=None`` picks JSON unless ``stream`` is a terminal. ``extra_files`` receive every
    event (all levels) as JSON lines (the run directory's ``events.jsonl``). ``bind`` adds its
    keys to every event from every thread (``run_id`` during a run), unless the event has them.
    ``stream=None`` writes to whatever ``sys.stderr`` is at the time of each line, so that a
    live progress display that redirects it (:mod:`broker.cli.terminal`) prints log lines
    above its bars, never through them.
    """
    def console() -> TextIO:
        return stream if stream is not None else sys.stderr

    register_secrets_in(os.environ)
    tty = hasattr(console(), "isatty") and console().isatty()
    if json is None:
        json = not tty
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if bind:
        context = dict(bind)

        def add_context(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
            for key, value in context.items():
                event.setdefault(key, value)
            return event

        shared.insert(0, add_context)
    json_renderer = structlog.processors.JSONRenderer(serializer=_strict_json)
    renderer: Any = json_renderer if json else _compact_console(tty)
    processors = shared + [structlog.processors.format_exc_info, redact]  # tracebacks masked too
    console_level = _LEVELS[level.lower()]
    shown = _console_filter(console_level, curated=tty and not json and console_level == logging.INFO)
    sinks: list[tuple[Any, Any]] = [(None, renderer)] + [(f, json_renderer) for f in extra_files or []]
    fan_out = _fan_out(sinks, console, renderer, shown)
    # The record (extra files) takes every level; the console filters in fan_out.
    floor = logging.DEBUG if extra_files else console_level
    chain = processors + [fan_out]
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(floor),
        cache_logger_on_first_use=False,
    )
    global _route
    _route = _Route(chain, sinks, console, renderer, renderer is json_renderer, shown, floor, dict(bind or {}))
    # stdlib logging (APScheduler, paramiko, botocore) goes through the same sinks at WARNING+.
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_broker", False):
            root.removeHandler(h)
    handler = _StructlogHandler()
    handler._broker = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


def _console_filter(console_level: int, curated: bool) -> Callable[[dict[str, Any]], bool]:
    """Whether the console shows an event: at or above its level; on a terminal at info, only
    what a person follows (``CONSOLE_EVENTS``, a re-plan only when the fleet or the cost
    changes) and every warning."""
    from broker.shells.events import CONSOLE_EVENTS

    last_plan: list[Any] = [None]

    def shown(event: dict[str, Any]) -> bool:
        at = _LEVELS.get(str(event.get("level", "info")), logging.INFO)
        if at < console_level:
            return False
        if not curated or at >= logging.WARNING:
            return True
        if event.get("event") == "plan.solved" and "run_id" in event:
            key = (str(event.get("fleet")), round(float(event.get("cost_usd") or 0.0), 2))
            if key == last_plan[0]:
                return False  # a re-plan that keeps the fleet and the cost says nothing new
            last_plan[0] = key
        return event.get("event") in CONSOLE_EVENTS

    return shown


def _fan_out(sinks: list[tuple[Any, Any]], console: Callable[[], TextIO], renderer: Any,
             shown: Callable[[dict[str, Any]], bool]) -> Callable[..., str]:
    """The last processor: each event to the console (``None`` sink, filtered) and to every file
    (whole lines; a full disk drops that file and says so on the console)."""

    def fan_out(logger: Any, name: str, event: dict[str, Any]) -> str:
        if getattr(_local, "held", None):  # this thread's held lines go first: lines keep their order
            _release_held()
        lines: dict[int, str] = {}  # one rendering per renderer (the JSON one serves every file)
        for sink, render in list(sinks):
            line = lines.get(id(render))
            if sink is None:
                if shown(event):
                    if line is None:
                        line = lines[id(render)] = render(logger, name, dict(event))
                    out = console()
                    out.write(line + "\n")
                    out.flush()
                continue
            if line is None:
                line = lines[id(render)] = render(logger, name, dict(event))
            _to_file(sinks, (sink, render), line, event, console, renderer)
        raise structlog.DropEvent

    return fan_out


def _to_file(sinks: list[tuple[Any, Any]], entry: tuple[Any, Any], line: str, event: dict[str, Any],
             console: Callable[[], TextIO], renderer: Any) -> None:
    """One line to one file sink; a full disk drops that file (from ``sinks``) and says so on
    the console."""
    sink = entry[0]
    try:
        _append_line(sink, line)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        sinks.remove(entry)
        where = getattr(sink, "name", "<log file>")
        note = DiskFull(os.path.dirname(os.path.abspath(where)) if isinstance(where, str) else where,
                        f"{where} stops before this event ({exc.strerror}); later events go to "
                        "stderr only; every line written before is whole")  # fmt: skip
        name = str(event.get("event"))
        warning = {**event, "event": "log.disk_full", "level": "error", "message": str(note),
                   "dropped_event": name}  # fmt: skip
        console().write(renderer(None, name, warning) + "\n")
        console().flush()


class _Route:
    """Where :func:`configure_logging` sends events, for :func:`write_event`'s direct path."""

    def __init__(self, chain: list[Any], sinks: list[tuple[Any, Any]], console: Callable[[], TextIO],
                 renderer: Any, console_json: bool, shown: Callable[[dict[str, Any]], bool], floor: int,
                 bind: dict[str, Any]) -> None:
        self.chain, self.last, self.sinks, self.console, self.renderer = chain, chain[-1], sinks, console, renderer
        self.console_json, self.shown, self.floor, self.bind = console_json, shown, floor, bind


_route: _Route | None = None
_strict = one_shot_encoder(json_module.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str, allow_nan=False))
_RESERVED = frozenset(("event", "level", "timestamp"))
_loose = json_module.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode  # the journal's


def _in_force(route: _Route) -> bool:
    """Whether structlog still runs :func:`configure_logging`'s chain (capture_logs swaps its
    processors in place)."""
    chain = structlog.get_config()["processors"]
    return chain is route.chain and bool(chain) and chain[-1] is route.last


def write_event(name: str, fields: dict[str, Any], *, level: str = "info",
                context: dict[str, Any] | None = None) -> str:
    """Log one event with one masking pass and one JSON encoding: the same line goes to
    ``events.jsonl`` and (off a terminal) the console; returns the masked fields as the
    journal stores them (:meth:`Journal.record_event` takes the string as is), so a per-task
    event is formatted and masked once however many places receive it. Inside
    :func:`held_events` the line is written when the block ends.

    When the set-up of :func:`configure_logging` is not the one in force (a test capturing
    log events, a tool that configured its own), the event goes through structlog as usual.
    """
    masked = _mask_flat(fields)
    try:
        encoded = _strict(masked)
    except ValueError:  # a non-finite number: null in the log (strict JSON), as is in the journal
        encoded = None
    route = _route
    head = {**(route.bind if route else {}), **(context or {}), **structlog.contextvars.get_contextvars()}
    if (route is None or encoded is None or not _in_force(route)
            or not head.keys().isdisjoint(masked) or not _RESERVED.isdisjoint(masked)):
        structlog.get_logger().bind(**head).log(_LEVELS[level], name, **masked)
        return encoded if encoded is not None else _loose(masked)
    if _LEVELS[level] < route.floor:
        return encoded
    stamp = datetime.now(tz=timezone.utc).isoformat().replace("+00:00", "Z")  # as structlog's TimeStamper
    opening = _line_opening(head, name, level, stamp)
    line = f"{opening}}}" if encoded == "{}" else f"{opening},{encoded[1:]}"
    event = {**head, "event": name, "level": level, "timestamp": stamp, **masked}
    held = getattr(_local, "held", None)
    if held is not None:
        held.append((route, line, event))
    else:
        _deliver(route, [(route, line, event)])
    return encoded


_TS_MARK = "@broker-timestamp@"
_openings: dict[Any, tuple[str, str]] = {}  # (event, level, head) -> the line's head around its timestamp


def _line_opening(head: dict[str, Any], name: str, level: str, stamp: str) -> str:
    """The JSON of ``head`` with ``event``, ``level`` and ``timestamp``, keys sorted, without
    its closing brace; encoded once per (event, level, head) and the timestamp put in."""
    try:
        key: Any = (name, level, tuple(head.items()))
        cut = _openings.get(key)
    except TypeError:  # an unhashable context value: no cache
        key, cut = None, None
    if cut is None:
        parts = _strict({**head, "event": name, "level": level, "timestamp": _TS_MARK})[:-1].split(f'"{_TS_MARK}"')
        if len(parts) != 2:  # the mark inside a context value: no cache
            return _strict({**head, "event": name, "level": level, "timestamp": stamp})[:-1]
        cut = (parts[0], parts[1])
        if key is not None:
            if len(_openings) > 1024:
                _openings.clear()
            _openings[key] = cut
    return f'{cut[0]}"{stamp}"{cut[1]}'


_local = threading.local()  # .held: the lines held by held_events on this thread


@contextmanager
def held_events() -> Iterator[None]:
    """Hold the lines :func:`write_event` writes on this thread until the block ends, then
    write them in their order, one write per file and one to the console: the daemon's loop
    holds a turn's per-task lines, so that the turn's acknowledgements and new work leave
    before them (each line keeps the time it was logged at). A line logged through structlog
    on this thread meanwhile (a warning) first writes out what is held, so lines keep their
    order. Nested blocks write when the outermost ends."""
    if getattr(_local, "held", None) is not None:
        yield
        return
    _local.held = []
    try:
        yield
    finally:
        try:
            _release_held()
        finally:
            _local.held = None


def _release_held() -> None:
    held = getattr(_local, "held", None)
    if not held:
        return
    _local.held = []
    route = held[0][0]
    if all(item[0] is route for item in held):
        _deliver(route, held)
    else:  # logging was configured anew within the block
        for item in held:
            _deliver(item[0], [item])


def _deliver(route: _Route, items: list[tuple[_Route, str, dict[str, Any]]]) -> None:
    """Lines to every file sink (one write each; a full disk: line by line, to say which line
    it stopped at) and the shown ones to the console (one write)."""
    for entry in list(route.sinks):
        sink, render = entry
        if sink is not None:
            if len(items) == 1:
                _to_file(route.sinks, entry, items[0][1], items[0][2], route.console, route.renderer)
                continue
            try:
                _append_line(sink, "\n".join(item[1] for item in items))
            except OSError as exc:  # cut back to whole lines by _append_line
                if not is_disk_full(exc):
                    raise
                for _route_, line, event in items:
                    if entry not in route.sinks:
                        break
                    _to_file(route.sinks, entry, line, event, route.console, route.renderer)
            continue
        shown = [(line, event) for _route_, line, event in items if route.shown(event)]
        if shown:
            out = route.console()
            if route.console_json:
                out.write("".join(line + "\n" for line, _event in shown))
            else:
                out.write("".join(render(None, str(event["event"]), event) + "\n" for _line, event in shown))
            out.flush()


def json_safe(value: Any) -> Any:
    """``value`` with non-finite numbers as None, at any depth (strict JSON has no Infinity)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _strict_json(event: Any, **kw: Any) -> str:
    """JSON that strict parsers read: a non-finite number (an unbounded release time, an
    infinite goal) is written as null, never as the non-standard ``Infinity`` or ``NaN``."""
    import json as _json

    kw.pop("sort_keys", None)
    return _json.dumps(json_safe(event), allow_nan=False, **kw)


def _human(key: str, value: Any) -> str:
    """A field as a person reads it: durations (``*_s``) as ``4h17m``, dollars (``*_usd``) as
    ``$0.17``; JSON keeps the raw numbers."""
    from broker.core.units import format_duration

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.endswith("_usd"):
            return f"${value:,.2f}"
        if key.endswith("_s") and not key.endswith("_ref_s"):
            return format_duration(float(value))
        if key.endswith("_ref_s"):
            return f"{format_duration(float(value))}(ref)"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def _compact_console(colors: bool) -> Any:
    """One short line a person reads: ``02:18:59 info  instance.launch  type=m5.large ...``
    (the clock time of day, UTC; the run id, on every line of a run, is left out)."""
    bright, dim, reset = ("\x1b[1m", "\x1b[2m", "\x1b[0m") if colors else ("", "", "")
    marks = {"warning": "\x1b[33m", "error": "\x1b[31m", "critical": "\x1b[31m"} if colors else {}

    def render(_logger: Any, _name: str, event: dict[str, Any]) -> str:
        event = dict(event)
        stamp = str(event.pop("timestamp", ""))[11:19]
        level = str(event.pop("level", "info"))
        name = str(event.pop("event", ""))
        event.pop("run_id", None)
        trace = event.pop("exception", None)
        fields = " ".join(f"{k}={_human(k, v)}" for k, v in event.items() if v is not None)
        mark = marks.get(level, "")
        line = (f"{dim}{stamp}{reset} {mark}{level:<7}{reset if mark else ''} {bright}{name}{reset}"
                + (f"  {fields}" if fields else ""))
        return line + (f"\n{trace}" if trace else "")

    return render


def _append_line(sink: TextIO, line: str) -> None:
    """One whole line at the end of ``sink``, or none: a partial write is cut back off."""
    data = (line + "\n").encode("utf-8")
    try:
        fd = sink.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests pass StringIO)
        sink.write(line + "\n")
        sink.flush()
        return
    sink.flush()
    start = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os.ftruncate(fd, start)
        raise


class _StructlogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log = structlog.get_logger("stdlib")
        kw: dict[str, Any] = {"logger": record.name}
        if record.exc_info:
            kw["exc_info"] = record.exc_info
        log.log(record.levelno, "stdlib.log", message=record.getMessage(), **kw)


def get_logger(**context: Any) -> Any:
    return structlog.get_logger().bind(**context)
