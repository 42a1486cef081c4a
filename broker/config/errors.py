"""Validation problems, collected rather than raised one at a time.

Every problem names the file, the line (when known) or field, and what is wrong, so a user
fixes all of them in one pass. Nothing is started while any problem remains.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    file: str | None
    field: str | None
    message: str
    line: int | None = None  # 1-based

    def render(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        if self.field:
            where += f": {self.field}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """One or more problems in the user's input."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} found; nothing was started:"
        return "\n".join([head] + ["  " + p.render() for p in self.problems])
