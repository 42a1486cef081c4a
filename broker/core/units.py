"""Units of the pure core: durations as users write them (``90s``, ``15m``, ``6h``, ``2d``, ``1.5h``
or plain seconds) and their compact human form. Pure: no clock, no I/O."""

from __future__ import annotations

import math
import re

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_duration(value: object) -> float:
    """Seconds in ``value``; raises ``ValueError`` with a message fit for the user."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 90s, 15m, 6h, 2d or seconds, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(f"expected a duration like 90s, 15m, 6h, 2d or seconds, got {value!r}")
        seconds = float(match.group(1)) * _UNITS_S[(match.group(2) or "s").lower()]
    else:
        raise ValueError(f"expected a duration like 90s, 15m, 6h, 2d or seconds, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Compact human form: ``2h05m``, ``14m30s``, ``45s``, ``3d04h``."""
    if not math.isfinite(seconds):
        return "inf"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
