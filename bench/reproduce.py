"""The reproduction report: the thesis's and BaTS's tables, re-run in the simulator.

    python3 bench/reproduce.py [--quick] [--seed 1] [--jobs 2]

Policies, all through the same controller and simulator: our broker ("broker"), List_eta
("list", thesis 5.8.4), budget-oblivious round-robin on every machine ("rr", BaTS's RR) and
BaTS's knapsack configuration ("bats", ALGORITHMS.md 3.5).

(a) Thesis Ch. 6.5 (``bench/scenarios.py``): LS, LM, LL with n = 100,000 tasks on 20 and 60
    machines per EC2 type plus the private xeon; per-task estimates within +/-10%. Two points
    of our front, computed before the run on the estimates:
      best makespan  front point 1 (T_lower; thesis Table 6.4)
      best cost      front point 2 (thesis Table 6.5; see "Setup" for why not the last one)
    List_eta runs with eta = the number of machines our point's plan uses (its EC2 fleet
    plus the private node); BaTS gets the best-cost point's planned cost as its budget.
    List_eta also runs on the same machines as our point's plan (the goal's comparison) and, at
    the best-cost point, with eta machines taken by name and faster first (see "Setup").
    SLA deviation (thesis Table 6.6): (delivered - proposed) / proposed for makespan and
    cost, proposed = the chosen point as the controller promises it, with exact estimates,
    with 30% error and with no per-task estimates at all (only the bag's mean as a hint; the
    thesis has no such row), at the thesis's n = 100,000 even with ``--quick``.
(b) BaTS Sec. 3: the five scenarios, RR, and BaTS and our broker at BaTS's two budgets
    (RR's reported cost, and 1.1 or 1.2 x B_min as BaTS used).

Differences are printed as the thesis prints them: Diff% = (List - Ours) / Ours.
Goals are measured and printed as PASS/MISS lines, never asserted. ``--quick`` runs
n = 10,000, 20 machines per type (the SLA rows: LM only, n = 100,000) and BaTS's S1-4.

Run time, measured on a 2-core VM (``--jobs 2``): the default run, 86 simulations, 6.3 min
(its output is kept in ``bench/results/reproduce-full.txt``); ``--quick``, 37 simulations,
72 s. The longest runs (20-30 s each) are our broker under BaTS's budgets (a budget re-plan is
a search of about ten CBC solves), the best-cost points on LL, and the BaTS policy on thesis
LM/LL, which its budget keeps on few machines until the simulator's 60-day cap.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import scenarios as sc  # noqa: E402
from broker.core.control.controller import ControllerConfig, _list_eta_machines  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.plan import Work, pareto_front  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402

BEST_MAKESPAN, BEST_COST = "best-makespan", "best-cost"
SPEED_GOAL_S = 30.0


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One simulation, in plain values so that it crosses process boundaries."""

    section: str  # "thesis" | "sla" | "bats" | "speed"
    scenario: str  # "LM20", "S4-1", ...
    policy: str
    label: str  # the table's row/column name (a front point, a budget name)
    goal_kind: str = "none"
    goal_value: float | None = None
    eta: int | None = None
    list_fleet: tuple[tuple[str, int], ...] | None = None  # List on exactly these machines
    variant: str = ""  # tells apart List runs at one point (see LIST_VARIANTS)
    estimate_error: float | None = 0.1  # None: no per-task estimates
    x_cut_hi: float | None = None  # LM/LL's upper tail cut (None: the default; bench/thesis_cut.py)
    tasks: int = sc.THESIS_TASKS
    machines: int = 20
    seed: int = 1


@dataclass(frozen=True, slots=True)
class Outcome:
    spec: RunSpec
    makespan_s: float = math.nan
    cost_usd: float = math.nan
    planned_makespan_s: float = math.nan
    planned_cost_usd: float = math.nan
    max_committed_usd: float = math.nan
    tasks_done: int = 0
    tasks_total: int = 0
    sim_wall_s: float = math.nan
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.tasks_done == self.tasks_total


def simulate(spec: RunSpec) -> Outcome:
    """Build the scenario the spec names and run it; errors become part of the outcome."""
    if spec.section == "bats":
        inventory = sc.bats_inventory(spec.scenario, spec.machines)
        workload = sc.bats_workload(spec.seed, tasks=spec.tasks)
        tick_s = sc.BATS_TICK_S
    else:
        inventory = sc.thesis_inventory(spec.machines)
        workload = sc.thesis_workload(spec.scenario[:2], spec.seed, tasks=spec.tasks,
                                      estimate_error=spec.estimate_error, x_cut_hi=spec.x_cut_hi)
        tick_s = sc.THESIS_TICK_S
    goal = Goal(spec.goal_kind, spec.goal_value)
    config = ControllerConfig(policy=spec.policy, eta=spec.eta, list_fleet=spec.list_fleet, tick_s=tick_s)
    try:
        r = Simulation(inventory, workload, goal, config, SimOptions(seed=spec.seed)).run()
    except Exception as exc:  # the report shows a failing run as a row, it does not stop
        return Outcome(spec, error=f"{type(exc).__name__}: {exc}")
    nan = math.nan
    return Outcome(
        spec, r.makespan_s, r.cost_usd,
        nan if r.planned_makespan_s is None else r.planned_makespan_s,
        nan if r.planned_cost_usd is None else r.planned_cost_usd,
        r.max_committed_usd, r.tasks_done, r.tasks_total, r.sim_wall_s,
    )


# -- the runs ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FrontPoints:
    """Our front's two points for one thesis scenario, as the planner gives them before a run."""

    scenario: str
    makespan_point: tuple[float, float, int]  # hours, USD, machines used (private included)
    cost_point: tuple[float, float, int]
    cost_point_index: int
    cheapest: tuple[float, float]  # the front's last point (hours, USD)
    makespan_fleet: tuple[tuple[str, int], ...] = ()  # the EC2 machines each point's plan uses
    cost_fleet: tuple[tuple[str, int], ...] = ()
    cost_floor_usd: float = math.nan  # the least any schedule of the bag can cost (see cost_floor_usd)


def thesis_front(name: str, machines: int, tasks: int, seed: int) -> FrontPoints:
    workload = sc.thesis_workload(name, seed, tasks=tasks)
    est = workload.estimates_ref_s
    work = Work(float(est.sum()), len(est), float(est.mean()), float(est.std()))
    inventory = sc.thesis_inventory(machines)
    front = pareto_front(inventory.types, inventory.private, work)
    used = len(inventory.private)

    def point(plan) -> tuple[float, float, int]:
        return plan.makespan_s / 3600.0, plan.cost_usd, sum(plan.fleet.values()) + used

    def fleet(plan) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((t, c) for t, c in plan.fleet.items() if c > 0))

    k = min(2, len(front))
    last = front[-1]
    return FrontPoints(f"{name}{machines}", point(front[0]), point(front[k - 1]), k,
                       (last.makespan_s / 3600.0, last.cost_usd), fleet(front[0]), fleet(front[k - 1]),
                       cost_floor_usd(inventory, workload))


def cost_floor_usd(inventory, workload) -> float:
    """The least any schedule of the bag can cost: all of its true work at the lowest price per
    reference second in the inventory (no billing rounding, no idle time, any makespan)."""
    prices = [t.price_per_hour / 3600.0 / t.capacity_per_s for t in inventory.types if t.limit > 0]
    prices += [p.cost_per_hour / 3600.0 / p.capacity_per_s for p in inventory.private]
    return float(workload.runtimes_ref_s.sum()) * min(prices)


# List_eta at the best-cost point, three readings of "the eta most efficient machines" (the
# thesis does not say how eta or the machines were chosen). The first is the goal's comparison.
SAME_MACHINES, ETA_BY_NAME, ETA_FASTER_FIRST = "same machines", "eta, ties by name", "eta, ties faster first"
LIST_VARIANTS = (SAME_MACHINES, ETA_BY_NAME, ETA_FASTER_FIRST)


def eta_faster_first(inventory, eta: int) -> tuple[tuple[str, int], ...]:
    """The eta most cost-efficient machines (private nodes count), equally efficient ones
    taken faster first."""
    return tuple(sorted(_list_eta_machines(inventory.types, inventory.private, eta, faster_first=True).items()))


@dataclass(frozen=True, slots=True)
class Scale:
    """How big the report runs: the papers' sizes, ``--quick``, or the smoke test's."""

    thesis_tasks: int = sc.THESIS_TASKS
    machine_counts: tuple[int, ...] = (20, 60)
    sla_workloads: tuple[str, ...] = ("LM", "LL")
    bats_scenarios: tuple[str, ...] = tuple(sc.BATS_SCENARIOS)
    bats_tasks: int = sc.BATS_TASKS
    bats_machines: int = sc.BATS_MACHINES_PER_CLUSTER
    speed_run: bool = True
    sla_tasks: int | None = None  # the SLA rows' bag size; None: thesis_tasks


FULL = Scale()
# S1-4 is the BaTS scenario whose budget runs are quick (see the module docstring on run time).
# The SLA rows keep the thesis's n = 100,000 (Table 6.6): at n = 10,000 the plan's fixed
# allowances (phi = 5 min, half a task, the last partial hour) are 10 times larger a share.
QUICK = Scale(thesis_tasks=10_000, machine_counts=(20,), sla_workloads=("LM",), bats_scenarios=("S1-4",),
              speed_run=False, sla_tasks=sc.THESIS_TASKS)


def plan_runs(scale: Scale, seed: int) -> tuple[list[RunSpec], dict[str, FrontPoints]]:
    tasks = scale.thesis_tasks
    runs: list[RunSpec] = []
    fronts: dict[str, FrontPoints] = {}
    for name in sc.THESIS_WORKLOADS:
        for m in scale.machine_counts:
            f = thesis_front(name, m, tasks, seed)
            fronts[f.scenario] = f
            base = RunSpec("thesis", f.scenario, "broker", "", tasks=tasks, machines=m, seed=seed)
            for label, index, (_, usd, used), fleet in (
                    (BEST_MAKESPAN, 1, f.makespan_point, f.makespan_fleet),
                    (BEST_COST, f.cost_point_index, f.cost_point, f.cost_fleet)):
                runs.append(replace(base, label=label, goal_kind="point", goal_value=index))
                lst = replace(base, policy="list", label=label, eta=used)
                runs.append(replace(lst, list_fleet=fleet, variant=SAME_MACHINES))
                if label == BEST_COST:
                    runs.append(replace(lst, variant=ETA_BY_NAME))
                    runs.append(replace(lst, list_fleet=eta_faster_first(sc.thesis_inventory(m), used),
                                        variant=ETA_FASTER_FIRST))
            runs.append(replace(base, policy="rr", label="all machines"))
            runs.append(replace(base, policy="bats", label=BEST_COST, goal_kind="budget",
                                goal_value=round(f.cost_point[1], 2)))
    m = scale.machine_counts[0]
    sla_tasks = scale.sla_tasks or tasks
    for name in scale.sla_workloads:
        f = fronts[f"{name}{m}"] if sla_tasks == tasks else thesis_front(name, m, sla_tasks, seed)
        # the thesis section's runs give the 10% rows when they have the same bag size
        errors = (0.0, 0.3, None) if sla_tasks == tasks else (0.0, 0.1, 0.3, None)
        for error in errors:
            for label, index in ((BEST_MAKESPAN, 1), (BEST_COST, f.cost_point_index)):
                runs.append(RunSpec("sla", f.scenario, "broker", label, "point", index, estimate_error=error,
                                    tasks=sla_tasks, machines=m, seed=seed))
    for name in scale.bats_scenarios:
        base = RunSpec("bats", name, "rr", "none", tasks=scale.bats_tasks, machines=scale.bats_machines, seed=seed)
        runs.append(base)
        for label, budget in sc.bats_budgets_usd(name, scale.bats_tasks).items():
            for policy in ("bats", "broker"):
                runs.append(replace(base, policy=policy, label=label, goal_kind="budget", goal_value=budget))
    if scale.speed_run:
        # 100,000 tasks on 200 EC2 machines (50 per type) and the xeon, over days of virtual time.
        runs.append(RunSpec("speed", "LL50", "broker", BEST_MAKESPAN, "point", 1, machines=50, seed=seed))
    return runs, fronts


def run_all(runs: list[RunSpec], jobs: int) -> list[Outcome]:
    # Budget-goal broker runs re-solve the planner most and take longest: start them first.
    order = sorted(range(len(runs)), key=lambda i: (runs[i].goal_kind != "budget" or runs[i].policy != "broker",
                                                    -runs[i].tasks))
    results: dict[int, Outcome] = {}

    def progress(outcome: Outcome) -> None:
        s = outcome.spec
        print(f"[{len(results)}/{len(runs)}] {s.section} {s.scenario} {s.policy} {s.label}: "
              f"{outcome.sim_wall_s:.1f} s", file=sys.stderr, flush=True)

    if jobs <= 1:
        for i in order:
            results[i] = simulate(runs[i])
            progress(results[i])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for i, outcome in zip(order, pool.map(simulate, [runs[i] for i in order])):
                results[i] = outcome
                progress(outcome)
    return [results[i] for i in range(len(runs))]


# -- printing ----------------------------------------------------------------------------------
def hd(makespan_s: float, cost_usd: float) -> str:
    if not (math.isfinite(makespan_s) and math.isfinite(cost_usd)):
        return "-"
    return f"{makespan_s / 3600:.1f}/{cost_usd:.1f}"


def paper_hd(p: sc.PaperPoint | None) -> str:
    if p is None:
        return "-"
    h = "?" if p.hours is None else f"{p.hours:.1f}"
    c = "?" if p.usd is None else f"{p.usd:.1f}"
    return f"{h}/{c}"


def pct(a: float, b: float) -> float:
    """(a - b) / b in percent."""
    return 100.0 * (a - b) / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def fleet_label(machines: dict[str, int]) -> str:
    """{"c1.medium": 1, "c1.xlarge": 8} -> "1me+8xl"."""
    return "+".join(f"{c}{t.split('.')[-1][:2]}" for t, c in sorted(machines.items()) if c)


def cell(o: Outcome) -> str:
    if o.error:
        return f"ERROR {o.error[:40]}"
    text = hd(o.makespan_s, o.cost_usd)
    return text if o.complete else f"{text} ({o.tasks_total - o.tasks_done} left)"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def find(outcomes: list[Outcome], **fields) -> Outcome | None:
    for o in outcomes:
        if all(getattr(o.spec, k) == v for k, v in fields.items()):
            return o
    return None


def report_thesis(outcomes: list[Outcome], fronts: dict[str, FrontPoints], goals: list[str]) -> None:
    for label, paper, title in (
        (BEST_MAKESPAN, sc.THESIS_BEST_MAKESPAN, "Thesis Table 6.4: best-makespan point (T_lower), hours/USD"),
        (BEST_COST, sc.THESIS_BEST_COST, "Thesis Table 6.5: best-cost point, hours/USD"),
    ):
        rows = []
        for name, f in fronts.items():
            ours = find(outcomes, section="thesis", scenario=name, policy="broker", label=label)
            lst = find(outcomes, section="thesis", scenario=name, policy="list", label=label, variant=SAME_MACHINES)
            rr = find(outcomes, section="thesis", scenario=name, policy="rr")
            bats = find(outcomes, section="thesis", scenario=name, policy="bats")
            front = f.makespan_point if label == BEST_MAKESPAN else f.cost_point
            dt, dc = pct(lst.makespan_s, ours.makespan_s), pct(lst.cost_usd, ours.cost_usd)
            p_ours, p_list = paper.get(name, (None, None))
            p_diff = "-"
            if p_ours is not None:
                p_diff = f"{pct(p_list.hours, p_ours.hours):.1f}/{pct(p_list.usd, p_ours.usd):.1f}"
            row = [name, f"{front[0]:.1f}/{front[1]:.1f}", cell(ours), cell(lst),
                   f"{dt:.1f}/{dc:.1f}", paper_hd(p_ours), paper_hd(p_list), p_diff]
            if label == BEST_COST:
                over = bats.max_committed_usd > bats.spec.goal_value + 1e-6
                row += [cell(bats) + (" OVER" if over else ""), cell(rr)]
            rows.append(row)
            if label == BEST_COST and name[:2] in ("LM", "LL"):
                ok = ours.complete and lst.complete and dt >= 20.0 and dc >= 6.0
                line = (f"{verdict(ok)} best-cost {name}: broker beats List_eta (same machines) by {dt:.1f}% "
                        f"makespan (goal >= 20%) and {dc:.1f}% cost (goal >= 6%)")
                # 6% below List's cost may be below what any schedule of this bag can cost
                need = lst.cost_usd / 1.06
                if not ok and need < f.cost_floor_usd:
                    line += (f"; the cost goal is unreachable here: 6% below List is ${need:.1f}, less than the "
                             f"${f.cost_floor_usd:.1f} any schedule costs (all work at the lowest price per "
                             f"reference second)")
                goals.append(line)
        header = ["scen.", "front plan", "ours", "List_eta (same machines)", "Diff%", "paper ours", "paper List",
                  "paper Diff%"]
        if label == BEST_COST:
            header += ["BaTS (budget=front cost)", "RR (all)"]
        table(title, header, rows)
    report_list_variants(outcomes, fronts)


def report_list_variants(outcomes: list[Outcome], fronts: dict[str, FrontPoints]) -> None:
    """List_eta at the best-cost point under each reading of 'the eta most efficient machines'."""
    rows = []
    for name, f in fronts.items():
        ours = find(outcomes, section="thesis", scenario=name, policy="broker", label=BEST_COST)
        row = [name, cell(ours), f"${f.cost_floor_usd:.1f}"]
        for variant in LIST_VARIANTS:
            lst = find(outcomes, section="thesis", scenario=name, policy="list", label=BEST_COST, variant=variant)
            if lst is None:
                row.append("-")
                continue
            machines = dict(lst.spec.list_fleet) if lst.spec.list_fleet is not None else None
            if machines is None:
                inv = sc.thesis_inventory(lst.spec.machines)
                machines = _list_eta_machines(inv.types, inv.private, lst.spec.eta)
            row.append(f"{cell(lst)} [{fleet_label(machines)}] ({pct(lst.makespan_s, ours.makespan_s):.0f}/"
                       f"{pct(lst.cost_usd, ours.cost_usd):.1f})")
        rows.append(row)
    table("List_eta at the best-cost point, hours/USD [EC2 machines; private node too] (Diff% vs ours)",
          ["scen.", "ours", "cost floor", *(f"List: {v}" for v in LIST_VARIANTS)], rows)


def report_sla(outcomes: list[Outcome], goals: list[str]) -> None:
    rows = []
    sla = [o for o in outcomes if o.spec.section == "sla"]
    scenarios = {(o.spec.scenario, o.spec.tasks) for o in sla}
    for o in outcomes:
        if o.spec.section not in ("sla", "thesis") or o.spec.policy != "broker" \
                or (o.spec.scenario, o.spec.tasks) not in scenarios:
            continue
        err = o.spec.estimate_error
        err_text = "none" if err is None else f"{err:.0%}"
        dt, dc = pct(o.makespan_s, o.planned_makespan_s), pct(o.cost_usd, o.planned_cost_usd)
        paper = sc.THESIS_SLA.get((o.spec.scenario, o.spec.label, err))
        p_text = "-" if paper is None else (f"{paper_hd(paper[0])} -> {paper_hd(paper[1])} "
                                            f"({pct(paper[1].hours, paper[0].hours):.1f}/"
                                            f"{pct(paper[1].usd, paper[0].usd):.1f})")
        rows.append([o.spec.scenario, f"{o.spec.tasks:,}", o.spec.label, err_text, hd(o.planned_makespan_s, o.planned_cost_usd),
                     cell(o), f"{dt:+.1f}/{dc:+.1f}", p_text])
        tolerance = {0.0: 1.0, 0.3: 2.0}.get(err)
        if tolerance is not None:
            ok = o.complete and abs(dt) <= tolerance and abs(dc) <= tolerance
            line = (f"{verdict(ok)} SLA {o.spec.scenario} n={o.spec.tasks:,} {o.spec.label} error {err_text}: "
                    f"delivered vs promised {dt:+.1f}% makespan, {dc:+.1f}% cost (goal within {tolerance:g}%)")
            if not ok and o.complete and dt <= tolerance and dc <= tolerance:
                line += ("; the miss is in the user's favour (earlier or cheaper than promised: the promise "
                         "pays each machine's last billing hour in full; the thesis's Table 6.6 shows only overruns)")
            goals.append(line)
    rows.sort(key=lambda r: (r[0], r[2], r[3] == "none", r[3]))
    table("Thesis Table 6.6: SLA deviation, proposed (the chosen point as promised) vs delivered, hours/USD, Diff %",
          ["scen.", "tasks", "point", "error", "proposed", "delivered", "Diff%", "paper proposed -> delivered (Diff%)"], rows)


def report_bats(outcomes: list[Outcome], goals: list[str]) -> None:
    rows = []
    for name in sc.BATS_SCENARIOS:
        rr = find(outcomes, section="bats", scenario=name, policy="rr")
        if rr is None:
            continue
        paper = sc.BATS_PAPER[name]
        workload = sc.bats_workload(rr.spec.seed, tasks=rr.spec.tasks)
        rows.append([name, "none (RR)", "-", cell(rr), "-", "-", paper_hd(paper.rr), ""])
        for label, budget in sc.bats_budgets_usd(name, rr.spec.tasks).items():
            bats = find(outcomes, section="bats", scenario=name, policy="bats", label=label)
            ours = find(outcomes, section="bats", scenario=name, policy="broker", label=label)
            p = paper.bats_at_rr if label == "RR cost" else paper.bats_at_bmin
            flags = []
            for who, o in (("BaTS", bats), ("ours", ours)):
                if o.max_committed_usd > budget + 1e-6 or o.cost_usd > budget + 1e-6:
                    flags.append(f"{who} OVER")
            rows.append([name, label, f"{budget:.0f}", "", cell(bats), cell(ours), paper_hd(p), " ".join(flags)])
            over = ours.max_committed_usd > budget + 1e-6 or ours.cost_usd > budget + 1e-6
            faster = ours.complete and p.hours is not None and ours.makespan_s / 3600 < p.hours
            goals.append(f"{verdict(not over)} BaTS {name} budget {label} ${budget:.0f}: ours peak committed "
                         f"${ours.max_committed_usd:.1f}, cost ${ours.cost_usd:.1f} (goal: never over budget)")
            goals.append(f"{verdict(faster)} BaTS {name} budget {label}: ours {ours.makespan_s / 60:.0f} min "
                         f"vs BaTS reported {p.hours * 60:.0f} min (goal: faster)")
        rows.append([name, "our B_min (no sampling)", f"{sc.bats_min_budget_usd(name, workload):.0f}", "", "", "",
                     f"B_min {paper.bmin_usd:.0f} (with sampling)", ""])
    table("BaTS Sec. 3 / Fig. 4: hours/USD (budget in USD)",
          ["scen.", "budget", "USD", "RR (ours)", "BaTS policy", "ours", "BaTS paper", "flags"], rows)


def report_speed(outcomes: list[Outcome], goals: list[str]) -> None:
    rows = [[o.spec.section, o.spec.scenario, o.spec.policy, o.spec.label, f"{o.spec.tasks}",
             f"{o.makespan_s / 86400:.2f}", f"{o.sim_wall_s:.1f}"] for o in outcomes]
    table("Simulator wall time per run (seconds; two runs share the two cores when --jobs 2)",
          ["section", "scen.", "policy", "point/budget", "tasks", "virtual days", "wall s"], rows)
    speed = find(outcomes, section="speed")
    if speed is not None:
        ok = speed.complete and speed.sim_wall_s <= SPEED_GOAL_S
        goals.append(f"{verdict(ok)} speed: {speed.spec.tasks:,} tasks on {4 * speed.spec.machines} machines "
                     f"over {speed.makespan_s / 86400:.1f} days of virtual time in {speed.sim_wall_s:.1f} s "
                     f"(goal <= {SPEED_GOAL_S:g} s)")


def setup_notes(fronts: dict[str, FrontPoints]) -> None:
    print("\nSetup, and where the papers leave it open")
    notes = [
        sc.pow2_cut_note() + " (the thesis's normal tails are unbounded; it does not say how it cut them). "
        "How our front moves with the cut, beside the thesis's figures, and whether a longer tail opens a "
        "gap to List: bench/thesis_cut.py (output kept in bench/results/thesis-cut.txt).",
        "Estimates: one tool, per-task relative error U(-e, +e) (thesis: tau = 2 tools of maximum error e, "
        "weighted by Eq. 6.1; the error's distribution is not given).",
        "Catalogue: one slot per type, hourly billing, no boot delay; the xeon is one slot of speed 10 "
        "(the thesis's 40 cores at 'processing capacity 10'); private cost is $0.32/h over the makespan.",
        "List_eta: the thesis does not say how eta or the machines were chosen for each comparison. The goal "
        "compares List on the same machines as our front point's plan (types and counts). c1.medium and "
        "c1.xlarge are equally cost-efficient, so 'the eta most efficient machines' is ambiguous: taken by name "
        "List gets the slow c1.medium (a makespan gap of some 200% that is the tie-break, not scheduling); "
        "taken faster first it gets more capacity than our plan. The List_eta table shows all three.",
        "Cost goal: every machine List runs at the best-cost point is among the most cost-efficient, so its cost "
        "is within a few percent of the cost floor (the bag's true work at the lowest price per reference "
        "second, any makespan); no schedule can then be 6% cheaper. The goal line says so where it applies.",
        "SLA rows: the proposed point is the promise the controller makes when it resolves the point "
        "(the soonest plan at the chosen point's cost), at n = 100,000 as in the thesis (at n = 10,000 the "
        "plan's fixed allowance, phi = 5 min plus half a task, is ten times the share of the makespan). "
        "The promise is hourly: at best makespan every machine pays the hour the allowance reaches into; a "
        "run that ends before it does not pay it (one hour in 47 is 2.1%).",
        "Best-cost point: the thesis's front ends at T_|E|, a few hours after T_lower; our front goes on to "
        "the private node alone. We take front point 2 (the fastest point that drops the inefficient types).",
        "BaTS: the runtime mean/sd are given as a hint (no sampling phase), BaTS paid $180-$450 to sample; "
        "no boot delay (BaTS had SGE start-up times); budgets are BaTS's own dollars.",
        "Diff% = (List - Ours) / Ours, as the thesis's tables compute it.",
    ]
    for name, f in fronts.items():
        notes.append(f"{name}: front point {f.cost_point_index} {f.cost_point[0]:.1f} h/${f.cost_point[1]:.1f}; "
                     f"the front's cheapest point {f.cheapest[0]:.1f} h/${f.cheapest[1]:.1f}")
    for n in notes:
        print(f"- {n}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 10,000, 20 machines per type, fewer scenarios")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="simulations run at once (processes)")
    args = parser.parse_args(argv)
    print(f"command: python3 bench/reproduce.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, numpy {np.__version__}")
    print(f"seed: {args.seed}")
    wall0 = time.perf_counter()
    runs, fronts = plan_runs(QUICK if args.quick else FULL, args.seed)
    outcomes = run_all(runs, args.jobs)
    report(outcomes, fronts)
    print(f"\n{len(runs)} simulations in {time.perf_counter() - wall0:.0f} s wall")
    return 0


def report(outcomes: list[Outcome], fronts: dict[str, FrontPoints]) -> list[str]:
    """Print every table and the goal lines; return the goal lines."""
    goals: list[str] = []
    setup_notes(fronts)
    report_thesis(outcomes, fronts, goals)
    report_sla(outcomes, goals)
    report_bats(outcomes, goals)
    report_speed(outcomes, goals)
    print("\nGoals")
    for g in goals:
        print(g)
    return goals


if __name__ == "__main__":
    raise SystemExit(main())
