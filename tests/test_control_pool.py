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


def _reference_largest(pool_items, limit, mean, taken):
    """The rule, by brute force over (id, estimate or None, stack position) in take order."""
    known = sorted((e, t) for t, e, _ in pool_items if e is not None)
    best = None
    for e, t in reversed(known):
        if e <= limit and t not in taken:
            best = (t, e)
            break
    if mean <= limit and (best is None or mean >= best[1]):
        for t, e, _ in sorted((x for x in pool_items if x[1] is None), key=lambda x: -x[2]):
            if t not in taken:
                return (t, mean)
    return best


def _reference_smallest(pool_items, mean, taken):
    known = sorted((e, t) for t, e, _ in pool_items if e is not None)
    unknown = [t for t, e, _ in sorted((x for x in pool_items if x[1] is None), key=lambda x: -x[2])]
    for e, t in known:
        if t not in taken:
            if unknown and mean < e:
                break
            return (t, e)
    for t in unknown:
        if t not in taken:
            return (t, mean)
    return None


def _stack_items(pool):
    return [(t, pool.estimate(t), pool._unknown_pos.get(t, -1)) for t in pool.task_ids()]


@given(st.lists(st.one_of(st.none(), st.integers(0, 20).map(float)), min_size=1, max_size=60), st.data())
@settings(max_examples=150)
def test_picks_of_one_decision_match_the_scan_as_taken_grows(ests, data):
    """A decision picks many tasks into one growing ``taken`` set; the pool's remembered jumps
    over taken runs must answer what a scan from scratch answers, also after the pool changes
    or when another set is asked about in between (the memo is dropped, not trusted)."""
    pool = TaskPool()
    pool.extend((f"t{i}", e) for i, e in enumerate(ests))
    taken: set[str] = set()
    next_id = len(ests)
    for _ in range(data.draw(st.integers(1, 80))):
        op = data.draw(st.sampled_from(["largest", "largest", "smallest", "other", "mutate", "new"]))
        if op == "mutate":  # the shell changes the pool (between decisions; or the same set kept)
            if len(pool) and data.draw(st.booleans()):
                pool.remove(data.draw(st.sampled_from(list(pool.task_ids()))))
            else:
                pool.add(f"t{next_id}", data.draw(st.one_of(st.none(), st.integers(0, 20).map(float))),
                         last=data.draw(st.booleans()))
                next_id += 1
            if data.draw(st.booleans()):
                taken = set()
            continue
        if op == "new":
            taken = set()
            continue
        if op == "other":  # another set in between (a spot node's taken | barred)
            other = taken | set(data.draw(st.lists(st.sampled_from(list(pool.task_ids()) or ["x"]), max_size=3)))
            limit = data.draw(st.integers(0, 25).map(float))
            assert pool.largest_fitting(limit, 7.0, other) == _reference_largest(_stack_items(pool), limit, 7.0, other)
            continue
        items = _stack_items(pool)
        if op == "largest":
            limit = data.draw(st.integers(0, 25).map(float))
            got = pool.largest_fitting(limit, 7.0, taken)
            assert got == _reference_largest(items, limit, 7.0, taken)
        else:
            got = pool.smallest(7.0, taken)
            assert got == _reference_smallest(items, 7.0, taken)
        if got is not None:
            taken.add(got[0])


def test_a_pool_changed_under_the_same_taken_set_is_scanned_afresh():
    """Jumps recorded over taken runs are positions: a removal shifts the tasks under them, so
    a remembered jump over [b, c] would then skip d. The pool forgets them when it changes."""
    pool = TaskPool()
    pool.extend([("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0)])
    taken = {"b", "c"}
    assert pool.largest_fitting(3.0, 0.0, taken) == ("a", 1.0)  # scans past c and b: remembers the jump
    pool.remove("a")
    assert pool.largest_fitting(4.0, 0.0, taken) == ("d", 4.0)
    taken.add("d")
    assert pool.largest_fitting(4.0, 0.0, taken) is None
    unknown = TaskPool()
    unknown.extend((t, None) for t in "wxyz")  # taken from the end: z, y, x, w
    taken = {"z", "y"}
    assert unknown.largest_fitting(9.0, 1.0, taken) == ("x", 1.0)
    unknown.remove("w")  # z moves into w's place at the bottom
    unknown.add("v")
    assert unknown.largest_fitting(9.0, 1.0, taken) == ("v", 1.0)
    assert unknown.smallest(1.0, taken | {"v"}) == ("x", 1.0)


@given(estimates, st.floats(0, 1200, allow_nan=False), st.floats(0.1, 1000, allow_nan=False), st.integers(0, 8),
       st.data())
@settings(max_examples=300)
def test_take_largest_is_largest_fitting_repeated(ests, limit, mean, k, data):
    """A node's slots share one limit: one call hands out what one call a slot would, in the
    same order, ties included (dispatch's picks, and so every simulation, stay identical)."""
    ids = [f"t{i}" for i in range(len(ests))]
    before = set(data.draw(st.lists(st.sampled_from(ids or ["x"]), max_size=5)))
    one, batch = TaskPool(), TaskPool()
    for i, e in enumerate(ests):
        one.add(ids[i], e)
        batch.add(ids[i], e)
    taken_one, taken_batch = set(before), set(before)
    # an earlier node's picks in the same decision leave jumps behind in both pools
    for pool, taken in ((one, taken_one), (batch, taken_batch)):
        first = pool.largest_fitting(limit, mean, taken)
        if first is not None:
            taken.add(first[0])
    expected = []
    for _ in range(k):
        pick = one.largest_fitting(limit, mean, taken_one)
        if pick is None:
            break
        taken_one.add(pick[0])
        expected.append(pick)
    assert batch.take_largest(limit, mean, taken_batch, k) == expected
    assert taken_batch == taken_one
