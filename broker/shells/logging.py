"""structlog set-up: JSON lines when not on a terminal, console rendering on one.

Event names are stable and dotted (``plan.solved``, ``instance.launch``, ``task.done``);
they are documented in the README's event catalogue. Secrets never reach a log line: the
``redact`` processor masks values of keys that look like credentials.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_SECRET_KEY_PARTS = ("secret", "password", "token", "private_key", "credential", "passphrase")


def redact(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in list(event):
        lowered = key.lower()
        if any(part in lowered for part in _SECRET_KEY_PARTS):
            event[key] = "***"
    return event


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
    if json is None:
        json = not (hasattr(stream, "isatty") and stream.isatty())
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact,
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
    processors = shared + [structlog.processors.format_exc_info]
    sinks = [(stream, renderer)]
    json_renderer = structlog.processors.JSONRenderer(sort_keys=False)
    for f in extra_files or []:
        sinks.append((f, json_renderer))

    def fan_out(logger: Any, name: str, event: dict[str, Any]) -> str:
        line = ""
        for sink, render in sinks:
            line = render(logger, name, dict(event))
            sink.write(line + "\n")
            sink.flush()
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


class _StructlogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log = structlog.get_logger("stdlib")
        kw: dict[str, Any] = {"logger": record.name}
        if record.exc_info:
            kw["exc_info"] = record.exc_info
        log.log(record.levelno, "stdlib.log", message=record.getMessage(), **kw)


def get_logger(**context: Any) -> Any:
    return structlog.get_logger().bind(**context)
