"""The run clock: the one time source of a live or dry run, optionally sped up.

Notation: ``m(t)`` the monotonic clock, ``m_0`` its reading when the clock was made, ``K``
the time scale, ``o`` the run time already elapsed before a resume. Run time is

    now_s = o + K * (m(t) - m_0)

and the journal stores ``epoch_anchor_s + now_s`` so that with ``K = 1`` its times are
ordinary epoch seconds. Every controller time (launches, boot, releases, billing units,
task starts) is run time, so with ``K = 60`` an hourly billing unit passes in 60 wall
seconds, a 90 s boot in 1.5 s and a release timer 60 times sooner.

What does *not* scale is the work itself: a task that sleeps 0.3 s really sleeps 0.3 s and
therefore looks ``0.3 K`` seconds long to the controller (18 s at ``K = 60``). A dry run at
a high scale is thus a faithful rehearsal of a bag whose tasks are ``K`` times longer.
"""

from __future__ import annotations

import time
from typing import Callable


class RunClock:
    """Run time in seconds since the run started (see the module docstring)."""

    def __init__(
        self,
        time_scale: float = 1.0,
        *,
        offset_s: float = 0.0,
        epoch_anchor_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale!r}")
        self.time_scale = float(time_scale)
        self.offset_s = float(offset_s)
        self._monotonic = monotonic
        self._start = monotonic()
        self.epoch_anchor_s = time.time() - self.offset_s if epoch_anchor_s is None else float(epoch_anchor_s)

    def now_s(self) -> float:
        """Run seconds since the run began (resumed runs carry their earlier time)."""
        return self.offset_s + (self._monotonic() - self._start) * self.time_scale

    def epoch_s(self) -> float:
        """The journal's time for now: the run's start as epoch seconds plus run time."""
        return self.epoch_anchor_s + self.now_s()

    def to_epoch_s(self, run_s: float) -> float:
        return self.epoch_anchor_s + run_s

    def to_run_s(self, epoch_s: float) -> float:
        return epoch_s - self.epoch_anchor_s

    def wall_delay_s(self, run_delay_s: float) -> float:
        """Wall seconds until a moment ``run_delay_s`` of run time from now (never negative)."""
        return max(0.0, run_delay_s) / self.time_scale
