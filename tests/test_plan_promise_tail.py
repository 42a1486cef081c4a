"""The promise made part-way through a heavy-tailed bag (issue 16): coverage over seeded runs.

Once 10% of a bag is done, the long tasks are still running: the runtimes seen are the
short ones, the long ones are censored at their age. On lognormal(sigma 1.5) runtimes capped
at a timeout, the promise read off that law missed the delivered makespan in 40% of the
runs of ``bench/promises.py`` (20 seeds, 10,000 tasks) and the cost in 25%: Kaplan-Meier put
the mass of the tasks running past every runtime seen just past the longest one (the mean
came out 5% low on average, up to 3 bootstrap standard errors), and the bootstrap gave the
few long runtimes that carry that mass the weight of the whole sample.

The "truth" is a list scheduler (a heap of slot free times) run on the bag's runtimes; the
forecast gets what the controller has at the moment 10% of the bag has ended: the runtimes
finished, the ages of the running tasks, the count of tasks not started.
"""

import heapq
import math

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.plan.law import _Replicas
from broker.core.plan.promise import IDLE_RELEASE_S, Machine, Pending, RuntimeLaw, forecast

MEAN_S = 600.0
CAP_S = 22 * MEAN_S  # the bench's timeout is 22 mean runtimes (6 h over 980 s)


def fleet_spec():
    """(slots, speed, price/h, billed): a free private node and two hourly instances."""
    return [(8, 1.0, 0.0, False), (4, 2.0, 0.4, True), (4, 2.0, 0.4, True)]


def run(runtimes):
    """The whole run, list-scheduled in bag order: per task (machine, slot, start, end)."""
    spec = fleet_spec()
    heap = [(0.0, i, k) for i, (slots, *_rest) in enumerate(spec) for k in range(slots)]
    heapq.heapify(heap)
    out = []
    for x in runtimes:
        t, i, k = heapq.heappop(heap)
        end = t + x / spec[i][1]
        out.append((i, k, t, end))
        heapq.heappush(heap, (end, i, k))
    return out


def delivered(tasks):
    """Makespan and cost; an instance idle at the bag's end is released once idle for the
    controller's surplus delay (``IDLE_RELEASE_S``), as the forecast has it."""
    spec = fleet_spec()
    makespan = max(e for *_x, e in tasks)
    cost = 0.0
    for i, (_s, _v, price, billed) in enumerate(spec):
        if billed:
            last = max(e for j, _k, _s0, e in tasks if j == i)
            cost += Billing.hourly().cost_usd(max(last, min(makespan, last + IDLE_RELEASE_S)), price)
    return makespan, cost


def at_tenth(runtimes, tasks):
    """What the controller knows once 10% of the bag has ended: (now, finished runtimes,
    the machines with their running tasks' ages, tasks not started)."""
    spec = fleet_spec()
    ends = np.array([e for *_x, e in tasks])
    now = float(np.sort(ends)[len(ends) // 10 - 1])
    finished = [float(x) for x, (_i, _k, s, e) in zip(runtimes, tasks) if e <= now]
    running = {i: [] for i in range(len(spec))}
    for i, _k, s, e in tasks:
        if s <= now < e:
            running[i].append(((now - s) * spec[i][1], None))
    pending = sum(1 for *_x, s, _e in tasks if s > now)
    machines = [Machine(slots, speed, now, math.inf if not billed else 1e9, price,
                        None if not billed else 0.0, Billing.hourly() if billed else None, tuple(running[i]))
                for i, (slots, speed, price, billed) in enumerate(spec)]
    return now, finished, machines, pending


def tenth_coverage(sigma, n_tasks, reps, confidence=0.9):
    inside_m = inside_c = 0
    widths = []
    for seed in range(reps):
        rng = np.random.default_rng(seed)
        x = np.minimum(rng.lognormal(math.log(MEAN_S) - sigma**2 / 2, sigma, n_tasks), CAP_S)
        tasks = run(x)
        now, finished, machines, pending = at_tenth(x, tasks)
        ages = [a for mc in machines for a, _e in mc.running]
        law = RuntimeLaw.observed(finished, ages, CAP_S, fit_tail=True)
        f = forecast(machines, law, Pending(pending), now_s=now, rng=np.random.default_rng(50_000 + seed))
        p = f.promise(confidence)
        a, b = p.holds(*delivered(tasks))
        inside_m += a
        inside_c += b
        widths.append((p.makespan_s_range[1] - p.makespan_s_range[0]) / p.makespan_s)
    return inside_m / reps, inside_c / reps, float(np.median(widths))


@pytest.mark.slow
def test_promise_at_a_tenth_done_covers_a_heavy_tailed_bag():
    """90% intervals made at 10% done on a lognormal(sigma 1.5) bag of 3,000 tasks (300
    runtimes seen), 120 seeded runs: before the fix they held the delivered makespan in 71%
    and the cost in 75%; after it 88% and 88% (a binomial 90% of 120 is below 85% one time
    in twenty: the bound leaves that room, and fails the old code's 71%)."""
    in_m, in_c, width = tenth_coverage(1.5, 3000, 120)
    assert in_m >= 0.82 and in_c >= 0.82, (in_m, in_c, width)


def test_the_law_learned_at_a_tenth_done_is_not_low_and_its_spread_covers_the_mean():
    """At 10% done on lognormal(sigma 1.5) runtimes, the bootstrap's 90% interval of the mean
    holds the true mean in >= 85% of 100 seeded runs and the point is not biased low (before
    the fix: 46% and 5.4% low; the long tasks still running were put just past the longest
    runtime seen, each of the few long runtimes weighed as if the sample were uncensored)."""
    sigma, n = 1.5, 2500
    pop = np.minimum(np.random.default_rng(0).lognormal(math.log(980.0) - sigma**2 / 2, sigma, 2_000_000), 21_600.0)
    truth = float(pop.mean())
    rng = np.random.default_rng(7)
    ratios, inside = [], 0
    for rep in range(100):
        horizon = float(rng.choice([6000.0, 10_000.0, 14_000.0]))
        x = np.minimum(rng.lognormal(math.log(980.0) - sigma**2 / 2, sigma, n), 21_600.0)
        start = rng.uniform(0.0, horizon, n)
        done = start + x < horizon
        law = RuntimeLaw.observed(x[done], (horizon - start)[~done], 21_600.0, fit_tail=True)
        means = _Replicas(law, 400, rng).mean
        lo, hi = np.quantile(means, [0.05, 0.95])
        inside += lo <= truth <= hi
        ratios.append(law.mean_ref_s / truth)
    assert inside >= 85, inside
    assert abs(float(np.mean(ratios)) - 1.0) <= 0.025, float(np.mean(ratios))
