"""List scheduling and List_eta (thesis 5.8.4): a hand-checked schedule, Graham's bound on
identical machines, slot capacity respected, List_eta confined to the eta best machines."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from broker.core.pack import Bin, efficiency_order, list_eta, list_schedule


def test_a_hand_checked_schedule():
    # fast: 1 slot of speed 3, $0.10/h (most efficient); wide: 2 slots of speed 1, $0.10/h.
    bins = [Bin("wide", "w", 2, 1.0, 0.10), Bin("fast", "f", 1, 3.0, 0.10)]
    s = list_schedule([6.0, 4.0, 3.0, 3.0, 1.5], bins)
    # t=0: 6 -> fast (ends 2), 4 -> wide slot 0 (ends 4), 3 -> wide slot 1 (ends 3);
    # t=2: 3 -> fast (ends 3); t=3: fast and wide slot 1 free, fast is more efficient:
    # 1.5 -> fast (ends 3.5).
    assert s.assignment.bin_of_task.tolist() == [1, 0, 0, 1, 1]
    assert s.start_s.tolist() == pytest.approx([0, 0, 0, 2, 3])
    assert s.finish_s.tolist() == pytest.approx([4.0, 3.5])
    assert s.makespan_s == pytest.approx(4.0)
    lpt = list_schedule([1.5, 3.0, 6.0, 3.0, 4.0], bins, longest_first=True)
    assert lpt.makespan_s == pytest.approx(4.0)
    assert lpt.assignment.bin_of_task.tolist() == [1, 0, 1, 1, 0]


def test_list_eta_with_one_machine_runs_everything_on_the_most_efficient():
    bins = [Bin("a", "t", 1, 1.0, 0.50), Bin("b", "t", 1, 1.0, 0.10), Bin("c", "t", 1, 1.0, 0.20)]
    s = list_eta([2.0, 1.0, 4.0], bins, 1)
    assert s.assignment.bin_of_task.tolist() == [1, 1, 1]
    assert s.finish_s.tolist() == pytest.approx([0.0, 7.0, 0.0])
    with pytest.raises(ValueError, match="eta must be between 1 and .*3"):
        list_eta([1.0], bins, 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1_000.0), max_size=60), st.integers(1, 8), st.integers(1, 3),
       st.booleans())
def test_grahams_bound_on_identical_machines(sizes, n_machines, slots, longest_first):
    bins = [Bin(f"m{i}", "t", slots, 1.0, 0.1) for i in range(n_machines)]
    s = list_schedule(sizes, bins, longest_first=longest_first)
    q = n_machines * slots
    p_max = max(sizes, default=0.0)
    assert s.makespan_s <= sum(sizes) / q + (1 - 1 / q) * p_max + 1e-6
    assert s.makespan_s >= max(p_max, sum(sizes) / q) - 1e-6


@st.composite
def eta_cases(draw):
    bins = draw(st.lists(st.builds(lambda k, sp, p, i: Bin(f"b{i}", "t", k, sp, p),
                                   st.integers(1, 3), st.sampled_from([0.5, 1.0, 4.0]),
                                   st.sampled_from([0.0, 0.08, 0.165, 0.66]), st.integers(0, 10**6)),
                         min_size=1, max_size=8))
    eta = draw(st.integers(1, len(bins)))
    sizes = draw(st.lists(st.floats(0.0, 100.0), max_size=40))
    return sizes, bins, eta


@settings(max_examples=200, deadline=None)
@given(eta_cases())
def test_list_eta_uses_only_the_eta_most_efficient_machines_and_never_overlaps_a_slot(case):
    sizes, bins, eta = case
    s = list_eta(sizes, bins, eta)
    allowed = set(efficiency_order(bins)[:eta].tolist())
    assert set(s.assignment.bin_of_task.tolist()) <= allowed
    assert all(s.finish_s[i] == 0 for i in range(len(bins)) if i not in allowed)
    sizes = np.array(sizes)
    for i, b in enumerate(bins):
        mine = np.flatnonzero(s.assignment.bin_of_task == i)
        ends = s.start_s[mine] + sizes[mine] / b.speed
        if mine.size:
            assert ends.max() == pytest.approx(s.finish_s[i])
        # At every start, at most `slots` tasks of this machine are running.
        for t in s.start_s[mine]:
            running = ((s.start_s[mine] <= t) & (ends > t)).sum()
            assert running <= b.slots
