"""Min cost under a deadline: the aggregate fleet ILP (ALGORITHMS.md 3.1).

Given the deadline T (from now), the work W and the ramps of ``capacity.py``:

    variables  y(i,u) in Z>=0   new instances of type i kept u quanta, u = 1 .. U_i = ceil(T / q_i)
               extension of each existing instance e by u_e quanta, u_e = 0 .. ceil((T - p_e) / q_e)
               x_v in [0, 1 - g_v / T]   share of the horizon private node v is busy
    capacity   cap(i,u) = r_i (min(u q_i, T) - b_i - g_i)^+
               cap(e,u) = r_e (min(p_e + u q_e, T) - s_e - g_e)^+     (p_e paid time left, s_e boot left)
               cap(v)   = r_v T x_v
    minimize   sum c_i charged(u) y(i,u) + sum_e (c_e q_e / 3600) u_e + sum_v c_v (T / 3600) x_v
    subject to sum cap >= W;   sum_u y(i,u) + (existing instances of type i) <= L_i

Keeping the model small, exactly. When the minimum billed time fits in the first quantum,
charged(u) = u q_i c_i / 3600 is linear in u and, among instances kept u <= U_i - 2 quanta,
moving one quantum from the shorter to the longer never lowers capacity (the longer gains a
whole quantum, the shorter loses at most one) and keeps the cost. Repeating the move leaves at
most one such instance per type. So each type needs only

    y_full  instances kept U_i quanta,  y_prev  kept U_i - 1 quanta,
    one optional short instance: delta in {0,1}, s in {delta .. (U_i - 2) delta} quanta,
            cap = r_i (q_i s - (b_i + g_i) delta),  cost = c_i q_i s / 3600,

whatever T is. (A short instance with negative modelled capacity is never worth buying.)
When the minimum spans several quanta the model lists y(i,u) for u up to min(U_i, u_sat_i).
Each existing instance likewise needs: d in {0,1} "use the paid time plus v quanta", v in
{0 .. (U_e - 1) d}, f in {0,1} "extend to the horizon", d + f <= 1,
cap = r_e ((p_e - s_e - g_e) d + q_e v) + r_e (T - s_e - g_e)^+ f.
Running instances ready before their paid time ends (p_e >= s_e + g_e, the usual case) need
less: every extension quantum that ends before T adds r q whichever instance gets it, so one
count V stands for all of a type's, and only reaching the horizon differs per instance (a
column per class of equal U_e and p_e; ``_ready_terms``). Instances that are not ready in
their paid time keep the d/v/f variables, summed over those the model cannot tell apart (one
type, launched together). Either way the solver does not branch over which of many equal
(or nearly equal: launched a second apart) instances to keep. Identical private nodes share
one column.

After the solve, private time is set to the cheapest that covers what the instances leave
(``fit_private``: the LP the solver solved once the integers are fixed), the same whichever
solver ran, and kept in seconds: the model runs at min(deadline, saturation horizon) and the
plan is reported at the deadline.

Tie-break: among plans of equal cost the solver prefers fewer paid quanta, then instances
kept equally long (the plan that finishes sooner), then extending a running instance over
launching an equal new one (which would leave the running one to idle out its paid time),
then types listed earlier, and a private node's share over nothing. A new instance kept u of
U quanta also costs ``tie_break_usd x (1 + index / (n + 1)) x (u + u^2 / (U + 1))`` (index =
the type's position in the inventory; convex in u, so 4 instances of 7 quanta beat 3 of 8 and
one of 4), the short instance the chord of that over its range, an extension quantum half of
the linear part (late instances: weighted by their order), a private share a reward of a
quarter of it. The reported cost never includes it.

Solved by ``solver.py`` (HiGHS in process or CBC, exact by default), which reads the true
status: proven optimal -> ``optimal``; stopped with an incumbent -> ``time_limit``; no answer
-> a greedy plan, ``heuristic``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from ..model import ExistingInstance, MachineType, PrivateNode
from .capacity import WORK_RTOL, Catalogue, NewOffer, Ramp, least_time_s
from .solver import OPTIMAL as SOLVED_OPTIMAL
from .solver import Model, lp_solver, solve
from .types import HEURISTIC, OPTIMAL, TIME_LIMIT, Extension, NewGroup, NoFeasiblePlan, Plan, PlanOptions, Work

def min_cost(
    types: Sequence[MachineType],
    private: Sequence[PrivateNode],
    work: Work,
    deadline_s: float,
    *,
    existing: Sequence[ExistingInstance] = (),
    now_s: float = 0.0,
    options: PlanOptions = PlanOptions(),
) -> Plan:
    """The cheapest plan that finishes ``work`` within ``deadline_s`` seconds from ``now_s``.

    Raises :class:`NoFeasiblePlan` (with the fastest and the cheapest possible plans) when no
    plan can finish in time.
    """
    catalogue = Catalogue.build(types, private, work, existing, now_s, options)
    return solve_at(catalogue, work, deadline_s, options)


def solve_at(catalogue: Catalogue, work: Work, deadline_s: float, options: PlanOptions) -> Plan:
    """min_cost on a prepared catalogue (the front and the budget search call this many times)."""
    if not deadline_s > 0:
        raise ValueError(f"a deadline must be > 0 seconds from now, got {deadline_s!r}")
    w = work.total_ref_s
    if w > 0 and catalogue.max_capacity_ref_s(deadline_s) < w * (1 - WORK_RTOL):
        from .search import infeasible_deadline  # the search module solves through this one

        raise infeasible_deadline(catalogue, work, deadline_s, options)
    # Beyond the saturation horizon no plan is cheaper and the ramps are the same: solve there.
    model_s = min(deadline_s, max(catalogue.saturation_horizon_s(w), catalogue.fastest_horizon_s(w)))
    if w <= 0:
        return assemble(catalogue, work, deadline_s, Choice(), OPTIMAL, 0.0)
    return _solve_ilp(catalogue, work, model_s, deadline_s, options)


def nothing_to_run_on() -> NoFeasiblePlan:
    return NoFeasiblePlan(
        "nothing to run on: the inventory has no private node with slots and no instance type "
        "with room under its limit"
    )


# -- the choice a solver makes, and the plan it means ------------------------------------------


@dataclass
class Choice:
    """Solver output in plain numbers: new[(type index, quanta)] = count, extra quanta per
    running instance, seconds each private node works (from its allowance on)."""

    new: dict[tuple[int, int], int] = field(default_factory=dict)
    extra_quanta: dict[str, int] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)

    def add_new(self, index: int, quanta: int, count: int) -> None:
        if count > 0 and quanta > 0:
            self.new[(index, quanta)] = self.new.get((index, quanta), 0) + count


def assemble(
    catalogue: Catalogue, work: Work, horizon_s: float, choice: Choice, status: str, solve_ms: float
) -> Plan:
    """Cost, capacity, makespan and release times of a choice."""
    offers = {o.index: o for o in catalogue.new}
    fleet = {t.name: 0 for t in catalogue.types}
    capacity: dict[str, float] = {}
    ramps: list[Ramp] = []
    cost_usd = 0.0
    groups = []
    for (index, quanta), count in sorted(choice.new.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        offer = offers[index]
        name = offer.type.name
        ramp = Ramp(offer.rate_per_s, offer.start_s, quanta * offer.quantum_s)
        ramps += [ramp] * count
        capacity[name] = capacity.get(name, 0.0) + count * ramp.capacity(horizon_s)
        cost_usd += count * offer.cost_usd(quanta)
        fleet[name] += count
        groups.append(NewGroup(name, count, quanta, offer.paid_s(quanta)))
    extensions = []
    for old in catalogue.existing:
        extra = choice.extra_quanta.get(old.instance.id, 0)
        ramp = old.ramp(extra)
        ramps.append(ramp)
        name = old.type.name
        capacity[name] = capacity.get(name, 0.0) + ramp.capacity(horizon_s)
        cost_usd += extra * old.quantum_usd
        fleet[name] += 1
        extensions.append(Extension(old.instance.id, extra, old.instance.paid_until_s + extra * old.quantum_s))
    shares = {}
    for p in catalogue.private:
        # Busy seconds, not a share: a plan solved at the saturation horizon and reported at a
        # later deadline used to scale its private time (and cost) up with the deadline.
        busy_s = min(horizon_s, max(0.0, choice.busy_s.get(p.node.name, 0.0)))
        shares[p.node.name] = busy_s / horizon_s
        ramps.append(Ramp(p.rate_per_s, p.start_s, p.start_s + busy_s))
        capacity[p.node.name] = p.rate_per_s * busy_s
        cost_usd += p.node.cost_per_hour * busy_s / 3600.0
    makespan_s = min(horizon_s, least_time_s(ramps, work.total_ref_s))
    return Plan(
        makespan_s=makespan_s,
        cost_usd=cost_usd,
        fleet=fleet,
        new=tuple(groups),
        existing=tuple(extensions),
        private_share=shares,
        status=status,
        solve_ms=solve_ms,
        capacity=capacity,
        horizon_s=horizon_s,
    )


def choice_of(catalogue: Catalogue, plan: Plan) -> Choice:
    """The instances of ``plan`` as a Choice (private time left out)."""
    index = {o.type.name: o.index for o in catalogue.new}
    choice = Choice()
    for g in plan.new:
        choice.add_new(index[g.type_name], g.quanta, g.count)
    choice.extra_quanta.update((e.instance_id, e.extra_quanta) for e in plan.existing)
    return choice


def instance_usd(catalogue: Catalogue, choice: Choice) -> float:
    offers = {o.index: o for o in catalogue.new}
    usd = sum(count * offers[i].cost_usd(u) for (i, u), count in choice.new.items())
    return usd + sum(choice.extra_quanta.get(o.instance.id, 0) * o.quantum_usd for o in catalogue.existing)


def fit_private(catalogue: Catalogue, work: Work, horizon_s: float, choice: Choice) -> float | None:
    """Give ``choice`` the cheapest private time that covers, with its instances, the work by
    ``horizon_s``; return what it costs (None: not even all of it covers the work).

    The fractional knapsack the solver's LP solves once the instances are fixed, solved here
    the same way whichever solver ran: nodes by USD per reference second (inventory order
    among equals, identical nodes equally), free nodes to the horizon. (Solvers stop within
    their tolerance, and CBC left shares 1e-6 above what the plan needs.)"""
    offers = {o.index: o for o in catalogue.new}
    have = sum(count * Ramp(offers[i].rate_per_s, offers[i].start_s, u * offers[i].quantum_s).capacity(horizon_s)
               for (i, u), count in choice.new.items())
    have += sum(o.ramp(choice.extra_quanta.get(o.instance.id, 0)).capacity(horizon_s) for o in catalogue.existing)
    need = work.total_ref_s * (1 - 0.5 * WORK_RTOL) - have
    usd = 0.0
    groups = _identical_private(catalogue.private)
    choice.busy_s = {}
    for _, k in sorted((group[0].cost_per_ref_s_usd(), k) for k, group in enumerate(groups)):
        p, size = groups[k][0], len(groups[k])
        top = max(0.0, horizon_s - p.start_s)
        busy = top if p.node.cost_per_hour <= 0 else min(top, max(0.0, need) / (p.rate_per_s * size))
        choice.busy_s.update((q.node.name, busy) for q in groups[k])
        need -= busy * p.rate_per_s * size
        usd += busy * p.node.cost_per_hour / 3600.0 * size
    return usd if need <= 0.25 * WORK_RTOL * work.total_ref_s else None


# -- the ILP -------------------------------------------------------------------------------------


def _quanta_to(horizon_s: float, quantum_s: float) -> int:
    return max(1, math.ceil(horizon_s / quantum_s - 1e-9))


@dataclass
class _Ilp:
    """The model being built: a ``solver.Model``, each column's capacity (reference seconds up
    to the horizon) and the readers that turn a solution into a :class:`Choice`."""

    model: Model = field(default_factory=Model)
    capacity: dict[int, float] = field(default_factory=dict)
    readers: list = field(default_factory=list)
    fixed_ref_s: float = 0.0  # capacity that needs no decision (paid time of running instances)

    def column(self, name: str, upper: float, usd: float, capacity_ref_s: float, integer: bool = True) -> int:
        j = self.model.var(name, 0.0, upper, usd, integer)
        if capacity_ref_s:
            self.capacity[j] = capacity_ref_s
        return j

    def choice(self, values) -> Choice:
        choice = Choice()
        for read in self.readers:
            read(choice, values)
        return choice


def _solve_ilp(catalogue: Catalogue, work: Work, model_s: float, horizon_s: float, options: PlanOptions) -> Plan:
    started = time.perf_counter()
    T = model_s
    ilp = _model_at(catalogue, work, T, options)
    if ilp is None:
        return assemble(catalogue, work, horizon_s, Choice(), OPTIMAL, _ms_since(started))
    # If a solver finds nothing, or a plan short of the work, the row is tightened by one part
    # in 1e6 and solved once more before the greedy fallback.
    row, lower, upper, name = ilp.model.rows[-1]
    for slack in (0.0, 1e-6):
        ilp.model.rows[-1] = (row, lower + slack, upper, name)
        solution = solve(ilp.model, solver=options.solver, time_limit_s=options.time_limit_s,
                         gap_rel=options.gap_rel, gap_abs=options.gap_abs_usd)
        if not solution.feasible:
            continue
        choice = ilp.choice(solution.values)
        solver_busy = dict(choice.busy_s)
        if fit_private(catalogue, work, T, choice) is None:
            choice.busy_s = solver_busy
        plan = assemble(catalogue, work, horizon_s, choice, OPTIMAL if solution.status == SOLVED_OPTIMAL else TIME_LIMIT, 0.0)
        if sum(plan.capacity.values()) >= work.total_ref_s * (1 - WORK_RTOL):
            return dataclasses.replace(plan, solve_ms=_ms_since(started))
    choice = greedy_choice(catalogue, work, T)
    return assemble(catalogue, work, horizon_s, choice, HEURISTIC, _ms_since(started))


def relaxed_cost(catalogue: Catalogue, work: Work, horizon_s: float, options: PlanOptions) -> float:
    """The LP relaxation's cost at ``horizon_s`` (a lower bound on MinCost there; +inf if no
    plan can meet it): a sub-millisecond estimate the budget search aims its first solve with."""
    T = min(horizon_s, max(catalogue.saturation_horizon_s(work.total_ref_s),
                           catalogue.fastest_horizon_s(work.total_ref_s)))
    if catalogue.max_capacity_ref_s(T) < work.total_ref_s * (1 - WORK_RTOL):
        return math.inf
    ilp = _model_at(catalogue, work, T, options)
    if ilp is None:
        return 0.0
    solver = lp_solver(options.solver)
    if solver is None:
        raise ValueError("relaxed_cost needs HiGHS (highspy)")
    solution = solve(ilp.model, solver=solver, time_limit_s=options.time_limit_s, relax=True)
    return solution.objective if solution.feasible else math.inf


def _model_at(catalogue: Catalogue, work: Work, T: float, options: PlanOptions) -> _Ilp | None:
    """The ILP at horizon T, its work row last; None when nothing needs deciding."""
    # Running instances paid beyond the horizon have nothing to decide (``_existing_terms``
    # gives them no variables), but their capacity up to the horizon is there: the other
    # terms need only cover the rest. (Left out, a re-plan bought new machines for work the
    # paid ones already covered, or found the model infeasible and fell back to greedy.)
    fixed = sum(old.rate_per_s * max(0.0, T - old.start_s) for old in catalogue.existing if old.paid_s >= T)
    ilp = _build(catalogue, work, T, options)
    need = work.total_ref_s - fixed - ilp.fixed_ref_s
    if need <= work.total_ref_s * WORK_RTOL:
        return None
    # The work row is normalized (right-hand side 1): capacities in reference seconds reach
    # 1e6-1e8, and on such rows CBC's feasibility pump has accepted a plan a few reference
    # seconds short and then declared the model infeasible. The right-hand side leaves half
    # the slack everything else allows (``WORK_RTOL``: the fastest-plan check,
    # ``least_time_s``, the brute force in the tests) and the solvers' tolerance is a tenth of
    # that, so a plan the solver accepts is one the rest accepts.
    scale = 1.0 / max(need, 1e-9)
    row = {j: cap * scale for j, cap in ilp.capacity.items()}
    ilp.model.row(row, 1.0 - 0.5 * WORK_RTOL * work.total_ref_s * scale, math.inf, "work")
    return ilp


def _build(catalogue: Catalogue, work: Work, T: float, options: PlanOptions) -> _Ilp:
    ilp = _Ilp()
    n = len(catalogue.types)

    def tie(index: int) -> float:
        return options.tie_break_usd * (1.0 + index / (n + 1))

    for offer in catalogue.new:
        _new_type_terms(ilp, offer, T, work, tie(offer.index))
    ready, late = _running(catalogue.existing, T)
    for k, members in enumerate(ready):
        _ready_terms(ilp, k, members, T, 0.5 * tie(catalogue.types.index(members[0].type)))
    groups = _interchangeable(late, T)
    for k, group in enumerate(groups):
        # Which of two late instances to extend: the first; and a ready instance before any late
        # one (weight 1 there): equal weights let HiGHS and CBC pick different equal-cost plans.
        order = 1.0 + (k + 1) / (len(groups) + 1)
        _existing_terms(ilp, k, group, T, 0.5 * order * tie(catalogue.types.index(group[0].type)))
    for k, group in enumerate(_identical_private(catalogue.private)):
        p = group[0]
        top = max(0.0, 1.0 - p.start_s / T)
        if top <= 0:
            continue
        # One column for the summed share of identical nodes, dealt out equally (which finishes
        # soonest among splits of the same cost). Among equal-cost plans a private share is
        # preferred (a small reward), so free nodes are used to the horizon, not left to chance.
        usd = p.node.cost_per_hour * T / 3600.0 - 0.25 * options.tie_break_usd * (1.0 + k / (len(catalogue.private) + 1))
        x = ilp.column(f"x_{k}", top * len(group), usd, p.rate_per_s * T, integer=False)
        names = [q.node.name for q in group]
        ilp.readers.append(lambda c, v, x=x, names=names: c.busy_s.update(
            {name: v[x] * T / len(names) for name in names}))
    return ilp


def _identical_private(private) -> list[list]:
    groups: dict[tuple, list] = {}
    for p in private:
        groups.setdefault((p.rate_per_s, p.start_s, p.node.cost_per_hour), []).append(p)
    return list(groups.values())


def _new_type_terms(ilp: _Ilp, offer: NewOffer, T: float, work: Work, tie_usd: float) -> None:
    i, r, start, q = offer.index, offer.rate_per_s, offer.start_s, offer.quantum_s
    top = _quanta_to(T, q)
    chosen = []  # columns counting against the limit
    if offer.linear_cost:
        candidates = [top, top - 1] if top >= 2 else [top]
    else:
        candidates = list(range(1, min(top, offer.saturation_quanta(work.total_ref_s)) + 1))
    for u in candidates:
        cap = r * max(0.0, min(u * q, T) - start)
        if cap <= 0:
            continue
        y = ilp.column(f"y_{i}_{u}", offer.limit, offer.cost_usd(u) + tie_usd * (u + u * u / (top + 1)), cap)
        chosen.append(y)
        ilp.readers.append(lambda c, v, y=y, u=u: c.add_new(i, u, _int(v[y])))
    if offer.linear_cost and top >= 3 and (top - 2) * q > start:
        delta = ilp.column(f"short_{i}", 1, 0.0, -r * start)
        s = ilp.column(f"short_quanta_{i}", top - 2,
                       offer.type.price_per_hour * q / 3600.0 + tie_usd * (1 + (top - 2) / (top + 1)), r * q)
        ilp.model.row({s: 1.0, delta: -(top - 2)}, upper=0.0)
        ilp.model.row({s: 1.0, delta: -1.0}, lower=0.0)
        chosen.append(delta)
        ilp.readers.append(lambda c, v, s=s, delta=delta: c.add_new(i, _int(v[s]), _int(v[delta])))
    if chosen:
        ilp.model.row({j: 1.0 for j in chosen}, upper=offer.limit, name=f"limit_{i}")


def _running(existing, T: float) -> tuple[list[list], list]:
    """The running instances with something to decide (paid short of the horizon): those ready
    to work before their paid time ends, by type, and the others (``late``)."""
    by_type: dict[str, list] = {}
    late = []
    for old in existing:
        if old.paid_s >= T:
            continue  # paid beyond the horizon: nothing to decide, its capacity is a constant
        if old.paid_s >= old.start_s:
            by_type.setdefault(old.type.name, []).append(old)
        else:
            late.append(old)
    return list(by_type.values()), late


def _ready_terms(ilp: _Ilp, k: int, members: list, T: float, tie_usd: float) -> None:
    """Running instances of one type, each ready before its paid time ends (base_e = paid_e -
    start_e >= 0), whatever their launch times. Their paid time is free capacity
    r sum base_e. Every extension quantum that ends before the horizon adds exactly r q,
    whichever instance gets it, so one count V stands for all of them; only the quantum that
    reaches the horizon is worth less (r (T - paid_e - (U_e - 1) q)), so extending instance e
    to the horizon (U_e quanta, capacity r (T - paid_e) over its base) is a column per class
    of equal (U_e, paid_e):

        V <= sum_e (U_e - 1) - sum_classes (U_c - 1) F_c,   F_c <= |c|

    Exact, and free of the symmetry among instances launched a second apart that made a
    re-plan of 64 such machines hit the solver's time limit (per-instance variables: 0.7 s
    and no proof; this: a few ms). Within a U, classes that gain more are filled first (a
    valid ordering: the cheapest plans all can). The reader deals V out a quantum at a time
    to the instance whose paid time ends first (the plan that finishes soonest)."""
    old = members[0]
    r, q, usd = old.rate_per_s, old.quantum_s, old.quantum_usd + tie_usd
    ilp.fixed_ref_s += sum(r * (o.paid_s - o.start_s) for o in members)
    tops = [_quanta_to(T - o.paid_s, q) for o in members]
    classes: dict[tuple[int, float], list[int]] = {}
    for n, (o, top) in enumerate(zip(members, tops)):
        classes.setdefault((top, o.paid_s), []).append(n)
    fulls = []  # (column, quanta, member indices), by quanta then gain descending
    for (top, paid), idx in sorted(classes.items()):
        f = ilp.column(f"full_{k}_{len(fulls)}", len(idx), usd * top, r * (T - paid))
        if fulls and fulls[-1][1] == top:
            prev, _, prev_idx = fulls[-1]
            ilp.model.row({f: len(prev_idx), prev: -len(idx)}, upper=0.0)
        fulls.append((f, top, idx))
    spare = sum(t - 1 for t in tops)
    v = None
    if spare > 0:
        v = ilp.column(f"more_{k}", spare, usd, r * q)
        ilp.model.row({v: 1.0, **{f: top - 1.0 for f, top, _ in fulls if top > 1}}, upper=spare)
    ids = [o.instance.id for o in members]
    ends = [o.paid_s for o in members]

    def read(c, values):
        extra = [0] * len(members)
        full = set()
        for f, top, idx in fulls:
            for n in idx[:_int(values[f])]:
                extra[n] = top
                full.add(n)
        heap = [(ends[n], n) for n in range(len(members)) if n not in full and tops[n] > 1]
        heapq.heapify(heap)
        for _ in range(_int(values[v]) if v is not None else 0):
            if not heap:
                break
            _, n = heapq.heappop(heap)
            extra[n] += 1
            if extra[n] < tops[n] - 1:
                heapq.heappush(heap, (ends[n] + extra[n] * q, n))
        c.extra_quanta.update(zip(ids, extra))

    ilp.readers.append(read)


def _interchangeable(existing, T: float) -> list[list]:
    """The existing instances that have something to decide (paid short of the horizon),
    grouped where the model cannot tell them apart: same type (which fixes rate, quantum and
    price), start and paid time (a batch launched together). One set of variables per group instead of per instance
    removes the symmetry that made CBC branch over which of 30 equal instances to keep (0.5 s
    a solve on the BaTS scenarios, a budget re-plan needing ten of them)."""
    groups: dict[tuple, list] = {}
    for old in existing:
        if old.paid_s >= T:
            continue  # paid beyond the horizon: nothing to decide, its capacity is a constant
        key = (old.type.name, old.start_s, old.paid_s)
        groups.setdefault(key, []).append(old)
    return list(groups.values())


def _existing_terms(ilp: _Ilp, k: int, group: list, T: float, tie_usd: float) -> None:
    """The per-instance model (module docstring) summed over ``group``'s G equal instances:
    D = sum d, F = sum f, V = sum v with D + F <= G and V <= (U - 1) D. Any such (D, F, V) splits
    back into per-instance values, so the aggregate is exact; the reader deals them out in
    catalogue order (the controller re-deals releases among interchangeable instances)."""
    old = group[0]
    size = len(group)
    r, q, start = old.rate_per_s, old.quantum_s, old.start_s
    top = _quanta_to(T - old.paid_s, q)
    d = ilp.column(f"use_{k}", size, 0.0, r * (old.paid_s - start))
    f = ilp.column(f"extend_full_{k}", size, (old.quantum_usd + tie_usd) * top, r * max(0.0, T - start))
    ilp.model.row({d: 1.0, f: 1.0}, upper=size)
    v = None
    if top >= 2:
        v = ilp.column(f"extend_{k}", (top - 1) * size, old.quantum_usd + tie_usd, r * q)
        ilp.model.row({v: 1.0, d: -(top - 1)}, upper=0.0)
    ids = [o.instance.id for o in group]

    def read(c, values, f=f, v=v, top=top):
        full, extra = _int(values[f]), (_int(values[v]) if v is not None else 0)
        for n, name in enumerate(ids):
            if n < full:
                c.extra_quanta[name] = top
            else:
                c.extra_quanta[name] = min(top - 1, extra)
                extra -= c.extra_quanta[name]

    ilp.readers.append(read)


def _int(value: float) -> int:
    return int(round(value))


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


# -- the fallback when the solver gives no answer ------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """A piece of capacity the greedy fallback can buy: up to ``count`` of it, or a fraction."""

    usd_per_ref_s: float
    order: tuple
    capacity_ref_s: float
    count: int
    fractional: bool
    apply: object  # (Choice, amount) -> None


def greedy_choice(catalogue: Catalogue, work: Work, T: float) -> Choice:
    """Fill the cheapest capacity per dollar first: whole full-horizon instances, private shares.

    The paid time of existing instances is used first (it is free); extending one to the
    horizon, a private node's share and a new instance kept to the horizon compete on USD per
    reference second. Always feasible when the deadline is (those units are the fastest plan).
    """
    choice = Choice()
    remaining = work.total_ref_s
    units = []
    for k, old in enumerate(catalogue.existing):
        free = old.ramp(0).capacity(T)
        remaining -= free
        if old.paid_s < T:
            top = _quanta_to(T - old.paid_s, old.quantum_s)
            extra = old.ramp(top).capacity(T) - free
            if extra > 0:
                set_extra = lambda c, a, o=old, t=top: c.extra_quanta.__setitem__(o.instance.id, t)
                units.append(_Unit(top * old.quantum_usd / extra, (0, k), extra, 1, False, set_extra))
    for k, p in enumerate(catalogue.private):
        busy_s = max(0.0, T - p.start_s)
        if busy_s > 0:
            set_share = lambda c, a, p=p, b=busy_s: c.busy_s.__setitem__(p.node.name, a * b)
            units.append(_Unit(p.cost_per_ref_s_usd(), (1, k), p.rate_per_s * busy_s, 1, True, set_share))
    for offer in catalogue.new:
        top = _quanta_to(T, offer.quantum_s)
        cap = offer.rate_per_s * max(0.0, T - offer.start_s)
        if cap > 0:
            launch = lambda c, a, o=offer, t=top: c.add_new(o.index, t, int(a))
            units.append(_Unit(offer.cost_usd(top) / cap, (2, offer.index), cap, offer.limit, False, launch))
    for unit in sorted(units, key=lambda u: (u.usd_per_ref_s, u.order)):
        if remaining <= 0:
            break
        if unit.fractional:
            amount = min(1.0, remaining / unit.capacity_ref_s)
        else:
            amount = min(unit.count, math.ceil(remaining / unit.capacity_ref_s - 1e-12))
        unit.apply(choice, amount)
        remaining -= amount * unit.capacity_ref_s
    return choice
