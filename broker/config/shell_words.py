"""Filling a command template with values that stay text: each quoted for its shell context.

``CommandFiller(template, unquoted)`` reads a ``str.format`` template once and notes, for each
placeholder, whether it sits outside quotes, inside ``'...'`` or inside ``"..."`` (following
backslash escapes as POSIX sh does). Filling it then quotes each value for that context:

- outside quotes: :func:`shlex.quote`, one shell word (``'; touch x'``, ``''`` for empty);
- inside ``'...'``: each ``'`` of the value closes the quote, is escaped, and reopens it;
- inside ``"..."``: ``\\``, ``"``, ``$`` and backquote are backslash-escaped;
- a parameter named in ``unquoted``: as written (the bag's explicit opt-out).

So no value can end its quotes, start a command substitution or a new command. A placeholder
right after an escaping backslash is refused (``ValueError``): the backslash would escape
the value's first character, whatever the quoting.
"""

from __future__ import annotations

import re
import shlex
import string

# Characters the shell gives a meaning to (a value holding one is worth a warning).
SHELL_META = re.compile(r"[|&;<>()$`\\\"'*?\[\]#~{}!\n]")


class CommandFiller:
    """Fills a command template, quoting each value for the shell context of its placeholder.

    The template is read once: for each placeholder, whether it sits outside quotes, inside
    ``'...'`` or inside ``"..."`` (backslash escapes followed as POSIX sh does).
    """

    def __init__(self, template: str, unquoted: frozenset[str]) -> None:
        self.parts: list[tuple[str, str | None, str, str | None, str]] = []
        state, escaped = "none", False
        for literal, field, spec, conversion in string.Formatter().parse(template):
            state, escaped = _shell_state(literal, state, escaped)
            if field is None:
                self.parts.append((literal, None, "", None, state))
                continue
            if escaped:
                raise ValueError(f"placeholder {{{field}}} follows a backslash, which would escape the first "
                                 "character of its value: remove the backslash")
            root = re.split(r"[.\[]", field, maxsplit=1)[0]
            self.parts.append((literal, field, spec or "", conversion, "raw" if root in unquoted else state))

    def __call__(self, params: dict[str, object]) -> str:
        formatter = string.Formatter()
        out: list[str] = []
        for literal, field, spec, conversion, context in self.parts:
            out.append(literal)
            if field is None:
                continue
            value = formatter.convert_field(formatter.get_field(field, (), params)[0], conversion)
            text = format(value, formatter.vformat(spec, (), params) if spec else "")
            out.append(_QUOTERS[context](text))
        return "".join(out)


def _shell_state(text: str, state: str, escaped: bool) -> tuple[str, bool]:
    """The quoting state after ``text``: ``none``, ``single`` or ``double``, and whether a
    backslash that escapes the next character is pending."""
    for char in text:
        if escaped:
            escaped = False
        elif state == "single":
            state = "none" if char == "'" else state
        elif char == "\\":
            escaped = True
        elif state == "double":
            state = "none" if char == '"' else state
        elif char in "'\"":
            state = "single" if char == "'" else "double"
    return state, escaped


_QUOTERS = {
    "none": shlex.quote,
    "single": lambda text: text.replace("'", "'\\''"),
    "double": lambda text: re.sub(r'([\\"$`])', r"\\\1", text),
    "raw": lambda text: text,
}
