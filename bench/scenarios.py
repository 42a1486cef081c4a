"""The papers' scenarios as inventories and workloads, with the figures the papers report.

Shared by ``bench/reproduce.py`` (the reproduction report) and its smoke test.

Thesis (002, Ch. 6.5, Tables 6.2-6.6; ALGORITHMS.md 7)
    EC2 types, one slot each, hourly billing, no boot delay (the thesis gives none):
    m1.small speed 1 at $0.080/h, c1.medium 5 at $0.165, m1.large 4 at $0.320,
    c1.xlarge 20 at $0.660; ``machines_per_type`` (20 or 60) of each; one private node
    'xeon' of speed 10 at $0.320/h. Workloads LS, LM, LL: n tasks of 2^x minutes on
    m1.small (``broker.sim.workloads.BUILTIN``; the normal cases are cut to
    x in ``DEFAULT_X_CUT``), with per-task estimates whose relative error is uniform in
    [-e, +e] (the thesis uses tau = 2 tools of maximum error e; we use one tool).

BaTS (003, Sec. 3)
    1000 tasks, runtime N(15 min, sd sqrt(5) min) on cluster0; two clusters of 32
    one-slot machines; cluster0 $3 per 60-minute ATU at speed 1; cluster1 (price, speed)
    per scenario; monitoring every 5 minutes. Budgets are BaTS's own dollars, scaled by
    tasks / 1000 when a smaller bag is run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from broker.core.billing import Billing
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimWorkload
from broker.sim.workloads import BUILTIN, DEFAULT_X_CUT, build_workload

# -- thesis -----------------------------------------------------------------------------------
THESIS_TYPES: tuple[tuple[str, float, float], ...] = (
    ("m1.small", 1.0, 0.080),
    ("c1.medium", 5.0, 0.165),
    ("m1.large", 4.0, 0.320),
    ("c1.xlarge", 20.0, 0.660),
)
XEON = PrivateNode("xeon", slots=1, speed=10.0, cost_per_hour=0.320)
THESIS_WORKLOADS = ("LS", "LM", "LL")
THESIS_TASKS = 100_000
THESIS_TICK_S = 60.0


def thesis_inventory(machines_per_type: int) -> Inventory:
    types = tuple(
        MachineType(name, slots=1, speed=speed, price_per_hour=price, limit=machines_per_type,
                    billing=Billing.hourly())
        for name, speed, price in THESIS_TYPES
    )
    return Inventory(private=(XEON,), types=types)


def thesis_workload(name: str, seed: int, *, tasks: int = THESIS_TASKS,
                    estimate_error: float | None = 0.1, x_cut_hi: float | None = None) -> SimWorkload:
    """LS/LM/LL with per-task estimates of relative error U(-e, +e); e = 0 gives exact ones,
    None none at all (non-clairvoyant: only the bag's mean is known, as a hint).
    ``x_cut_hi`` moves the upper tail cut of LM/LL (default ``DEFAULT_X_CUT``)."""
    spec = dict(BUILTIN[name])
    if x_cut_hi is not None:
        spec["runtime"] = dict(spec["runtime"], x_cut=[DEFAULT_X_CUT[0], x_cut_hi])
    if estimate_error is not None:
        spec["estimates"] = {"error": estimate_error}
    return build_workload(spec, seed, tasks=tasks, name=name)


def pow2_cut_note() -> str:
    lo, hi = DEFAULT_X_CUT
    return (f"LM/LL: x ~ N(m, 3) redrawn outside [{lo:g}, {hi:g}], i.e. tasks of "
            f"{60 * 2 ** lo:.0f} s to {2 ** hi:.0f} min")


@dataclass(frozen=True, slots=True)
class PaperPoint:
    """A (makespan, cost) pair as a paper prints it; None where it prints nothing."""

    hours: float | None
    usd: float | None


# Thesis Table 6.4 (T_lower, best makespan) and Table 6.5 (T_upper, best cost): ours / List_eta.
THESIS_BEST_MAKESPAN: dict[str, tuple[PaperPoint, PaperPoint]] = {
    "LS20": (PaperPoint(7.7, 196.1), PaperPoint(8.2, 206.6)),
    "LS60": (PaperPoint(3.8, 196.8), PaperPoint(4.1, 205.9)),
    "LM20": (PaperPoint(79.2, 1967.8), PaperPoint(84.2, 2037.6)),
    "LM60": (PaperPoint(39.7, 1968.0), PaperPoint(42.4, 2067.5)),
    "LL20": (PaperPoint(154.3, 3811.9), PaperPoint(163.2, 4003.2)),
    "LL60": (PaperPoint(77.2, 3834.8), PaperPoint(82.2, 4024.8)),
}
THESIS_BEST_COST: dict[str, tuple[PaperPoint, PaperPoint]] = {
    "LS20": (PaperPoint(7.9, 184.9), PaperPoint(9.4, 197.2)),
    "LS60": (PaperPoint(4.0, 186.6), PaperPoint(4.2, 201.7)),
    "LM20": (PaperPoint(81.4, 1879.5), PaperPoint(110.9, 1975.5)),
    "LM60": (PaperPoint(40.7, 1881.2), PaperPoint(53.3, 1997.6)),
    "LL20": (PaperPoint(158.7, 3642.8), PaperPoint(216.2, 3833.9)),
    "LL60": (PaperPoint(79.4, 3667.4), PaperPoint(110.0, 3862.0)),
}
# Thesis Table 6.6: (scenario, point, max tool error) -> (proposed, delivered); T_0 = best
# makespan, T_|E| = best cost.
THESIS_SLA: dict[tuple[str, str, float], tuple[PaperPoint, PaperPoint]] = {
    ("LM20", "best-makespan", 0.1): (PaperPoint(78.9, 1957), PaperPoint(79.2, 1967.8)),
    ("LM20", "best-makespan", 0.3): (PaperPoint(78.9, 1958), PaperPoint(79.9, 1967.8)),
    ("LL20", "best-makespan", 0.1): (PaperPoint(153.9, 3802), PaperPoint(154.3, 3811.9)),
    ("LL20", "best-makespan", 0.3): (PaperPoint(153.9, 3803), PaperPoint(155.8, 3812.7)),
    ("LM20", "best-cost", 0.1): (PaperPoint(81.2, 1868), PaperPoint(81.4, 1879.5)),
    ("LM20", "best-cost", 0.3): (PaperPoint(81.2, 1869), PaperPoint(81.4, 1879.5)),
    ("LL20", "best-cost", 0.1): (PaperPoint(157.9, 3630), PaperPoint(158.7, 3642.8)),
    ("LL20", "best-cost", 0.3): (PaperPoint(157.9, 3632), PaperPoint(159.2, 3665.7)),
}

# -- BaTS -------------------------------------------------------------------------------------
BATS_TASKS = 1000
BATS_MACHINES_PER_CLUSTER = 32
BATS_ATU_S = 3600.0
BATS_TICK_S = 300.0
BATS_CLUSTER0 = (3.0, 1.0)  # USD per ATU, speed
# cluster1 (USD per ATU, speed) per scenario, in BaTS's Figure 4 order.
BATS_SCENARIOS: dict[str, tuple[float, float]] = {
    "S4-1": (12.0, 1.0),
    "S4-3": (12.0, 3.0),
    "S1-1": (3.0, 1.0),
    "S3-4": (9.0, 4.0),
    "S1-4": (3.0, 4.0),
}


def _minutes(m: int, s: int) -> float:
    return (m * 60 + s) / 3600.0


@dataclass(frozen=True, slots=True)
class BatsPaper:
    """BaTS Sec. 3 for one scenario: RR, BaTS at RR's cost, BaTS at k x B_min (hours, USD)."""

    rr: PaperPoint
    bats_at_rr: PaperPoint
    bmin_usd: float
    bmin_factor: float
    bmin_budget_usd: float
    bats_at_bmin: PaperPoint


BATS_PAPER: dict[str, BatsPaper] = {
    "S4-1": BatsPaper(PaperPoint(_minutes(246, 16), 2034), PaperPoint(_minutes(279, 48), None),
                      1026, 1.1, 1128, PaperPoint(_minutes(446, 46), 1116)),
    "S4-3": BatsPaper(PaperPoint(_minutes(133, 10), 1062), PaperPoint(_minutes(170, 5), None),
                      846, 1.2, 1015, PaperPoint(_minutes(176, 26), 1014)),
    "S1-1": BatsPaper(PaperPoint(_minutes(246, 15), 810), PaperPoint(_minutes(293, 17), 804),
                      756, 1.1, 831, PaperPoint(_minutes(284, 23), 828)),
    "S3-4": BatsPaper(PaperPoint(_minutes(110, 6), 768), PaperPoint(_minutes(108, 47), 744),
                      594, 1.1, 653, PaperPoint(_minutes(118, 9), 651)),
    "S1-4": BatsPaper(PaperPoint(_minutes(110, 5), 384), PaperPoint(_minutes(111, 28), 372),
                      258, 1.2, 309, PaperPoint(_minutes(116, 42), None)),
}


def bats_inventory(scenario: str, machines_per_cluster: int = BATS_MACHINES_PER_CLUSTER) -> Inventory:
    atu = Billing.custom(BATS_ATU_S, BATS_ATU_S)
    per_hour = 3600.0 / BATS_ATU_S
    (c0_usd, c0_speed), (c1_usd, c1_speed) = BATS_CLUSTER0, BATS_SCENARIOS[scenario]
    types = (
        MachineType("cluster0", 1, c0_speed, c0_usd * per_hour, machines_per_cluster, billing=atu),
        MachineType("cluster1", 1, c1_speed, c1_usd * per_hour, machines_per_cluster, billing=atu),
    )
    return Inventory(types=types)


def bats_workload(seed: int, *, tasks: int = BATS_TASKS) -> SimWorkload:
    """BaTS's bag; the mean and sd are given to the broker as a hint (``prior: exact``)."""
    spec = dict(BUILTIN["bats"])
    spec["prior"] = "exact"
    return build_workload(spec, seed, tasks=tasks, name="bats")


def bats_budgets_usd(scenario: str, tasks: int = BATS_TASKS) -> dict[str, float]:
    """BaTS's two budgets for the scenario (its RR's cost; k x B_min), scaled to the bag size."""
    paper = BATS_PAPER[scenario]
    scale = tasks / BATS_TASKS
    return {"RR cost": paper.rr.usd * scale, f"{paper.bmin_factor:g} B_min": paper.bmin_budget_usd * scale}


def bats_min_budget_usd(scenario: str, workload: SimWorkload) -> float:
    """B_min without BaTS's sampling: the whole bag on one machine of the most profitable
    cluster (most speed per dollar), in whole ATUs: ceil(W / (s ATU)) x c."""
    clusters = (BATS_CLUSTER0, BATS_SCENARIOS[scenario])
    usd, speed = max(clusters, key=lambda c: (c[1] / c[0], c[1]))
    total_ref_s = float(workload.runtimes_ref_s.sum())
    return math.ceil(total_ref_s / (speed * BATS_ATU_S)) * usd


# -- the league (bench/league.py; issue 15) ----------------------------------------------------
# Every scenario is built from plain values, so a run crosses process boundaries; bench/promises.py
# reuses them. ``LeagueScenario.inventory()`` and ``.workload(seed)`` build it; ``tick_s`` is the
# monitoring interval every policy gets.
@dataclass(frozen=True, slots=True)
class LeagueScenario:
    """One league scenario.

    kind:       "thesis" (the thesis catalogue, ``machines`` of each type, hourly, the xeon),
                "persecond" (the same catalogue billed per second with a 60 s minimum and a
                60 s boot), or "bats" (BaTS's two clusters, ``bats_scenario``)
    workload:   LS, LM, LL (thesis), "bats", or "heavy" (lognormal, sigma 1, mean
                ``heavy_mean_s``, capped at ``heavy_cap_s``, the bag's timeout)
    error:      per-task estimates within +/- error (uniform); None: no per-task estimates and
                no prior mean either (every policy learns the runtimes from the tasks it runs)
    """

    name: str
    kind: str
    workload_name: str
    tasks: int
    machines: int = 20
    error: float | None = 0.1
    bats_scenario: str | None = None
    heavy_mean_s: float = 900.0
    heavy_cap_s: float = 4 * 3600.0

    @property
    def tick_s(self) -> float:
        return BATS_TICK_S if self.kind == "bats" else THESIS_TICK_S

    def inventory(self) -> Inventory:
        if self.kind == "bats":
            return bats_inventory(self.bats_scenario, self.machines)
        inv = thesis_inventory(self.machines)
        if self.kind == "persecond":
            types = tuple(MachineType(t.name, t.slots, t.speed, t.price_per_hour, t.limit, boot_s=60.0,
                                      billing=Billing.per_second()) for t in inv.types)
            return Inventory(private=inv.private, types=types)
        return inv

    def workload(self, seed: int) -> SimWorkload:
        if self.workload_name == "bats":
            return bats_workload(seed, tasks=self.tasks)
        if self.workload_name == "heavy":
            return heavy_tailed_workload(seed, tasks=self.tasks, mean_s=self.heavy_mean_s, cap_s=self.heavy_cap_s,
                                         estimate_error=self.error)
        spec = dict(BUILTIN[self.workload_name])
        if self.error is not None:
            spec["estimates"] = {"error": self.error}
        else:
            spec["prior"] = "none"
        return build_workload(spec, seed, tasks=self.tasks, name=self.workload_name)


def heavy_tailed_workload(seed: int, *, tasks: int, mean_s: float = 900.0, cap_s: float = 4 * 3600.0,
                          estimate_error: float | None = None) -> SimWorkload:
    """Lognormal runtimes, sigma 1, mean ``mean_s`` before the cap; every runtime capped at
    ``cap_s`` (the bag's timeout: a task that reaches it ends there). Without estimates no prior
    mean is given."""
    spec = {"runtime": {"dist": "lognormal", "mean": f"{mean_s}s", "sigma": 1.0}, "prior": "none"}
    if estimate_error is not None:
        spec["estimates"] = {"error": estimate_error}
        del spec["prior"]
    w = build_workload(spec, seed, tasks=tasks, name="heavy")
    runtimes = np.minimum(w.runtimes_ref_s, cap_s)
    estimates = None if w.estimates_ref_s is None else np.minimum(w.estimates_ref_s, cap_s)
    prior = None if estimates is None else float(estimates.mean())
    prior_sd = None if estimates is None else float(estimates.std())
    return SimWorkload(runtimes, estimates, prior, prior_sd, "heavy")


def league_scenarios(quick: bool = False, thesis_tasks: int = 10_000) -> list[LeagueScenario]:
    """The league's scenarios: thesis LS/LM/LL on 20 and 60 machines a type (estimates within
    10%), BaTS's five, a per-second billed catalogue, LM with no estimates and with 30% error, a
    heavy-tailed bag. ``quick``: LM20 (10% and no estimates), BaTS S1-4, per-second and heavy tail,
    the thesis-catalogue ones at 2,000 tasks."""
    n = thesis_tasks
    thesis = [LeagueScenario(f"{w}{m}", "thesis", w, n, m) for m in (20, 60) for w in THESIS_WORKLOADS]
    bats = [LeagueScenario(f"BaTS {s}", "bats", "bats", BATS_TASKS, BATS_MACHINES_PER_CLUSTER, None, s)
            for s in BATS_SCENARIOS]
    others = [
        LeagueScenario("LM20 per-second", "persecond", "LM", n, 20),
        LeagueScenario("LM20 no estimates", "thesis", "LM", n, 20, error=None),
        LeagueScenario("LM20 30% error", "thesis", "LM", n, 20, error=0.3),
        LeagueScenario("heavy tail", "thesis", "heavy", n, 20, error=None),
    ]
    if quick:
        q = 2_000
        return [LeagueScenario("LM20", "thesis", "LM", q, 20),
                LeagueScenario("LM20 no estimates", "thesis", "LM", q, 20, error=None),
                LeagueScenario("BaTS S1-4", "bats", "bats", BATS_TASKS, BATS_MACHINES_PER_CLUSTER, None, "S1-4"),
                LeagueScenario("LM20 per-second", "persecond", "LM", q, 20),
                LeagueScenario("heavy tail", "thesis", "heavy", q, 20, error=None)]
    return thesis + bats + others
