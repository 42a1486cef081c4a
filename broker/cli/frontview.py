"""The Pareto front as a person reads it: the table (``broker plan``, ``broker run``) and the plot
(``plan --plot``, ``report --plot``).

One convention for every figure: a row's makespan and cost are those of the whole run, from
its start (``offset_s``: the time already spent, e.g. sampling, when the front was solved;
``committed_usd``: the money already committed), which is what the plan line, the launch
question, ``broker status``, the report and the metrics show. For ``broker plan`` both offsets
are 0 (the run starts now).

The chosen plan is marked as the row it is: when it has a front point's fleet and cost it *is*
that point (``*`` on row K, and ``--point K`` chooses it); a plan that buys point K's fleet and
cost but finishes sooner (the run keeps K's paid hours side by side: ``FleetPlanner.
soonest_at_cost``) is shown in row K's place and said so; any other chosen plan gets a ``-``
row in makespan order.

The numbered rows are the front's knee points (no plan on the front is 10% faster for at most
0.5% more); when the cheapest plan is not one of them it is row ``c``, after the others.

Columns: ``#`` the point's number (``--point K``, or ``c``), ``makespan`` and ``cost`` of the run, one
column per instance type (instances of it in the plan, with its billing), ``private`` the share
of the planned work your own nodes do, ``status`` the solver's (``optimal``; ``time_limit``: the
best found within the solver's time limit; ``heuristic``: a greedy plan, no solver answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from broker.core.units import format_duration

# Two plans are the same when their fleets match and their figures agree to this much.
_SAME_USD = 0.005
_SAME_S = 0.5


@dataclass(frozen=True)
class Row:
    label: str  # "1", "2", ... (the front point), or "-" (a chosen plan off the front)
    plan: Any  # broker.core.plan.Plan
    makespan_s: float  # from the run's start
    cost_usd: float  # including what was committed before
    chosen: bool = False
    note: str = ""


@dataclass(frozen=True)
class FrontView:
    """A front and its chosen plan, with the offsets that make its figures the run's."""

    work: Any  # broker.core.plan.Work
    types: Sequence[Any]
    front: Sequence[Any]
    chosen: Any | None = None
    offset_s: float = 0.0
    committed_usd: float = 0.0
    goal: Any | None = None  # broker.core.plan.Goal: draws the deadline or budget line
    notes: list[str] = field(default_factory=list)
    # The cheapest plan when it is not a front row (the rows are the knee points: no plan is
    # 10% faster for at most 0.5% more); shown as row ``c``, the plan a run with no goal runs.
    cheapest: Any | None = None

    def rows(self) -> list[Row]:
        rows = [Row(str(k), p, self.offset_s + p.makespan_s, self.committed_usd + p.cost_usd)
                for k, p in enumerate(self.front, 1)]
        if self.cheapest is not None and not any(same_plan(r.plan, self.cheapest) for r in rows):
            rows.append(Row("c", self.cheapest, self.offset_s + self.cheapest.makespan_s,
                            self.committed_usd + self.cheapest.cost_usd))
        c = self.chosen
        if c is None:
            return rows
        for i, row in enumerate(rows):
            if same_plan(row.plan, c):
                rows[i] = Row(row.label, c, row.makespan_s, row.cost_usd, chosen=True)
                return rows
        for i, row in enumerate(rows):
            if _same_fleet(row.plan, c) and abs(row.plan.cost_usd - c.cost_usd) <= _SAME_USD \
                    and c.makespan_s < row.plan.makespan_s:
                rows[i] = Row(row.label, c, self.offset_s + c.makespan_s, row.cost_usd, chosen=True,
                              note=f"point {row.label}'s fleet and cost, finishing sooner than the "
                                   f"{format_duration(row.makespan_s)} solved at its billing boundary")
                return rows
        rows.append(Row("-", c, self.offset_s + c.makespan_s, self.committed_usd + c.cost_usd, chosen=True,
                        note="not a front point: the cheapest plan for the goal lies between two of them"))
        rows.sort(key=lambda r: (r.makespan_s, -r.cost_usd))
        return rows

    def chosen_row(self) -> Row | None:
        return next((r for r in self.rows() if r.chosen), None)


def same_plan(a: Any, b: Any) -> bool:
    return (a is b) or (_same_fleet(a, b) and abs(a.cost_usd - b.cost_usd) <= _SAME_USD
                        and abs(a.makespan_s - b.makespan_s) <= max(_SAME_S, 1e-6 * a.makespan_s))


def _same_fleet(a: Any, b: Any) -> bool:
    return {k: v for k, v in a.fleet.items() if v} == {k: v for k, v in b.fleet.items() if v}


def private_work_share(plan: Any, work: Any) -> float | None:
    """The share of the planned work the private nodes do (None without private nodes)."""
    names = list(getattr(plan, "private_share", {}) or {})
    if not names:
        return None
    if work.total_ref_s <= 0:
        return 0.0
    done = sum(plan.capacity.get(n, 0.0) for n in names)
    return min(1.0, done / work.total_ref_s)


def render_table(view: FrontView) -> str:
    """The front as rows: number, makespan, cost, machines per type (with billing), private share, status."""
    work = view.work
    lines = [f"work: {work.tasks:,} tasks x {_short(work.mean_ref_s)} mean = {_short(work.tasks * work.mean_ref_s)} "
             f"on one speed-1 slot; planned for {_short(work.total_ref_s)} (its upper confidence value)"]
    if view.offset_s > 0 or view.committed_usd > 0:
        lines.append(f"figures from the run's start: {format_duration(view.offset_s)} already run"
                     + (f", ${view.committed_usd:,.2f} already committed" if view.committed_usd > 0 else ""))
    rows = view.rows()
    names = [t.name for t in view.types]
    header = ["", "#", "makespan", "cost"] + [f"{t.name} ({'spot, ' if t.is_spot else ''}{t.billing.describe()})"
                                              for t in view.types]
    header += ["private", "status"]
    table = [header]
    for row in rows:
        share = private_work_share(row.plan, work)
        table.append(["*" if row.chosen else "", row.label, format_duration(row.makespan_s), f"${row.cost_usd:,.2f}"]
                     + [str(row.plan.fleet.get(n, 0)) for n in names]
                     + ["-" if share is None else f"{100 * share:.0f}%", row.plan.status])
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    for r in table:
        lines.append("  ".join(cell.ljust(w) if c < 2 else cell.rjust(w) for c, (cell, w) in
                               enumerate(zip(r, widths))).rstrip())
    if not rows:
        lines.append("(no plan)")
    for row in rows:
        if row.chosen and row.note:
            lines.append(f"* {row.note}")
    last = next((r for r in reversed(rows) if r.label.isdigit()), None)
    cheap = next((r for r in rows if r.label == "c"), None)
    if cheap is not None and last is not None:
        lines.append(f"rows 1-{last.label}: the knee points (no plan is 10% faster for at most 0.5% more); "
                     f"c: the cheapest plan, {100 * (1 - cheap.cost_usd / max(last.cost_usd, 1e-12)):.1f}% below "
                     f"row {last.label} in {cheap.makespan_s / max(last.makespan_s, 1e-9):.1f}x its makespan "
                     f"(no goal, or --theta 1, runs it)")
    lines.extend(view.notes)
    return "\n".join(lines)


def _short(seconds: float) -> str:
    return f"{seconds:.3g}s" if seconds < 60 else format_duration(seconds)


# -- the plot ------------------------------------------------------------------------------------
def time_unit(seconds: float) -> tuple[str, float]:
    if seconds >= 4 * 86400:
        return "days", 86400.0
    if seconds >= 2 * 3600:
        return "hours", 3600.0
    if seconds >= 120:
        return "minutes", 60.0
    return "seconds", 1.0


def pyplot():
    from broker.cli import UsageError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'hybrid-broker[plot]'") from None
    return plt


def draw_front(ax, view: FrontView, *, per: float, mark_chosen: bool = True,
               label: str = "front: the least cost of finishing by then (solved at the numbered points)") -> None:
    """The front as the staircase it is: the least cost of finishing by T drops only at a point
    (plans are bought in whole billing units), so between two points it stays at the faster
    one's cost. The points are solved on a grid of horizons: a plan solved for a horizon
    between two of them (a deadline) may cost a little less than the step above it, never
    less than the next point. Points numbered as ``--point K``; the goal's deadline or budget as a line; the chosen
    plan ringed and labelled as the row it is."""
    every = view.rows()
    chosen = next((r for r in every if r.chosen), None)
    # A chosen plan between two points was solved for its own horizon: it is a point of the
    # front too, and the steps pass through it (unless a faster point is no dearer).
    rows = []
    for r in every:
        if not rows or r.cost_usd < rows[-1].cost_usd - 1e-9:
            rows.append(r)
    if rows:
        xs = [r.makespan_s / per for r in rows]
        ys = [r.cost_usd for r in rows]
        right = xs[-1] + max(0.15 * (xs[-1] - xs[0]), 0.05 * max(xs[-1], 1e-9))
        ax.step(xs + [right], ys + [ys[-1]], where="post", color="tab:blue", linewidth=1.5, label=label)
        lo, hi = min(ys), max(ys)
        # Cost from 0 when the front spans much of it; else a window around the front, so its
        # steps can be read (the axis says where it starts).
        bottom = 0.0 if lo <= 0.5 * hi else max(0.0, lo - 0.25 * (hi - lo) - 0.01 * hi)
        ax.plot(xs, ys, "o", color="tab:blue", markersize=5)
        for r, x, y in zip(rows, xs, ys):
            if r.label != "-":
                ax.annotate(r.label, (x, y), textcoords="offset points", xytext=(4, 5), fontsize=8,
                            color="tab:blue")
        ax.set_ylim(bottom=bottom, top=hi + 0.12 * (hi - bottom) + 1e-9)
    goal = view.goal
    if goal is not None and goal.kind == "deadline":  # a deadline counts from the run's start
        ax.axvline(goal.value / per, color="tab:red", linestyle="--", linewidth=1,
                   label=f"deadline {format_duration(goal.value)}")
    elif goal is not None and goal.kind == "budget" and math.isfinite(goal.value):
        ax.axhline(goal.value, color="tab:red", linestyle="--", linewidth=1, label=f"budget ${goal.value:,.2f}")
    if chosen is not None and mark_chosen:
        name = f"chosen: point {chosen.label}" if chosen.label != "-" else "chosen (between points)"
        ax.plot([chosen.makespan_s / per], [chosen.cost_usd], "o", markersize=13, markerfacecolor="none",
                markeredgecolor="tab:red", markeredgewidth=2, label=name)


def plot_front(view: FrontView, path: str, title: str | None = None) -> None:
    """``broker plan --plot``: the front, its numbered points, the goal's line, the chosen point."""
    plt = pyplot()
    rows = view.rows()
    span = max([r.makespan_s for r in rows] + [view.goal.value
                                                 if view.goal is not None and view.goal.kind == "deadline" else 0.0])
    unit, per = time_unit(span)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_front(ax, view, per=per)
    ax.set_xlabel(f"makespan ({unit})")
    ax.set_ylabel("cost (USD)")
    ax.set_title(title or f"{len(view.front)} points on the front; numbers as --point K", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
