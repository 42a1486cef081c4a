"""The run clock: scaled run time, epoch conversion, wall delays."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.shells.clock import RunClock


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@given(
    scale=st.floats(min_value=0.01, max_value=1e5),
    offset_s=st.floats(min_value=0, max_value=1e6),
    steps=st.lists(st.floats(min_value=0, max_value=100), max_size=20),
)
def test_run_time_is_offset_plus_scaled_wall_time(scale, offset_s, steps):
    mono = FakeMonotonic()
    clock = RunClock(scale, offset_s=offset_s, epoch_anchor_s=1.7e9, monotonic=mono)
    wall = 0.0
    for dt in steps:
        mono.t += dt
        wall += dt
        assert clock.now_s() == pytest.approx(offset_s + scale * wall, rel=1e-9, abs=1e-6)
        assert clock.epoch_s() == pytest.approx(1.7e9 + clock.now_s(), rel=1e-12)
        assert clock.to_run_s(clock.to_epoch_s(clock.now_s())) == pytest.approx(clock.now_s(), abs=1e-6)


def test_an_hourly_unit_at_scale_60_is_a_minute_of_wall_time():
    clock = RunClock(60.0)
    assert clock.wall_delay_s(3600.0) == pytest.approx(60.0)
    assert clock.wall_delay_s(-5.0) == 0.0


def test_scale_must_be_positive():
    with pytest.raises(ValueError):
        RunClock(0.0)
