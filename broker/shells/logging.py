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
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog

from broker.shells.diskfull import DiskFull, is_disk_full

# One rule for the broker and its agents (workers/protocol.py): which names hold credentials,
# and how short a value is too short to mask (it would mask ordinary words and numbers).
from workers.protocol import MASK, looks_secret  # noqa: F401 - looks_secret is this module's API too
from workers.protocol import MIN_SECRET_LEN as _MIN_SECRET_LEN

_secret_values: set[str] = set()


def register_secret(value: str) -> None:
    """Mask ``value`` wherever it appears in a later log line (ignored if shorter than 6)."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LEN:
        _secret_values.add(value)


def register_secrets_in(mapping: Any) -> None:
    """Register the values of a mapping's secret-looking names (``os.environ``, a bag's env)."""
    for name, value in dict(mapping).items():
        if looks_secret(str(name)):
            register_secret(value)


def mask_secrets(value: Any) -> Any:
    """``value`` with secret-named entries and registered secret values masked, at any depth."""
    if isinstance(value, str):
        for secret in sorted(_secret_values, key=len, reverse=True):
            if secret in value:
                value = value.replace(secret, MASK)
        return value
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and looks_secret(k) else mask_secrets(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(v) for v in value)
    return value


def redact(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return mask_secrets(event)


def configure_logging(
    level: str = "info",
    stream: TextIO | None = None,
    json: bool | None = None,
    extra_files: list[TextIO] | None = None,
    bind: dict[str, Any] | None = None,
) -> None:
    """Route structlog (and stdlib logging, e.g. APScheduler's tracebacks) to ``stream``.

    ``json=None`` picks JSON unless ``stream`` is a terminal. ``extra_files`` receive the
    same events as JSON lines (the run directory's ``events.jsonl``). ``bind`` adds its keys
    to every event from every thread (``run_id`` during a run), unless the event has them.
    """
    stream = stream or sys.stderr
    register_secrets_in(os.environ)
    if json is None:
        json = not (hasattr(stream, "isatty") and stream.isatty())
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
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty() if hasattr(stream, "isatty") else False)
    )
    processors = shared + [structlog.processors.format_exc_info, redact]  # tracebacks masked too
    sinks = [(stream, renderer)]
    json_renderer = structlog.processors.JSONRenderer(sort_keys=False)
    for f in extra_files or []:
        sinks.append((f, json_renderer))

    def fan_out(logger: Any, name: str, event: dict[str, Any]) -> str:
        for sink, render in list(sinks):
            line = render(logger, name, dict(event))
            if sink is stream:
                sink.write(line + "\n")
                sink.flush()
                continue
            try:
                _append_line(sink, line)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                sinks.remove((sink, render))
                where = getattr(sink, "name", "<log file>")
                note = DiskFull(os.path.dirname(os.path.abspath(where)) if isinstance(where, str) else where,
                                f"{where} stops before this event ({exc.strerror}); later events go to "
                                "stderr only; every line written before is whole")  # fmt: skip
                warning = {**event, "event": "log.disk_full", "level": "error", "message": str(note),
                           "dropped_event": name}  # fmt: skip
                stream.write(renderer(logger, name, warning) + "\n")
                stream.flush()
        raise structlog.DropEvent

    structlog.configure(
        processors=processors + [fan_out],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        cache_logger_on_first_use=False,
    )
    # stdlib logging (APScheduler, paramiko, botocore) goes through the same sinks at WARNING+.
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_broker", False):
            root.removeHandler(h)
    handler = _StructlogHandler()
    handler._broker = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


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
