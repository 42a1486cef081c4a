"""The planner's small integer programs, solved by HiGHS in process or by CBC through pulp.

``Model`` holds a minimisation in plain lists (columns with bounds, costs and integrality;
rows as sparse coefficients with bounds); ``solve`` hands it to one solver and reads back the
true status:

    optimal     proven optimal within the gaps asked for
    time_limit  stopped at the time limit with a feasible incumbent (not proven)
    infeasible  the solver proved there is no solution
    none        no solution and no proof (time limit before any incumbent, numerical trouble)

Solvers (``PlanOptions.solver``):

    highs   HiGHS through highspy, in this process: the model is passed as arrays, nothing is
            written to disk, no process starts. One thread: on this 2-core machine HiGHS's
            worker pool cost 5-20 ms per solve of a 36-column model that takes 1 ms alone.
    cbc     pulp's bundled CBC: the model goes through an MPS file and a process (4-7 ms to
            start), and ``pulp.LpStatus`` says Optimal at a time limit, so ``sol_status`` is read.
    auto    by model size: HiGHS up to ``HIGHS_UP_TO_COLUMNS`` columns, CBC beyond (or always,
            without highspy). ``bench/bench_plan.py --crossover`` measures both on the thesis
            catalogues, 20 per-second types, re-plans with 64 running machines and random
            catalogues of 5-60 types under 4 billing schemes. Racing the two was not worth it
            here: outside a narrow band (80-110 columns) one of them wins on most models, and a
            race would take both of this machine's 2 cores for every solve. On the 24 HiGHS
            solves of the 20 per-second front (80 columns) HiGHS took 873 CPU ms, CBC 990 and
            the faster of the two each time 618; and a race would make the plan depend on which
            finished first wherever the two stop at different tie-equal plans (HiGHS proves
            optimality to about 1e-8 of the objective: thesis x20 at 44 h did, with HiGHS's
            default cut pool).

Not done, measured: warm starts. HiGHS given the previous horizon's solution as an incumbent
solved the thesis fronts in 421/319 CPU ms against 442/328 cold and the budget searches in
87/92 against 66/90 (same optima); even the optimum itself as the incumbent saves at most half.
Building the model is 5-15% of a front's or a search's CPU time (``bench/bench_plan.py``
prints where the time goes), so a model kept between solves and changed in place would save
less than that.

Both solvers are run to the same gaps: ``gap_rel`` and an absolute gap below the planner's
tie-break, so that equal-cost plans are told apart by the tie-break in the objective and the
plan does not depend on which solver found it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
import numpy as np

try:  # imported here, so that ``import broker.core.plan`` pays for it before any clock starts
    import highspy
except ImportError:  # CBC (bundled with pulp) still solves everything, slower
    highspy = None

OPTIMAL = "optimal"
TIME_LIMIT = "time_limit"
INFEASIBLE = "infeasible"
NONE = "none"

SOLVERS = ("auto", "highs", "cbc")

# ``auto`` picks HiGHS for models up to this many columns and CBC beyond. Measured with
# ``python3 bench/bench_plan.py --crossover`` (CPU ms, CBC's process included, exact solves):
# up to 90 columns HiGHS was faster on 22 of 25 models (thesis x20: 10-17 against 75-82;
# 64 running machines: 2-8 against 8-20); from 115 columns CBC was faster on 7 of 9 and tied
# on the other two (60 per-second types, 240 columns: HiGHS 725, CBC 37); at 80 columns
# each won twice. Re-measured with the shifting heuristic and the small cut pool (35 models,
# CPU ms in all under auto at a threshold of): 80 -> 520, 100 -> 510, 150 -> 513, 200 -> 578;
# HiGHS always 633, CBC always much more; the faster of the two on each model 434.
HIGHS_UP_TO_COLUMNS = 100

# Feasibility tolerance given to the solvers (rows are scaled to O(1) by the model builder).
FEASIBILITY_TOL = 1e-10


@dataclass
class Model:
    """minimize sum cost_j x_j  s.t.  lower_r <= sum a_rj x_j <= upper_r,  lower_j <= x_j <= upper_j."""

    names: list[str] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float, str]] = field(default_factory=list)

    def var(self, name: str, lower: float, upper: float, cost: float = 0.0, integer: bool = False) -> int:
        self.names.append(name)
        self.cost.append(float(cost))
        self.lower.append(float(lower))
        self.upper.append(float(upper))
        self.integer.append(bool(integer))
        return len(self.names) - 1

    def add_cost(self, column: int, usd: float) -> None:
        self.cost[column] += usd

    def row(self, coefs: dict[int, float], lower: float = -math.inf, upper: float = math.inf, name: str = "") -> int:
        self.rows.append((dict(coefs), float(lower), float(upper), name or f"r{len(self.rows)}"))
        return len(self.rows) - 1

    @property
    def columns(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Solution:
    status: str
    values: tuple[float, ...]
    objective: float
    solver: str

    @property
    def feasible(self) -> bool:
        return self.status in (OPTIMAL, TIME_LIMIT)


def pick_solver(model: Model, solver: str) -> str:
    """The solver ``solve`` uses: ``auto`` becomes highs or cbc (see ``HIGHS_UP_TO_COLUMNS``)."""
    if solver not in SOLVERS:
        raise ValueError(f"PlanOptions.solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    if solver == "auto":
        return "highs" if highs_available() and model.columns <= HIGHS_UP_TO_COLUMNS else "cbc"
    if solver == "highs" and not highs_available():
        raise ValueError("PlanOptions.solver is 'highs' but highspy is not installed (pip install highspy)")
    return solver


def lp_solver(solver: str) -> str | None:
    """The solver for LP relaxations under ``solver`` (a PlanOptions.solver value): HiGHS in
    process whenever it is there (an LP through CBC starts a process), None with CBC only."""
    if solver == "cbc" or not highs_available():
        return None
    return "highs"


def solve(model: Model, *, solver: str = "auto", time_limit_s: float = 2.0, gap_rel: float = 1e-3,
          gap_abs: float = 1e-9, relax: bool = False) -> Solution:
    """Solve ``model``; ``relax``: drop integrality (the LP relaxation)."""
    if not (time_limit_s > 0 and gap_rel >= 0 and gap_abs >= 0):
        raise ValueError(f"need time_limit_s > 0 and gaps >= 0, got {time_limit_s}, {gap_rel}, {gap_abs}")
    if relax:
        model = Model(model.names, model.cost, model.lower, model.upper, [False] * model.columns, model.rows)
    chosen = pick_solver(model, solver)
    if chosen == "highs":
        return _solve_highs(model, time_limit_s, gap_rel, gap_abs)
    return _solve_cbc(model, time_limit_s, gap_rel, gap_abs)


# -- HiGHS in process ---------------------------------------------------------------------------

_highs_lock = threading.Lock()  # one solve at a time: HiGHS's thread scheduler is process-wide
_HIGHS_OPTIONS = {
    "output_flag": False,
    "threads": 1,
    "presolve": "on",
    # The primal heuristics, symmetry detection and restarts cost more than the whole search on
    # these models (x20: 23.6 ms with them, 0.9 ms without, same answer: bench --crossover).
    "mip_heuristic_effort": 0.0,
    "mip_detect_symmetry": False,
    "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_root_reduced_cost": False,
    "mip_allow_restart": False,
    # Two cheap changes measured together on the 98 MIPs the planner bench solves (thesis
    # solves, fronts and budget searches, 20 per-second types, re-plans of 64 machines; CPU ms
    # in HiGHS, 3 rounds): 1,206 -> 862 in all, the thesis models 296 -> 256, the same optimum
    # on every model. The shifting heuristic is a rounding that costs no LP solve; a small cut
    # pool keeps node LPs as small as these 17-80 column models (10,000 by default).
    "mip_heuristic_run_shifting": True,
    "mip_pool_soft_limit": 10,
    # Branch on pseudo-costs without waiting for strong-branching samples (default: 8). On 22
    # models (thesis and 20-type catalogues at 5 deadlines, re-plans, the thesis catalogue
    # just past its fastest makespan) an exact solve took 171 CPU ms in all with 0, 354 with
    # 2 and 413 with 8; the hardest (thesis x20 at 27 h) 20, 198 and 265 ms.
    "mip_pscost_minreliable": 0,
    "mip_feasibility_tolerance": FEASIBILITY_TOL,
    "primal_feasibility_tolerance": FEASIBILITY_TOL,
    "random_seed": 0,
}


def highs_available() -> bool:
    return highspy is not None


def _solve_highs(model: Model, time_limit_s: float, gap_rel: float, gap_abs: float) -> Solution:
    n = model.columns
    starts, index, value = _columnwise(model)
    inf = highspy.kHighsInf
    with _highs_lock:
        h = _new_highs()
        for key, val in _HIGHS_OPTIONS.items():
            h.setOptionValue(key, val)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_rel_gap", float(gap_rel))
        h.setOptionValue("mip_abs_gap", float(gap_abs))
        h.passModel(
            n, len(model.rows), len(index), 1, 1, 0.0,  # column-wise matrix, minimise, no offset
            np.array(model.cost, dtype=np.float64),
            np.array([max(-inf, v) for v in model.lower], dtype=np.float64),
            np.array([min(inf, v) for v in model.upper], dtype=np.float64),
            np.array([max(-inf, r[1]) for r in model.rows], dtype=np.float64),
            np.array([min(inf, r[2]) for r in model.rows], dtype=np.float64),
            np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
            np.array(value, dtype=np.float64),
            np.array([1 if k else 0 for k in model.integer], dtype=np.int32),
        )
        status = h.run()
        if status == highspy.HighsStatus.kError:
            # Another HiGHS user in this process started the shared scheduler with more
            # threads; "threads" can only change after a reset.
            highspy.Highs.resetGlobalScheduler(True)
            status = h.run()
        model_status = h.getModelStatus()
        info = h.getInfo()
        has_point = info.primal_solution_status == 2  # kSolutionStatusFeasible
        values = tuple(h.getSolution().col_value) if has_point else ()
    M = highspy.HighsModelStatus
    if model_status == M.kOptimal and has_point:
        result = OPTIMAL
    elif model_status == M.kInfeasible:
        result = INFEASIBLE
    elif has_point and model_status in (M.kTimeLimit, M.kIterationLimit, M.kSolutionLimit, M.kInterrupt,
                                         M.kObjectiveBound, M.kUnknown):
        result = TIME_LIMIT
    else:
        result = NONE
    objective = info.objective_function_value if has_point else math.inf
    return Solution(result, values, objective, "highs")


def _new_highs():
    # The bare binding: ``highspy.Highs`` adds Python callbacks (slower to build) and prints a
    # banner on stdout when built, which would corrupt ``--json`` output.
    core = getattr(highspy, "_core", None)
    cls = getattr(core, "_Highs", None) or highspy.Highs
    h = cls()
    h.setOptionValue("output_flag", False)
    return h


def _columnwise(model: Model) -> tuple[list[int], list[int], list[float]]:
    columns: list[list[tuple[int, float]]] = [[] for _ in range(model.columns)]
    for r, (coefs, _lo, _hi, _name) in enumerate(model.rows):
        for j, a in coefs.items():
            if a != 0.0:
                columns[j].append((r, a))
    starts, index, value = [0], [], []
    for entries in columns:
        for r, a in entries:
            index.append(r)
            value.append(a)
        starts.append(len(index))
    return starts[:-1], index, value


# -- CBC through pulp ---------------------------------------------------------------------------


def _solve_cbc(model: Model, time_limit_s: float, gap_rel: float, gap_abs: float) -> Solution:
    import pulp

    if hasattr(pulp, "set_v4_migration_warnings"):
        pulp.set_v4_migration_warnings(False)
    prob = pulp.LpProblem("plan", pulp.LpMinimize)
    xs = [
        pulp.LpVariable(f"x{j}_{name}", None if math.isinf(lo) else lo, None if math.isinf(hi) else hi,
                        cat="Integer" if integer else "Continuous")
        for j, (name, lo, hi, integer) in enumerate(zip(model.names, model.lower, model.upper, model.integer))
    ]
    prob += pulp.LpAffineExpression([(xs[j], c) for j, c in enumerate(model.cost) if c != 0.0])
    for coefs, lo, hi, name in model.rows:
        expr = pulp.LpAffineExpression([(xs[j], a) for j, a in coefs.items()])
        if lo == hi:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintEQ, name, lo)
            continue
        if not math.isinf(lo):
            prob += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"{name}_lo", lo)
        if not math.isinf(hi):
            prob += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"{name}_hi", hi)
    # ``increment``: CBC otherwise guesses a cutoff increment from the objective and prunes
    # nodes that could still improve it by less (it returned plans 1e-6 dearer than HiGHS's).
    options = [f"primalT {FEASIBILITY_TOL}", f"integerT {FEASIBILITY_TOL}", f"allowableGap {gap_abs}",
               f"increment {max(gap_abs, 1e-12)}"]
    prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=gap_rel, options=options))
    if prob.sol_status == pulp.LpSolutionOptimal:
        status = OPTIMAL
    elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
        status = TIME_LIMIT
    elif prob.sol_status == pulp.LpSolutionInfeasible:
        status = INFEASIBLE
    else:
        status = NONE
    if status in (OPTIMAL, TIME_LIMIT):
        values = tuple(float(x.value() or 0.0) for x in xs)
        objective = sum(c * v for c, v in zip(model.cost, values))
    else:
        values, objective = (), math.inf
    return Solution(status, values, objective, "cbc")
