"""BaTS's machine configuration, the baseline policy (ALGORITHMS.md 3.5; BaTS 003 Sec. 2.1).

Type i: a_i machines (0 <= a_i <= A_i, its limit), cost c_i per ATU, mean task runtime T_i on
one slot; a machine of k_i slots runs k_i / T_i tasks per second. For N tasks:

    speed S(a) = sum a_i k_i / T_i,    T_e = N / S(a),    B_e = ceil(T_e / ATU) sum a_i c_i
    maximize S(a)  subject to  B_e <= B.

Exact by dynamic programming over the integer cost per ATU w (in cost units: cents, or a finer
decimal unit when a price needs it), as BaTS does, with capacity sum c_i A_i rather than B:

    P(w) = the greatest speed of any configuration costing exactly w per ATU

(a bounded knapsack, one type at a time: P_i(w) = max over a of P_(i-1)(w - a c_i) + a k_i/T_i).
Every w with a configuration is a candidate; it is feasible when
w ceil(N / (ATU P(w))) <= B (the fastest configuration of a given cost also needs the fewest
ATUs, so no other configuration of that cost can be feasible when it is not). The fastest
feasible candidate wins; equal speeds go to the lower cost.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Mapping, Sequence

import numpy as np

from ..model import MachineType
from .types import OPTIMAL, NewGroup, NoFeasiblePlan, Plan

# Cost units per USD tried in turn: cents, then tenths and hundredths of a cent.
_COST_SCALES = (100, 1_000, 10_000)


def cost_scale(costs_usd: Sequence[float]) -> int:
    """The coarsest unit in which every cost is a whole number (the finest one, rounding up, else)."""
    for scale in _COST_SCALES:
        if all(abs(c * scale - round(c * scale)) < 1e-6 for c in costs_usd):
            return scale
    return _COST_SCALES[-1]


@functools.lru_cache(maxsize=64)
def _knapsack(weights: tuple[int, ...], limits: tuple[int, ...], rates: tuple[float, ...]):
    """P(w) for every cost w per ATU (see the module docstring) and, per type, the machines
    of that type in the best configuration of each cost. Read-only results (cached)."""
    width = sum(w * a for w, a in zip(weights, limits)) + 1
    best = np.full(width, -np.inf)
    best[0] = 0.0
    picks = []  # picks[i][w]: machines of type i in the best configuration of cost w
    for weight, rate, limit in zip(weights, rates, limits):
        new = best.copy()
        pick = np.zeros(width, dtype=np.int32)
        for a in range(1, limit + 1):
            shift = a * weight
            if shift >= width:
                break
            candidate = best[: width - shift] + a * rate
            better = candidate > new[shift:]
            new[shift:][better] = candidate[better]
            pick[shift:][better] = a
        best = new
        picks.append(pick)
    best.flags.writeable = False
    for p in picks:
        p.flags.writeable = False
    return best, tuple(picks)


def bats_configuration(
    types: Sequence[MachineType],
    work_tasks: int,
    mean_runtime_per_type_s: Mapping[str, float],
    budget_usd: float,
    atu_s: float = 3600.0,
) -> Plan:
    """The fastest configuration whose BaTS budget estimate B_e is within ``budget_usd``."""
    if work_tasks <= 0:
        return Plan(makespan_s=0.0, cost_usd=0.0, fleet={t.name: 0 for t in types}, status=OPTIMAL, horizon_s=0.0)
    started = time.perf_counter()
    usable = [t for t in types if t.limit > 0 and t.slots > 0 and mean_runtime_per_type_s.get(t.name, 0) > 0]
    if not usable:
        raise NoFeasiblePlan("BaTS has no machine type with a limit above 0 and a runtime estimate")
    atu_cost_usd = [t.price_per_hour * atu_s / 3600.0 for t in usable]
    scale = cost_scale(atu_cost_usd)
    weights = [math.ceil(c * scale - 1e-6) for c in atu_cost_usd]
    rates = [t.slots / mean_runtime_per_type_s[t.name] for t in usable]  # tasks per second per machine
    # The knapsack depends on the rates only up to a common factor (a re-plan that learns a
    # new mean scales them all): solve it once per catalogue and shape of the rates.
    top = max(rates)
    shape = tuple(round(r / top, 12) for r in rates)
    unit_best, picks = _knapsack(tuple(weights), tuple(t.limit for t in usable), shape)
    best = unit_best * top

    chosen_w, chosen_speed, chosen_atus = None, 0.0, 0
    ws = np.flatnonzero(best > 0)
    if ws.size:
        speeds = best[ws]
        atus = np.maximum(1, np.ceil(work_tasks / (atu_s * speeds) - 1e-9))
        fits = ws * atus <= budget_usd * scale + 1e-6
        if fits.any():
            fastest = speeds[fits].max()
            # the cheapest configuration among the fastest (equal within 1e-12)
            k = int(np.flatnonzero(fits & (speeds >= fastest / (1 + 1e-12)))[0])
            chosen_w, chosen_speed, chosen_atus = int(ws[k]), float(speeds[k]), int(atus[k])
    if chosen_w is None:
        cheapest = min(
            weights[i] * max(1, math.ceil(work_tasks / (atu_s * rates[i]) - 1e-9)) for i in range(len(usable))
        )
        raise NoFeasiblePlan(
            f"budget ${budget_usd:.2f} cannot pay for any BaTS configuration for {work_tasks} tasks: "
            f"the cheapest single-type configuration needs ${cheapest / scale:.2f}"
        )

    counts = [0] * len(usable)
    w = chosen_w
    for i in range(len(usable) - 1, -1, -1):
        counts[i] = int(picks[i][w])
        w -= counts[i] * weights[i]
    makespan_s = work_tasks / chosen_speed
    fleet = {t.name: 0 for t in types}
    capacity: dict[str, float] = {}
    groups = []
    for t, a, rate in zip(usable, counts, rates):
        if a:
            fleet[t.name] = a
            capacity[t.name] = a * rate * makespan_s  # tasks
            groups.append(NewGroup(t.name, a, chosen_atus, chosen_atus * atu_s))
    return Plan(
        makespan_s=makespan_s,
        cost_usd=chosen_w * chosen_atus / scale,
        fleet=fleet,
        new=tuple(groups),
        status=OPTIMAL,
        solve_ms=(time.perf_counter() - started) * 1000.0,
        capacity=capacity,
        horizon_s=chosen_atus * atu_s,
    )
