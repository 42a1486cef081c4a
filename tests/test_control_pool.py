import numpy as np
from hypothesis import given, settings, strategies as st

from broker.core.control.pool import TaskPool

estimates = st.lists(st.one_of(st.none(), st.floats(0, 1000, allow_nan=False)), min_size=0, max_size=40)


@given(estimates, st.floats(0, 1200, allow_nan=False), st.floats(0.1, 1000, allow_nan=False), st.data())
@settings(max_examples=200)
def test_largest_fitting_matches_brute_force(ests, limit, mean, data):
    pool = TaskPool()
    for i, e in enumerate(ests):
        pool.add(f"t{i}", e)
    taken = set(data.draw(st.lists(st.sampled_from([f"t{i}" for i in range(len(ests))] or ["x"]), max_size=5)))
    got = pool.largest_fitting(limit, mean, taken)
    sizes = {f"t{i}": (mean if e is None else e) for i, e in enumerate(ests) if f"t{i}" not in taken}
    fitting = {t: v for t, v in sizes.items() if v <= limit}
    if not fitting:
        assert got is None
    else:
        assert got is not None
        assert got[1] == max(fitting.values())
        assert sizes[got[0]] == got[1]


@given(estimates, st.data())
def test_remove_keeps_totals_and_membership(ests, data):
    pool = TaskPool()
    for i, e in enumerate(ests):
        pool.add(f"t{i}", e)
    ids = [f"t{i}" for i in range(len(ests))]
    gone = data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    for t in gone:
        pool.remove(t)
    left = [i for i, t in enumerate(ids) if t not in gone]
    assert len(pool) == len(left)
    assert abs(pool.known_total_ref_s - sum(ests[i] for i in left if ests[i] is not None)) < 1e-6
    for i, t in enumerate(ids):
        assert (t in pool) == (i in left)


def test_draw_is_uniform():
    pool = TaskPool()
    for i in range(10):
        pool.add(f"t{i}", float(i) if i % 2 else None)
    rng = np.random.default_rng(7)
    counts = {}
    for _ in range(20000):
        t = pool.draw(rng)
        counts[t] = counts.get(t, 0) + 1
    # chi-square with 9 degrees of freedom; 27.9 is the 0.999 quantile
    expected = 2000
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert len(counts) == 10 and chi2 < 27.9


def test_draw_skips_taken_tasks():
    pool = TaskPool()
    for i in range(3):
        pool.add(f"t{i}")
    rng = np.random.default_rng(1)
    assert pool.draw(rng, {"t0", "t1"}) == "t2"
    assert pool.draw(rng, {"t0", "t1", "t2"}) is None


def test_a_retry_waits_behind_the_tasks_already_pending():
    pool = TaskPool()
    pool.extend((f"t{i}", None) for i in range(4))
    taken = pool.largest_fitting(1e9, 1.0)[0]
    pool.remove(taken)
    pool.add(taken, None, last=True)
    order = []
    while len(pool):
        tid = pool.largest_fitting(1e9, 1.0)[0]
        pool.remove(tid)
        order.append(tid)
    assert order[-1] == taken and sorted(order) == [f"t{i}" for i in range(4)]
