"""Typed reading of YAML nodes that collects every problem instead of stopping at the first.

A :class:`Checker` belongs to one file. Each reader takes a :class:`Node` and the field's
path (``aws.types[2].price``; sequence indices count from 0), returns the typed value, or
records a :class:`Problem` citing the file, the line and the path and returns ``None``. A
loader reads everything, then calls :meth:`Checker.raise_if_any`, so the user sees all
problems at once and no half-valid object escapes.

Type rules, stricter than Python's on purpose: booleans are not numbers (``slots: true`` is
an error, not 1), integers must be written as integers (``slots: 2.0`` is an error), numbers
must be finite, and strings are never converted to numbers (``price: "0.17"`` is an error).
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Iterable

from broker.core.units import parse_duration
from .errors import ConfigError, Problem
from .yamlsource import Node

_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def join(path: str, key: str | int) -> str:
    """The path of a member: ``join("aws", "types") == "aws.types"``, ``join("types", 2) == "types[2]"``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def describe(value: object) -> str:
    """How a wrongly typed value is named in a message."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, tuple):
        return "a list"
    if isinstance(value, (int, float)):
        return repr(value)
    return f"{value!r} (a {type(value).__name__})"


def suggestion(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'slots'?)`` for a near miss, else the list of valid choices."""
    choices = sorted(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f" (expected one of: {', '.join(choices)})" if choices else ""


class Checker:
    """Reads typed values out of one file's nodes and keeps the problems it finds."""

    def __init__(self, file: str):
        self.file = file
        self.problems: list[Problem] = []

    # -- recording ----------------------------------------------------------------------
    def problem(self, path: str | None, message: str, line: int | None) -> None:
        self.problems.append(Problem(self.file, path or None, message, line))

    def raise_if_any(self) -> None:
        """Raise every problem so far, in line order (problems without a line last)."""
        if self.problems:
            raise ConfigError(sorted(self.problems, key=lambda p: (p.line is None, p.line or 0)))

    # -- containers ---------------------------------------------------------------------
    def mapping(
        self,
        node: Node | None,
        path: str,
        *,
        required: Iterable[str] = (),
        optional: Iterable[str] = (),
    ) -> dict[str, Node] | None:
        """Members of a mapping with only the allowed keys; a null counts as empty.

        Unknown keys are reported (with a suggestion), and so is each missing required key;
        the known members are returned even then, so their own problems get reported too.
        """
        if node is None or node.value is None:
            members: dict[str, Node] = {}
            line = node.where if node is not None else None
        elif node.is_mapping:
            members = node.value
            line = node.where
        else:
            self.problem(path, f"expected a mapping of keys to values, got {describe(node.value)}", node.where)
            return None
        required = tuple(required)
        allowed = set(required) | set(optional)
        known: dict[str, Node] = {}
        for key, member in members.items():
            if key in allowed:
                known[key] = member
            else:
                self.problem(join(path, key), f"unknown key '{key}'{suggestion(key, allowed)}", member.where)
        for key in required:
            if key not in members:
                self.problem(join(path, key), f"missing required key '{key}'", line)
        return known

    def sequence(self, node: Node | None, path: str) -> tuple[Node, ...] | None:
        """Items of a list; a null counts as empty."""
        if node is None or node.value is None:
            return ()
        if not node.is_sequence:
            self.problem(path, f"expected a list, got {describe(node.value)}", node.where)
            return None
        return node.value

    # -- scalars ------------------------------------------------------------------------
    def string(self, node: Node, path: str, *, what: str = "a string") -> str | None:
        if isinstance(node.value, str) and node.value.strip():
            return node.value
        if isinstance(node.value, str):
            self.problem(path, f"expected {what}, got an empty string", node.where)
        else:
            hint = " (quote it)" if isinstance(node.value, (bool, int, float)) else ""
            self.problem(path, f"expected {what}, got {describe(node.value)}{hint}", node.where)
        return None

    def boolean(self, node: Node, path: str) -> bool | None:
        if isinstance(node.value, bool):
            return node.value
        self.problem(path, f"expected true or false, got {describe(node.value)}", node.where)
        return None

    def integer(self, node: Node, path: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = node.value
        bounds = _bounds_text(minimum, maximum)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(path, f"expected an integer{bounds}, got {describe(value)}", node.where)
            return None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            self.problem(path, f"expected an integer{bounds}, got {value}", node.where)
            return None
        return value

    def number(self, node: Node, path: str, *, minimum: float = -math.inf, positive: bool = False) -> float | None:
        """A finite int or float; ``positive`` demands > 0, else ``minimum`` is inclusive."""
        value = node.value
        bounds = " > 0" if positive else (f" >= {minimum:g}" if minimum > -math.inf else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.problem(path, f"expected a number{bounds}, got {describe(value)}", node.where)
            return None
        if (positive and value <= 0) or value < minimum:
            self.problem(path, f"expected a number{bounds}, got {value:g}", node.where)
            return None
        return float(value)

    def duration(self, node: Node, path: str, *, positive: bool = False) -> float | None:
        """Seconds from ``90s``, ``15m``, ``6h``, ``2d`` or a plain number of seconds."""
        try:
            seconds = parse_duration(node.value)
        except ValueError as exc:
            self.problem(path, str(exc), node.where)
            return None
        if positive and seconds <= 0:
            self.problem(path, f"must be longer than 0 seconds, got {describe(node.value)}", node.where)
            return None
        return seconds

    def string_map(
        self, node: Node | None, path: str, *, what: str, identifier_keys: bool
    ) -> dict[str, str] | None:
        """A mapping of the user's names to string values (environment variables, tags).

        ``identifier_keys`` demands names of letters, digits and ``_`` not starting with a digit.
        """
        members = self.mapping_of_anything(node, path)
        if members is None:
            return None
        result: dict[str, str] = {}
        ok = True
        for key, member in members.items():
            member_path = join(path, key)
            if identifier_keys and not _NAME_PATTERN.match(key):
                self.problem(member_path, f"'{key}' is not a valid {what} (letters, digits and _)", member.where)
                ok = False
            value = member.value
            if isinstance(value, str):
                result[key] = value
            else:
                self.problem(member_path, f"expected a string value, got {describe(value)} (quote it)", member.where)
                ok = False
        return result if ok else None

    def mapping_of_anything(self, node: Node | None, path: str) -> dict[str, Node] | None:
        """Members of a mapping whose keys are the user's own names (no fixed schema)."""
        if node is None or node.value is None:
            return {}
        if not node.is_mapping:
            self.problem(path, f"expected a mapping of keys to values, got {describe(node.value)}", node.where)
            return None
        return node.value


def is_identifier(name: str) -> bool:
    """Letters, digits and ``_``, not starting with a digit."""
    return bool(_NAME_PATTERN.match(name))


def _bounds_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""
