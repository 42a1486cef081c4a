"""What a person sees on a terminal: live progress bars (rich) with log lines above them, and
the words and figures every command prints the same way.

Bars: :class:`ProgressBoard` draws one or more bars (sampling, tasks, spend or time against
the goal) with `rich`'s live display. While it is live, whatever is written to
``sys.stdout`` and ``sys.stderr`` (both, when they are the terminal the bars are on) is
printed above the bars, never through them: the log's console lines
(:func:`broker.shells.logging.configure_logging` writes to the current ``sys.stderr``), the plan
table, the periodic summary. Off a terminal there are no bars: callers print plain lines.

Figures: :func:`goal_text`, :func:`promise_text`, :func:`money`, :func:`interval_text` format a
goal, a promise (a point, with its ``(1 - delta)`` interval when it has one) and amounts the
same way in ``plan``, ``run``, ``status``, ``report`` and ``runs``. Durations are human
(``10m29s``) everywhere but JSON.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, TextIO

from broker.core.units import format_duration


# -- figures -----------------------------------------------------------------------------------
def money(usd: float | None) -> str:
    if usd is None:
        return "-"
    return f"${usd:,.2f}"


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def goal_text(kind: str | None, value: float | None) -> str:
    """``deadline 10m00s``, ``budget $1.00``, ``front point 2``, ``theta 0.5``, ``cheapest``."""
    if kind in (None, "none") or value is None and kind != "point":
        return "cheapest (no goal)" if kind in (None, "none") else str(kind)
    if kind == "deadline":
        return f"deadline {format_duration(float(value))}"
    if kind == "budget":
        return f"budget {money(float(value))}"
    if kind == "point":
        return f"front point {int(value)}" if value is not None else "front point"
    if kind == "theta":
        return "cheapest (theta 1)" if float(value) >= 1.0 else f"theta {float(value):g}"
    return f"{kind} {value:g}"


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def promise_figures(promise: Any) -> dict[str, Any]:
    """A promise as plain figures: ``makespan_s``, ``cost_usd`` (the point), and when the
    promise carries them (issue 16's promise), ``makespan_s_range``, ``cost_usd_range`` and
    ``confidence``. ``promise`` is a mapping or an object with those names."""
    out: dict[str, Any] = {"makespan_s": _get(promise, "makespan_s"), "cost_usd": _get(promise, "cost_usd")}
    for key in ("makespan_s_range", "cost_usd_range", "confidence"):
        value = _get(promise, key)
        if value is not None:
            out[key] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def interval_text(low: float, high: float, fmt=format_duration, confidence: float | None = None) -> str:
    level = f"{confidence:.0%}: " if confidence is not None else ""
    return f"({level}{fmt(low)}-{fmt(high)})"


def promise_text(promise: Any, *, origin: str = "") -> str:
    """``makespan 10m00s (90%: 9m10s-10m40s), cost $0.17`` (the interval only when present)."""
    p = promise_figures(promise)
    parts = []
    if p["makespan_s"] is not None:
        text = f"makespan {format_duration(p['makespan_s'])}{origin}"
        if "makespan_s_range" in p:
            text += " " + interval_text(*p["makespan_s_range"], confidence=p.get("confidence"))
        parts.append(text)
    if p["cost_usd"] is not None:
        text = f"cost {money(p['cost_usd'])}"
        if "cost_usd_range" in p:
            text += " " + interval_text(*p["cost_usd_range"], fmt=money, confidence=p.get("confidence"))
        parts.append(text)
    return ", ".join(parts) or "no figures"


# -- live bars ---------------------------------------------------------------------------------
def is_terminal(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", None)) and stream.isatty()


class ProgressBoard:
    """Live progress bars on ``stream`` (a terminal), with everything printed meanwhile above them.

    ``bar(key, label, total)`` adds a bar; ``update(key, completed=..., total=..., count=...,
    info=...)`` moves it (``count``: the figures right of the bar, ``info``: the text after). ``start``/``stop`` show and end the live
    display; a stopped board leaves its last drawing in place. ``paused()`` stops it for a
    while (the launch question) and starts it again with the same bars.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.stream = stream or sys.stdout
        self.console = Console(file=self.stream, highlight=False, soft_wrap=False)
        self.progress = Progress(
            TextColumn("{task.description:<9}"), BarColumn(bar_width=30), TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[info]}"), console=self.console, transient=False, auto_refresh=True,
            refresh_per_second=4, redirect_stdout=True, redirect_stderr=is_terminal(sys.stderr),
        )
        self.tasks: dict[str, Any] = {}
        self.live = False

    def bar(self, key: str, label: str, total: float | None, count: str = "", info: str = "") -> None:
        if key in self.tasks:
            self.progress.update(self.tasks[key], description=label, total=total, count=count, info=info)
            return
        self.tasks[key] = self.progress.add_task(label, total=total, count=count, info=info)

    def update(self, key: str, *, completed: float | None = None, total: float | None = None,
               count: str | None = None, info: str | None = None, label: str | None = None) -> None:
        task = self.tasks.get(key)
        if task is None:
            return
        fields: dict[str, Any] = {}
        for name, value in (("completed", completed), ("total", total), ("count", count), ("info", info),
                            ("description", label)):
            if value is not None:
                fields[name] = value
        self.progress.update(task, **fields)

    def remove(self, key: str) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)

    def start(self) -> None:
        if not self.live:
            self.progress.start()
            self.live = True

    def stop(self) -> None:
        if self.live:
            self.progress.refresh()
            self.progress.stop()
            self.live = False

    def print(self, text: str) -> None:
        """A line above the bars (or plainly, when the board is not live)."""
        if self.live:
            self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Take the bars off the screen for a while (a question), then draw them again."""
        was_live = self.live
        if was_live:
            self.progress.live.transient = True  # erased, not left behind as a stale copy
            self.stop()
            self.progress.live.transient = False
        try:
            yield
        finally:
            if was_live:
                self.start()
