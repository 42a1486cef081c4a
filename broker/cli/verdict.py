"""Was the user's goal met? By how much was it missed, and why (``broker run`` and
``broker simulate`` exit 1 on a miss; README "Exit status").

A goal is missed when:

- ``deadline T``: the bag was not done by ``T`` (makespan > T, or tasks left);
- ``budget B``: the run spent more than ``B`` (cloud plus private nodes' cost), or the budget
  stopped it with tasks left;
- ``point``/``theta``/no goal: tasks were left (these goals promise a finish, not a date).

Tasks given up on after their retries (quarantined) count as left: the bag is not done.

The causes a shell can tell (each only when its fact is known):

- *the goal was out of reach from the start*: the first plan already ended after the
  deadline (the fastest plan was run);
- *capacity refused*: EC2 refused launches;
- *estimates wrong*: the bag's work was more than the first plan covered;
- *a straggler*: the bag was otherwise done in time, the last task ran past the deadline;
- *tasks failed*: some tasks never succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.core.units import format_duration

_TOLERANCE_S = 1e-6


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a run delivered, and what the shell knows of why."""

    makespan_s: float
    cost_usd: float
    tasks_total: int
    tasks_done: int
    budget_stopped: bool = False
    tasks_failed: int = 0
    first_planned_makespan_s: float | None = None
    launches_refused: int = 0
    planned_work_ref_s: float | None = None  # what the first plan covered
    actual_work_ref_s: float | None = None  # what the bag turned out to need
    second_last_end_s: float | None = None  # when the bag was done but for its last task
    last_runtime_s: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool
    summary: str
    causes: tuple[str, ...] = ()

    def text(self) -> str:
        if self.met or not self.causes:
            return self.summary
        return f"{self.summary}: " + "; ".join(self.causes)


def facts_of_simulation(r) -> RunFacts:
    """The facts of a :class:`broker.sim.engine.SimResult`."""
    return RunFacts(
        makespan_s=r.makespan_s, cost_usd=r.cost_usd, tasks_total=r.tasks_total, tasks_done=r.tasks_done,
        budget_stopped=r.budget_stopped, tasks_failed=r.tasks_quarantined,
        first_planned_makespan_s=r.planned_makespan_s, launches_refused=r.launches_refused,
        planned_work_ref_s=r.planned_work_ref_s, actual_work_ref_s=r.actual_work_ref_s,
        second_last_end_s=r.second_last_end_s, last_runtime_s=r.last_runtime_s,
    )


def judge(goal_kind: str | None, goal_value: float | None, f: RunFacts) -> Verdict:
    left = max(f.tasks_total - f.tasks_done, 0)
    if goal_kind == "deadline" and goal_value is not None:
        return _deadline(float(goal_value), f, left)
    if goal_kind == "budget" and goal_value is not None:
        return _budget(float(goal_value), f, left)
    if left:
        return Verdict(False, f"goal missed: {left} of {f.tasks_total} tasks not done", _failed(f))
    return Verdict(True, f"done: {f.tasks_total} tasks in {format_duration(f.makespan_s)} for ${f.cost_usd:.2f}")


def _deadline(deadline_s: float, f: RunFacts, left: int) -> Verdict:
    late = f.makespan_s - deadline_s
    if not left and late <= _TOLERANCE_S:
        return Verdict(True, f"deadline {format_duration(deadline_s)} met with "
                             f"{format_duration(-late)} to spare")
    if left:
        summary = f"deadline {format_duration(deadline_s)} missed: {left} of {f.tasks_total} tasks not done"
    else:
        summary = (f"deadline {format_duration(deadline_s)} missed by {format_duration(late)} "
                   f"({100 * late / deadline_s:.1f}%)")
    causes = []
    if f.first_planned_makespan_s is not None and f.first_planned_makespan_s > deadline_s + _TOLERANCE_S:
        causes.append(f"out of reach from the start: the fastest plan took "
                      f"{format_duration(f.first_planned_makespan_s)}")
    if f.launches_refused:
        causes.append(f"capacity refused: EC2 refused {f.launches_refused} launch"
                      f"{'es' if f.launches_refused != 1 else ''}")
    if f.planned_work_ref_s and f.actual_work_ref_s and f.actual_work_ref_s > f.planned_work_ref_s:
        causes.append(f"estimates wrong: the bag needed {100 * (f.actual_work_ref_s / f.planned_work_ref_s - 1):.1f}% "
                      f"more work than the first plan covered")
    if not left and f.second_last_end_s is not None and f.second_last_end_s <= deadline_s:
        ran = "" if f.last_runtime_s is None else f" (it ran {format_duration(f.last_runtime_s)})"
        causes.append(f"a straggler: all but the last task were done by {format_duration(f.second_last_end_s)}{ran}")
    causes += _failed(f)
    return Verdict(False, summary, tuple(causes))


def _budget(budget_usd: float, f: RunFacts, left: int) -> Verdict:
    over = f.cost_usd - budget_usd
    if over > 1e-9:
        return Verdict(False, f"budget ${budget_usd:.2f} exceeded by ${over:.2f}", _failed(f))
    if left and f.budget_stopped:
        return Verdict(False, f"budget ${budget_usd:.2f} ran out with {left} of {f.tasks_total} tasks not done",
                       _failed(f))
    if left:
        return Verdict(False, f"goal missed: {left} of {f.tasks_total} tasks not done", _failed(f))
    return Verdict(True, f"budget ${budget_usd:.2f} kept: spent ${f.cost_usd:.2f}")


def _failed(f: RunFacts) -> tuple[str, ...]:
    if f.tasks_failed:
        return (f"tasks failed: {f.tasks_failed} never succeeded",)
    return ()


def late_but_done(output: str) -> bool:
    """Whether a ``broker run`` output (the text, or its ``--json-report`` object) says the
    only thing missed was the deadline: every task done, the end late. Resume and fault
    tests run dry runs whose run clock keeps going while a daemon is down or the machine is
    loaded; their deadline is incidental to what they check."""
    import json

    text = output.strip()
    try:
        summary = json.loads(text.splitlines()[-1])["goal"]["summary"] if text else ""
    except (ValueError, KeyError, TypeError):
        lines = [line for line in text.splitlines() if line.strip()]
        summary = lines[-1] if lines else ""
    return summary.startswith("deadline ") and " missed by " in summary
