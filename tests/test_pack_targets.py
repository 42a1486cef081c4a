"""Workload targets (thesis Eq. 5.4 / 6.3 with the errata) and the packing scores."""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from broker.core.billing import Billing
from broker.core.model import MachineType, PrivateNode
from broker.core.pack import (Assignment, Bin, billing_units, bin_costs_usd, busy_s, cost_usd,
                              makespan_s, workload_targets)

HOUR_S = 3600.0


def test_targets_fill_the_most_efficient_capacity_first_and_come_back_in_input_order():
    bins = [
        Bin("small", "m1.small", 1, 1.0, 0.080),      # 45,000 ref s per USD
        Bin("xlarge", "c1.xlarge", 1, 20.0, 0.660),   # ~109,091
        Bin("medium", "c1.medium", 1, 5.0, 0.165),    # ~109,091 (tie: input order after xlarge)
    ]
    # Horizon 1 h: xlarge reaches 72,000, medium 18,000, small 3,600.
    assert workload_targets(bins, 80_000.0, HOUR_S) == pytest.approx([0.0, 72_000.0, 8_000.0])
    assert workload_targets(bins, 92_000.0, HOUR_S) == pytest.approx([2_000.0, 72_000.0, 18_000.0])


def test_targets_say_when_the_horizon_cannot_hold_the_work():
    bins = [Bin("a", "t", 2, 1.0, 0.1), Bin("b", "t", 1, 1.0, 0.2)]
    targets = workload_targets(bins, 1e9, 100.0)
    assert targets == pytest.approx([200.0, 100.0])  # everything full, the rest is the caller's
    with pytest.raises(ValueError, match="3 horizons given for 2 machines"):
        workload_targets(bins, 1.0, [1.0, 2.0, 3.0])


def test_targets_accept_machine_types_and_per_machine_horizons():
    types = [MachineType("cheap", 4, 1.0, 0.10, limit=5), MachineType("fast", 1, 8.0, 0.40, limit=5)]
    assert workload_targets(types, 1_000.0, [100.0, 100.0]) == pytest.approx([400.0, 600.0])
    capped = [Bin.of_type(types[0], "c1", horizon_s=50.0), Bin.of_type(types[1], "f1")]
    assert workload_targets(capped, 1_000.0, 100.0) == pytest.approx([200.0, 800.0])


def test_a_free_private_node_is_filled_before_any_paid_machine():
    bins = [Bin("paid", "t", 100, 1.0, 0.01), Bin.of_private(PrivateNode("lab", slots=1, speed=1.0))]
    assert workload_targets(bins, 150.0, 100.0) == pytest.approx([50.0, 100.0])


machines = st.lists(
    st.builds(lambda k, sp, p, i: Bin(f"b{i}", "t", k, sp, p),
              st.integers(1, 8), st.floats(0.25, 20.0), st.floats(0.0, 2.0), st.integers(0, 10**6)),
    min_size=1, max_size=12)


@given(machines, st.floats(0.0, 1e6), st.floats(0.0, 1e5))
def test_targets_cover_the_work_in_efficiency_order(bins, total_ref_s, horizon_s):
    targets = np.array(workload_targets(bins, total_ref_s, horizon_s))
    reach = np.array([horizon_s * b.capacity_per_s for b in bins])
    assert (targets >= 0).all() and (targets <= reach * (1 + 1e-12)).all()
    assert targets.sum() == pytest.approx(min(total_ref_s, reach.sum()), rel=1e-9, abs=1e-6)
    # A machine gets work only when every strictly more efficient machine is full.
    for i, b in enumerate(bins):
        if targets[i] > 0:
            for k, other in enumerate(bins):
                if other.efficiency > b.efficiency:
                    assert targets[k] == pytest.approx(reach[k], rel=1e-9)


def test_scores_of_a_hand_checked_assignment():
    bins = (Bin("pub", "t", 2, 1.0, 0.50), Bin("idle", "t", 1, 1.0, 9.99),
            Bin("lab", "lab", 1, 2.0, 0.36, private=True))
    sizes = np.array([3_600.0, 1_800.0, 3_600.0])  # pub: 5,400 ref s on 2 slots = 0.75 h busy
    a = Assignment(bins, sizes, np.array([0, 0, 2]))  # lab: 3,600 ref s at speed 2 = 0.5 h
    assert busy_s(a) == pytest.approx([2_700.0, 0.0, 1_800.0])
    assert makespan_s(a) == pytest.approx(2_700.0)
    hourly = Billing.hourly()
    assert list(billing_units(a, hourly)) == [1, 0, 0]
    assert list(bin_costs_usd(a, hourly)) == pytest.approx([0.50, 0.0, 0.18])
    assert cost_usd(a, hourly) == pytest.approx(0.68)
    assert cost_usd(a, Billing.per_second()) == pytest.approx(0.50 * 0.75 + 0.18)
    # Slot-level finish times (e.g. from a list schedule) replace the fluid busy times.
    assert cost_usd(a, hourly, busy_override_s=np.array([3_700.0, 0.0, 1_800.0])) == pytest.approx(1.18)


def test_an_assignment_refuses_bin_indices_out_of_range():
    with pytest.raises(ValueError, match="bin indices"):
        Assignment((Bin("a", "t", 1, 1.0, 1.0),), np.array([1.0]), np.array([1]))


def test_bins_refuse_nonsense_with_a_message_naming_them():
    with pytest.raises(ValueError, match="'x'.*speed"):
        Bin("x", "t", 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="price"):
        Bin("x", "t", 1, 1.0, math.nan)
