"""YAML read into a tree that remembers where every value was written.

PyYAML's ``safe_load`` returns plain Python values and forgets positions, so a validator
could only say *what* is wrong, not *where*. Here the document is composed into PyYAML's
node graph (which carries marks) and converted into :class:`Node` objects: each holds the
constructed value and the 1-based line and column of the value, plus the line of its key
when it is a mapping member. Validators read values from nodes and cite ``node.where``.

Mapping keys are kept as the text the user typed (``yes:`` stays ``"yes"``, not ``True``),
duplicate keys are reported rather than silently overwritten, ``<<: *anchor`` merge keys
work as in YAML 1.1, and an unquoted ``1e-3`` is a number (as in YAML 1.2), not a string.
Anything the parser rejects becomes one :class:`Problem` with the parser's line, column
and reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from .errors import ConfigError, Problem

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
# YAML 1.1 (PyYAML) reads an unquoted 1e-3 as a string, because its floats need a dot; YAML
# 1.2 and every user read it as a number, so plain scalars of this form become floats.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


@dataclass(frozen=True, slots=True)
class Node:
    """One YAML value and its position.

    ``value`` is a scalar (``None``, ``bool``, ``int``, ``float``, ``str``, or another type
    YAML constructs, e.g. a date), a ``tuple[Node, ...]`` for a sequence, or a
    ``dict[str, Node]`` for a mapping. ``line`` and ``column`` are 1-based; ``key_line`` is the
    line of the key when this node is the value of a mapping member.
    """

    value: Any
    line: int
    column: int
    key_line: int | None = None

    @property
    def where(self) -> int:
        """The line a problem about this member should cite: its key's, else its own."""
        return self.key_line if self.key_line is not None else self.line

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.value, tuple)


def load_yaml(text: str, source: str) -> Node | None:
    """Parse ``text`` (one YAML document) into a :class:`Node`; ``None`` for an empty document.

    Raises :class:`ConfigError` naming ``source`` and the line for malformed YAML, more than
    one document, duplicate keys and keys that are not plain scalars.
    """
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        problems: list[Problem] = []
        node = _convert(loader, root, None, source, problems)
    except yaml.YAMLError as exc:
        raise ConfigError([_parser_problem(exc, source)]) from None
    finally:
        loader.dispose()
    if problems:
        raise ConfigError(problems)
    return node


def _parser_problem(exc: yaml.YAMLError, source: str) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    reason = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    if context:
        reason = f"{context}: {reason}"
    if mark is None:
        return Problem(source, None, f"malformed YAML: {reason}")
    return Problem(source, None, f"malformed YAML at column {mark.column + 1}: {reason}", mark.line + 1)


def _convert(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    key_line: int | None,
    source: str,
    problems: list[Problem],
) -> Node:
    line, column = node.start_mark.line + 1, node.start_mark.column + 1
    if isinstance(node, yaml.MappingNode):
        return Node(_members(loader, node, source, problems), line, column, key_line)
    if isinstance(node, yaml.SequenceNode):
        items = tuple(_convert(loader, item, None, source, problems) for item in node.value)
        return Node(items, line, column, key_line)
    if node.style is None and node.tag == _STR_TAG and _EXPONENT_FLOAT.match(node.value):
        return Node(float(node.value), line, column, key_line)
    try:
        value = loader.construct_object(node)
    except (ValueError, TypeError) as exc:  # e.g. ``!!int abc``: the tag's constructor refused it
        problems.append(Problem(source, None, f"cannot read {node.value!r} as {node.tag}: {exc}", line))
        value = None
    return Node(value, line, column, key_line)


def _members(
    loader: yaml.SafeLoader, node: yaml.MappingNode, source: str, problems: list[Problem]
) -> dict[str, Node]:
    first_line: dict[str, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key_line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            problems.append(Problem(source, None, "a mapping key must be a plain name, not a list or mapping", key_line))
            continue
        if key_node.value in first_line:
            problems.append(
                Problem(
                    source,
                    None,
                    f"duplicate key '{key_node.value}' (first given on line {first_line[key_node.value]})",
                    key_line,
                )
            )
        else:
            first_line[key_node.value] = key_line
    # Merged members come first and explicit ones after, so an explicit key overrides a merged one.
    loader.flatten_mapping(node)
    members: dict[str, Node] = {}
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            key_line = key_node.start_mark.line + 1
            members[key_node.value] = _convert(loader, value_node, key_line, source, problems)
    return members
