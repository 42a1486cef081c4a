"""What ``broker run`` shows a person: the plan table, the launch question, progress, a summary.

On a terminal: live bars (:class:`~broker.cli.terminal.ProgressBoard`): the tasks (labelled
``sampling`` until the first plan, ``running`` after it, also after a resume past sampling)
with the ETA by the last plan and its interval, and the goal's bar (spend against the budget,
or run time against the deadline). Everything else is printed above the bars: the plan table,
the plan line, the console's log lines, and a summary every tenth of the bag. Off a terminal:
a plain ``progress:`` line every tenth of the bag.

Figures: the plan table, the plan line and the launch question show the same makespan and
cost, those of the whole run from its start (``broker status``, the report and the metrics
show these too): the controller's first plan (``Memory.planned_*``), its front re-solved on
the same work, shifted by the time already run (:class:`~broker.cli.frontview.FrontView`).

The launch question is asked on the terminal (``/dev/tty``), not on stderr: the person who
answers it is at the terminal whatever ``2>log`` or ``>out`` redirect; its answer is read
from standard input (a terminal, or the run refuses without ``--yes``). When standard output
is not that terminal, the question and the answer are also written to it, so the record of
the run says what was agreed.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from broker.cli.terminal import ProgressBoard, duration, goal_text, is_terminal, money, promise_text
from broker.core.units import format_duration

# The ETA (read from the journal) is recomputed at most this often, in wall seconds.
_ETA_EVERY_S = 1.0


class RunConsole:
    """The console of one ``broker run`` (the daemon's ``confirm``, ``on_first_plan`` and
    ``on_progress`` callbacks)."""

    def __init__(self, inventory, goal, total: int, yes: bool, json_report: bool, *, journal=None,
                 clock=None, resumed: bool = False) -> None:
        self.inventory = inventory
        self.goal = goal
        self.total = total
        self.yes = yes
        self.out = sys.stderr if json_report else sys.stdout
        self.every = max(1, total // 10)
        self.journal = journal
        self.clock = clock
        self.resumed = resumed
        self.budget_usd = float(goal.value) if goal.kind == "budget" else None
        self.deadline_s = float(goal.value) if goal.kind == "deadline" else None
        self.plan_shown = resumed and journal is not None and bool(journal.goal_plans())
        self.board = ProgressBoard(self.out) if is_terminal(self.out) else None
        self._eta = ""
        self._eta_at = -1e9
        self._summarised = 0

    @property
    def phase(self) -> str:
        return "running" if self.plan_shown else "sampling"

    # -- the live display ---------------------------------------------------------------------
    def start(self) -> None:
        if self.board is None:
            return
        self.board.bar("tasks", self.phase, self.total, count=f"0/{self.total:,}")
        if self.budget_usd is not None:
            self.board.bar("goal", "spend", max(self.budget_usd, 1e-9), count=f"$0.00 of {money(self.budget_usd)}")
        elif self.deadline_s is not None:
            self.board.bar("goal", "time", self.deadline_s, count=f"0s of {format_duration(self.deadline_s)}")
        self.board.start()

    def close(self) -> None:
        if self.board is not None:
            self.board.stop()

    def say(self, text: str) -> None:
        if self.board is not None:
            self.board.print(text)
        else:
            print(text, file=self.out, flush=True)

    # -- the first plan -----------------------------------------------------------------------
    def show_plan(self, request) -> None:
        """The plan table (a fresh run) and the plan line, before anything is spent."""
        memory = request.memory
        if not self.resumed and request.remaining is not None:
            view = self._front_view(request)
            if view is not None:
                from broker.cli.frontview import render_table

                self.say(render_table(view))
                self._spot_lines(view, request)
        if memory.planned_makespan_s is not None:
            self.say(f"plan: {promise_text(self._promise(request), origin=' from the run start (run time)')}"
                     f", for {goal_text(self.goal.kind, self.goal.value)}")
        if memory.promise is not None:  # before anything is bought: what can be promised, and how surely
            self.say(f"promise: {memory.promise.text()}")
        if memory.last_note and memory.last_note.startswith("deadline"):  # cannot be met, or not at the confidence
            self.say(f"warning: {memory.last_note}")
        self.plan_shown = True
        if self.board is not None:
            self.board.update("tasks", label=self.phase)

    def _spot_lines(self, view, request) -> None:
        """A first plan on spot: its savings, interval and fallback (as ``broker plan``), times
        from the plan's moment."""
        plan = request.memory.last_plan
        if plan is None or not any(t.is_spot for t in self.inventory.types):
            return
        from broker.core.goal import Goal
        from broker.core.plan.spotsummary import spot_summary

        value = float(self.goal.value) if self.goal.kind in ("deadline", "budget") else 0.0
        if self.goal.kind == "deadline":  # the plan's times are from its moment
            value = max(1.0, value - (request.memory.last_plan_at_s or 0.0))
        goal = Goal(self.goal.kind, value) if self.goal.kind in ("deadline", "budget") else None
        try:
            summary = spot_summary(plan, self.inventory.types, self.inventory.private, view.work, goal)
        except (KeyError, ValueError):  # a plan this view cannot price again: the table alone
            return
        if summary is not None:
            self.say("\n".join(summary.lines()))

    def _promise(self, request) -> dict[str, Any]:
        m = request.memory
        return {"makespan_s": m.planned_makespan_s, "cost_usd": m.planned_cost_usd,
                **{k: getattr(m, k) for k in ("makespan_s_range", "cost_usd_range", "confidence") if hasattr(m, k)}}

    def _front_view(self, request):
        """The front the first plan was chosen on (the controller's work: the point value for a
        point, theta or no goal, whose promise is a front point; the upper value for a deadline
        or budget), its figures shifted to the run's start."""
        from broker.cli.frontview import FrontView
        from broker.core.goal import Goal
        from broker.core.plan import NoFeasiblePlan, Work, pareto_front

        rem, memory = request.remaining, request.memory
        promise_goal = self.goal.kind in ("point", "theta", "none")
        total = rem.point_ref_s if promise_goal else rem.upper_ref_s
        work = Work(total_ref_s=max(total, 1e-6), tasks=max(rem.pending + rem.running, 1),
                    mean_ref_s=rem.mean_ref_s, sd_ref_s=rem.sd_ref_s)
        try:
            front = pareto_front(self.inventory.types, self.inventory.private, work)
        except NoFeasiblePlan:
            return None
        plan = memory.last_plan
        offset = memory.last_plan_at_s or 0.0
        chosen = plan
        if promise_goal and memory.planned_makespan_s is not None and plan is not None:
            # The promise is the chosen front point (on the point value); the plan adopted
            # covers the upper value by its deadline. Mark the point promised.
            promised = [p for p in front if abs(offset + p.makespan_s - memory.planned_makespan_s) <= 0.5
                        and abs(p.cost_usd - memory.planned_cost_usd) <= 0.005]
            chosen = promised[0] if promised else _promised_plan(plan, memory, offset)
        notes = []
        if not promise_goal and plan is not None:
            chosen, notes = _as_launched(plan, request, offset)
        goal = Goal(self.goal.kind, float(self.goal.value)) if self.goal.kind in ("deadline", "budget") else None
        return FrontView(work, self.inventory.types, front, chosen, offset_s=offset, goal=goal, notes=notes)

    # -- the question -------------------------------------------------------------------------
    def confirm(self, request) -> bool:
        count = sum(c for _, c in request.launches)
        fleet = ", ".join(f"{c} x {t}" for t, c in request.launches)
        planned = request.memory.planned_cost_usd
        cost = (f"the plan costs ~{money(planned)} in all" if planned is not None
                else f"~{money(request.estimated_usd)}")
        question = f"Launch {count} instance{'s' if count != 1 else ''} ({fleet}); {cost}? [y/N] "
        if self.yes:
            self.say(question + "yes (--yes)")
            return True
        if self.board is not None:
            with self.board.paused():
                answer = ask(question)
        else:
            answer = ask(question)
        return answer.strip().lower() in ("y", "yes")

    # -- progress -----------------------------------------------------------------------------
    def progress(self, done: int, failed: int, total: int, committed_usd: float) -> None:
        """Bars on a terminal; a summary (terminal) or a plain line every tenth of the bag."""
        settled = done + failed
        last = settled >= total
        if self.board is not None:
            eta = "all settled" if last else self._eta_text()
            count = f"{done:,}/{total:,}" + (f", {failed:,} failed" if failed else "")
            self.board.update("tasks", completed=settled, total=total, count=count, info=eta, label=self.phase)
            self._goal_bar(committed_usd)
        tenth = settled // self.every
        if tenth > self._summarised or last:
            self._summarised = tenth
            if self.board is not None:
                self.say(self._summary(done, failed, total, committed_usd))
            elif done % self.every == 0 or last:
                print(f"progress: {done}/{total} done, {failed} failed, ${committed_usd:.2f} committed"
                      + (" (sampling)" if self.phase == "sampling" else ""), file=self.out, flush=True)

    def _goal_bar(self, committed_usd: float) -> None:
        if self.budget_usd is not None:
            self.board.update("goal", completed=min(committed_usd, self.budget_usd),
                              count=f"{money(committed_usd)} of {money(self.budget_usd)}")
        elif self.deadline_s is not None and self.clock is not None:
            now = self.clock.now_s()
            self.board.update("goal", completed=min(now, self.deadline_s),
                              count=f"{format_duration(now)} of {format_duration(self.deadline_s)}")

    def _summary(self, done: int, failed: int, total: int, committed_usd: float) -> str:
        stamp = time.strftime("%H:%M:%S")
        text = f"{stamp} {self.phase}: {done:,}/{total:,} done, {failed:,} failed, {money(committed_usd)} committed"
        if self.budget_usd is not None:
            text += f" of {money(self.budget_usd)}"
        eta = self._eta_text()
        return text + (f", {eta}" if eta else "")

    def _eta_text(self) -> str:
        """``eta 3m20s (90%: 2m10s-4m00s)`` by the last plan (the figures ``broker status`` and
        the metrics show), in run time; recomputed at most once a second."""
        if self.journal is None or self.clock is None:
            return ""
        wall = time.monotonic()
        if wall - self._eta_at < _ETA_EVERY_S:
            return self._eta
        self._eta_at = wall
        from broker.shells.metrics import figures, interval_level

        try:
            interval = figures(self.journal, self.clock.epoch_s()).eta_interval_s()
        except Exception:  # noqa: BLE001 - the display must never stop the run
            interval = None
        if interval is None:
            self._eta = ""
        elif interval[2] < 0:
            self._eta = "past the plan's end"
        else:
            low, mid, high = (max(0.0, x) for x in interval)
            self._eta = f"eta {duration(mid)} ({interval_level():.0%}: {duration(low)}-{duration(high)})"
        return self._eta


def _promised_plan(plan, memory, offset_s: float):
    """The adopted plan carrying the promised figures (a promise that is no front point)."""
    from dataclasses import replace

    return replace(plan, makespan_s=memory.planned_makespan_s - offset_s, cost_usd=memory.planned_cost_usd)


def _as_launched(plan, request, offset_s: float):
    """The adopted plan as the run buys it: the controller launches no more slots than there are
    pending tasks (the planner sees the work as divisible), and its plan figures count only what
    is launched; the table row shows that fleet and cost."""
    from dataclasses import replace

    memory = request.memory
    launched: dict[str, int] = {}
    for name, count in request.launches:
        launched[name] = launched.get(name, 0) + count
    planned_new: dict[str, int] = {}
    for group in plan.new:
        planned_new[group.type_name] = planned_new.get(group.type_name, 0) + group.count
    if launched == planned_new or memory.planned_cost_usd is None:
        return plan, []
    fleet = {name: count - planned_new.get(name, 0) + launched.get(name, 0) for name, count in plan.fleet.items()}
    shown = replace(plan, fleet=fleet, cost_usd=memory.planned_cost_usd,
                    makespan_s=(memory.planned_makespan_s or offset_s + plan.makespan_s) - offset_s)
    before, after = sum(planned_new.values()), sum(launched.values())
    return shown, [f"* the solver's {before} new instances trimmed to the {after} that the pending tasks can "
                   f"use (a slot takes one task at a time): the plan buys those"]


def ask(question: str) -> str:
    """Ask on the terminal; the answer from standard input."""
    try:
        tty = open("/dev/tty", "w", encoding="utf-8")
    except OSError:
        tty = None
    where = tty if tty is not None else sys.stdout
    try:
        where.write(question)
        where.flush()
        try:
            answer = sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            answer = ""
        if tty is not None and not is_terminal(sys.stdout):
            print(question + (answer.strip() or "(no answer)"), file=sys.stdout, flush=True)
        return answer
    finally:
        if tty is not None:
            tty.close()
