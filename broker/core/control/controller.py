"""``Controller.decide(snapshot, memory, now) -> Decision``: the control loop of ALGORITHMS.md 5.

A fixed pipeline of named passes, each pure:

1. ``_finish_or_stop``  bag done or the user stops: release everything now.
2. ``_sample``          no runtime estimate yet: draw tasks uniformly at random onto free
                        slots (a minimal instance is launched only if there is nowhere to sample).
3. ``_plan``            every re-plan interval (or when the fleet is off its plan): remaining
                        work at its upper confidence value, re-solved against the goal with
                        the current fleet as existing instances, the policy's fleet rule.
4. ``_fleet``           diff plan and fleet: launch what is missing; schedule each instance's
                        release at its planned paid-until minus a margin; lengthen at once,
                        shorten only once a surplus persists ``scale_down_after_s``; a fleet
                        that still meets the goal is only ever shed (the first-leaving instance
                        pulled in furthest), never relaunched; launches must survive a -h
                        change of the work (hysteresis);
                        the budget cap is applied to every unit before it is bought.
5. ``_dispatch``        free slots pull work: largest task that ends before the slot's
                        release (never one that would be killed or buy an unplanned unit);
                        tail replication on paid idle slots when nothing is pending.

Budget invariant: every instance always has a scheduled release, and the planned spend
(each live instance charged up to its scheduled release, plus what terminated ones cost)
never exceeds the budget; a launch or a lengthening that would break it is cut or refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..model import MachineType
from ..plan.types import Extension
from .actions import (
    Action,
    Assign,
    Launch,
    Replicate,
    ScheduleRelease,
    SlotRef,
    StopForBudget,
)
from .estimates import RemainingWork, mean_estimate, remaining_work
from .planning import FleetPlanner, PlanResult
from .snapshot import Goal, Memory, NodeView, Snapshot

POLICIES = ("broker", "list", "rr", "firstfit", "1vm4all", "bats")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    policy: str = "broker"
    eta: int | None = None  # List_eta: number of most cost-efficient machines
    # List on exactly these machines ((type, count), ...) instead of the eta most efficient:
    # the reproduction report runs List on the machines of our front point's plan
    list_fleet: tuple[tuple[str, int], ...] | None = None
    tick_s: float = 60.0
    margin_s: float = 120.0  # release this long before paid-until (above terminate latency)
    replan_every_s: float = 900.0
    replan_drift: float = 0.05  # re-plan early when remaining work drifts this much from the plan
    min_replan_gap_s: float = 300.0  # ... but not more often than this
    scale_down_after_s: float = 600.0  # a surplus must be proposed this long before it is released
    hysteresis: float = 0.2  # a fleet change must survive a +/- 20% change of the work ...
    # ... or, once the estimate has firmed up, a change of the work by its own confidence
    # band (upper - point) / point, but never less than this (see _hysteresis_band)
    hysteresis_min: float = 0.01
    confidence_z: float = 1.645
    replicate: bool = True
    min_samples: int = 30  # sampling phase length when nothing is known about runtimes
    max_sample_fraction: float = 0.2  # ... but at most this share of the bag
    fit_safety: float = 1.0  # a task with an estimate fits when estimate x this <= time to release x speed
    warm_start: bool = True  # budget re-plans start their search where the last plan ended
    fit_z: float = 1.28  # a task without one fits when mean + fit_z sd does (about its 90% quantile)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.list_fleet is not None and any(count < 0 for _, count in self.list_fleet):
            raise ValueError(f"list_fleet counts must be >= 0, got {self.list_fleet!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    memory: Memory
    remaining: RemainingWork | None = None
    notes: tuple[str, ...] = ()


@dataclass
class _Scratch:
    """Per-decision working state (never leaves ``decide``)."""

    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    used_slots: set[tuple[str, int]] = field(default_factory=set)  # slots given work in this decision
    release: dict[str, float] = field(default_factory=dict)  # releases changed by this decision
    launched_usd: float = 0.0

    def release_of(self, node: NodeView) -> float | None:
        return self.release.get(node.id, node.release_at_s)


class Controller:
    def __init__(self, goal: Goal, config: ControllerConfig = ControllerConfig(), planner: FleetPlanner | None = None,
                 private=()):
        self.goal = goal
        self.config = config
        self.planner = planner or FleetPlanner()
        self.private = tuple(private)

    # ---------------------------------------------------------------------------------------
    def decide(self, snap: Snapshot, memory: Memory, now: float | None = None, rng=None, tick: bool = True) -> Decision:
        now = snap.now_s if now is None else now
        s = _Scratch()
        if self._finish_or_stop(snap, now, s):
            return Decision(tuple(s.actions), memory, None, tuple(s.notes))
        mean = mean_estimate(snap)
        if mean is not None:
            mean = (mean, mean + self.config.fit_z * _sd_estimate(snap, mean))
        if mean is None or snap.observations.count < self._samples_needed(snap):
            # Sampling phase: no plan is made on a handful of runtimes.
            memory = self._sample(snap, memory, now, rng, s)
            return Decision(tuple(s.actions), memory, None, tuple(s.notes))
        # Remaining work is only needed to re-plan; dispatch needs the mean alone.
        rem = remaining_work(snap, self.config.confidence_z) if tick else None
        if rem is not None:
            memory = self._plan_and_fleet(snap, memory, now, rem, s)
            if self.config.policy == "broker":
                self._keep_running_work(snap, now, mean[1], s, "running_task_needs_longer")
        self._dispatch(snap, memory, now, mean, rng, s)
        return Decision(tuple(s.actions), memory, rem, tuple(s.notes))

    # -- pass 1 ------------------------------------------------------------------------------
    def _finish_or_stop(self, snap: Snapshot, now: float, s: _Scratch) -> bool:
        nothing_left = len(snap.pending) == 0 and snap.count_running() == 0
        if not (nothing_left or snap.stopping):
            return False
        cause = "user_stop" if snap.stopping else "bag_done"
        for n in snap.nodes:
            if n.is_private:
                continue
            if n.release_at_s is None or n.release_at_s > now:
                if snap.stopping or not n.running:
                    s.actions.append(ScheduleRelease(n.id, now, cause))
        return True

    # -- pass 2 ------------------------------------------------------------------------------
    def _samples_needed(self, snap: Snapshot) -> int:
        """Runtimes to see before the first plan: ``min_samples``, but never more than
        ``max_sample_fraction`` of the bag (a bag of 20 tasks is not sampled whole). The
        (eps, delta) stopping rules of ``broker plan --sample`` replace this when used."""
        if snap.prior_mean_ref_s is not None:
            return 0
        cap = max(2, math.ceil(self.config.max_sample_fraction * snap.tasks_total))
        return min(self.config.min_samples, cap, snap.tasks_total)

    def _sample(self, snap: Snapshot, memory: Memory, now: float, rng, s: _Scratch) -> Memory:
        """Random draws on every free ready slot until enough runtimes are observed."""
        ready = [n for n in snap.nodes_with_free_slots() if n.ready(now)]
        if not self.private and not snap.nodes:
            cheapest = _most_efficient(snap.types.values())
            if cheapest is not None and cheapest.limit > 0:
                life = self._short_life_s(cheapest)
                if self._affordable(snap, s, cheapest, 1, life):
                    s.actions.append(
                        Launch(cheapest.name, 1, "sampling_without_private_nodes", life - self.config.margin_s)
                    )
                    s.launched_usd += cheapest.billing.cost_usd(life, cheapest.price_per_hour)
        # Samples are real work and the estimate needs them.
        self._keep_running_work(snap, now, None, s, "sampling_in_progress")
        in_flight = snap.count_running()
        wanted = self._samples_needed(snap) - snap.observations.count - in_flight
        for node in sorted(ready, key=lambda n: -n.speed):
            for slot in node.free_slots():
                if wanted <= 0:
                    return memory
                tid = snap.pending.draw(rng, s.taken) if rng is not None else None
                if tid is None:
                    r = snap.pending.largest_fitting(math.inf, 0.0, s.taken)
                    tid = r[0] if r else None
                if tid is None:
                    return memory
                s.taken.add(tid)
                s.used_slots.add((node.id, slot))
                s.actions.append(Assign(tid, SlotRef(node.id, slot), 1, "sampling"))
                wanted -= 1
        return memory

    def _keep_running_work(self, snap: Snapshot, now: float, size_ref_s: float | None, s: _Scratch, cause: str) -> None:
        """Keep an instance whose running task would outlive its release to the billing
        boundary after the task's expected end (``size_ref_s`` for tasks without an
        estimate; None: the next boundary at least a tick away), while the budget allows.
        Work killed at a release is work paid for twice."""
        # A task with copies on several machines needs only the one kept longest (a private
        # node: forever); the others may go at their releases.
        keeper: dict[str, tuple[float, str]] = {}
        for n in snap.nodes:
            until = math.inf if n.is_private else (s.release_of(n) if s.release_of(n) is not None else math.inf)
            for r in n.running:
                if r.task_id not in keeper or (until, n.id) > keeper[r.task_id]:
                    keeper[r.task_id] = (until, n.id)
        for n in snap.nodes:
            if n.is_private or not n.running or n.launched_at_s is None:
                continue
            rel = s.release_of(n)
            if rel is None or rel - now > self.config.tick_s + self.config.margin_s:
                continue
            mine = [r for r in n.running if keeper[r.task_id][1] == n.id]
            if not mine:
                continue
            need = rel + self.config.tick_s + self.config.margin_s
            if size_ref_s is not None:
                ends = [r.started_at_s + (r.estimate_ref_s or size_ref_s) / n.speed for r in mine]
                # A task still running past its expected end is not about to end: nothing
                # says when it will, and its work so far is lost at the release. Keep it.
                if max(ends) <= rel and min(ends) > now:
                    continue
                need = max(need, max(ends) + self.config.margin_s)
            t = snap.types[n.type_name]
            # per-second billing has a boundary every second: go at least a tick further
            target = t.billing.paid_until(n.launched_at_s, need) - self.config.margin_s
            if target > rel and self._affordable_extension(snap, s, n, t, target, now):
                s.actions.append(ScheduleRelease(n.id, target, cause))
                s.release[n.id] = target

    # -- passes 3 and 4 ----------------------------------------------------------------------
    def _plan_and_fleet(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: _Scratch) -> Memory:
        policy = self.config.policy
        if policy != "broker":
            return self._baseline_fleet(snap, memory, now, rem, s)
        since = math.inf if memory.last_plan_at_s is None else now - memory.last_plan_at_s
        # A run stopped for its budget knows its fleet cannot finish the work: that is the
        # drift the early re-plan looks for, so it waits for the regular one (each re-plan
        # of a short budget bisects the share of the work the budget buys: ~8 searches).
        due = since >= self.config.replan_every_s - 1e-9 or (
            since >= self.config.min_replan_gap_s - 1e-9 and not memory.budget_stopped
            and self._drifted(snap, memory, now, rem)
        )
        if not due:
            return memory
        if memory.budget_stopped and self._budget_left(snap, s, now) < self._cheapest_unit(snap):
            return memory  # nothing more can be bought; dispatch goes on with what is paid
        memory = self._resolve_goal(snap, memory, now, rem)
        result = self._solve(snap, memory, now, rem)
        memory = replace(memory, last_plan_at_s=now)
        if result.plan is None:
            s.notes.append(result.reason or "no plan")
            if self.goal.kind == "budget" and not memory.budget_stopped:
                # BaTS semantics: what is left cannot be bought; finish what paid and private
                # capacity can, and say so once.
                s.actions.append(StopForBudget(len(snap.pending)))
                memory = replace(memory, budget_stopped=True)
            return replace(memory, plan_failures=memory.plan_failures + 1, last_note=result.reason)
        if result.cause == "budget_short" and not memory.budget_stopped:
            s.actions.append(StopForBudget(len(snap.pending)))
            memory = replace(memory, budget_stopped=True)
        first = memory.last_plan is None and memory.promised_makespan_s is not None
        memory = replace(
            memory,
            last_plan=result.plan,
            # The first plan reported is the promise (the chosen front point) when there is one.
            planned_makespan_s=memory.promised_makespan_s if first else (now - snap.started_at_s) + result.plan.makespan_s,
            planned_cost_usd=memory.promised_cost_usd if first else snap.committed_usd + result.plan.cost_usd,
            last_note=result.reason,
        )
        result = self._with_hysteresis(snap, memory, now, rem, result)
        return self._apply_plan(snap, memory, now, result, s)

    def _with_hysteresis(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                         result: PlanResult) -> PlanResult:
        """Act on a change of fleet only if it survives a change of the work.

        When the fleet as scheduled still finishes the work's upper value by the deadline, a
        re-plan may only shed (``_shed``: pull releases in while (1 + h') x the upper value
        still fits), never launch or lengthen. Otherwise the solver's plan is used, but a
        launch is kept only if a plan for W (1 - h) launches too (h = ``hysteresis``), and
        shortening an instance is kept only if a plan for W (1 + h') shortens it too
        (h' = ``_hysteresis_band``: the fixed h while the estimate is loose, its confidence
        band once it is firm). One noisy estimate therefore cannot make the fleet buy
        capacity it then gives back, or give back capacity it then buys again.
        """
        h = self._hysteresis_band(rem)
        plan = result.plan
        if h <= 0 or plan is None:
            return result
        by_id = {n.id: n for n in snap.nodes}
        plan = replace(plan, existing=tuple(_match_to_schedule(plan.existing, by_id)))
        result = replace(result, plan=plan)
        keep = self._status_quo(snap, memory, now, rem)
        if keep is not None:
            # The fleet as scheduled finishes in time, so all a new plan may do is shed: a
            # launch or a lengthening is only the solver's pick among equal-cost plans (a new
            # instance for a running one of equal type, instance A kept longer than B), and
            # acting on those churns the fleet. Shed directly instead.
            shed = self._shed(snap, memory, now, rem, h)
            if not shed:
                return replace(result, plan=replace(plan, new=(), existing=()), cause="status_quo")
            margin = self.config.margin_s
            existing = tuple(Extension(nid, 0, at + margin) for nid, at in sorted(shed.items()))
            return replace(result, plan=replace(plan, new=(), existing=existing), cause="surplus")
        new, existing = plan.new, plan.existing
        if new and snap.nodes:
            # Scale up only if a plan for less work would scale up too. Which types it
            # picks may differ (equally efficient types tie), so only whether is compared.
            low = self._solve(snap, memory, now, rem, scale=1.0 - self.config.hysteresis).plan
            if low is not None and not low.new:
                new = ()
        current = {n.id: n.release_at_s for n in snap.nodes if not n.is_private}
        shortening = [e for e in existing if current.get(e.instance_id) is not None
                      and e.release_at_s - self.config.margin_s < current[e.instance_id] - 1.0]
        if shortening:
            high = self._solve(snap, memory, now, rem, scale=1.0 + h).plan
            if high is not None:
                longer = {e.instance_id: e for e in _match_to_schedule(high.existing, by_id)}
                existing = tuple(
                    longer.get(e.instance_id, e) if e in shortening and longer.get(e.instance_id) is not None
                    and longer[e.instance_id].release_at_s > e.release_at_s else e
                    for e in existing
                )
        if new == plan.new and existing == plan.existing:
            return result
        return replace(result, plan=replace(plan, new=new, existing=existing))

    def _hysteresis_band(self, rem: RemainingWork) -> float:
        """h: how much the work may move before a fleet change is believed.

        The noise hysteresis guards against is the estimate's own: the remaining work is
        known to about (upper - point) / point. Early on (few observations, wide band) that
        is more than ``hysteresis`` and the fixed band rules; once thousands of tasks have
        ended it is a percent or less, and a fixed 20% band would keep a fleet bought for the
        first, wide upper value to the end: the run over-delivers (finishes early, costs more
        than the chosen point). So h = clamp(band, hysteresis_min, hysteresis).
        """
        h = self.config.hysteresis
        if h <= 0 or rem.point_ref_s <= 0:
            return h
        band = (rem.upper_ref_s - rem.point_ref_s) / rem.point_ref_s
        return min(h, max(self.config.hysteresis_min, band))

    def _shed(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, h: float) -> dict[str, float]:
        """Releases to pull in, while the fleet still finishes the work's upper value by the
        deadline (the status-quo capacity test): the instance due to leave first is pulled in
        quantum by quantum as far as it goes, then the next. Concentrating the cut on few
        instances keeps the rest busy to the deadline (cutting every instance by a quantum
        would finish the same paid hours sooner, side by side, and miss the chosen point's
        makespan). Never below what is already paid, nor below the expected end of the
        instance's running tasks."""
        from ..plan.capacity import planning_quantum_s

        need = replace(rem, upper_ref_s=rem.upper_ref_s * (1.0 + h))
        if self._status_quo(snap, memory, now, need) is None:
            return {}  # the fleet as scheduled does not even hold the work's upper value
        end = memory.deadline_at_s
        # The status-quo capacity test, kept incrementally: one instance's release changes
        # its own term only (a fleet of 200 would otherwise cost 200 terms per quantum).
        total = sum(self._capacity_term(n, now, end, need, n.release_at_s) for n in snap.nodes if not n.lost)
        margin = self.config.margin_s
        trial: dict[str, float] = {}
        live = sorted((n for n in snap.nodes if not n.is_private and not n.lost and n.release_at_s is not None
                       and n.launched_at_s is not None and n.release_at_s > now),
                      key=lambda n: (n.release_at_s, n.id))
        for n in live:
            t = snap.types[n.type_name]
            q = planning_quantum_s(t.billing, self.planner.options)
            floor = max(now, (n.paid_until_s if n.paid_until_s is not None else now) - margin)
            busy = max((r.started_at_s + (r.estimate_ref_s or rem.mean_ref_s) / n.speed for r in n.running),
                       default=-math.inf)
            at = n.release_at_s
            term = self._capacity_term(n, now, end, need, at)
            while True:
                target = t.billing.paid_until(n.launched_at_s, at + margin - q) - margin
                if target < floor - 1e-6 or target < busy or target >= at - 1.0:
                    break
                shorter = self._capacity_term(n, now, end, need, target)
                if total - term + shorter < need.upper_ref_s:
                    break
                trial[n.id] = target
                total += shorter - term
                term, at = shorter, target
        return trial

    def _capacity_term(self, n: NodeView, now: float, end: float, rem: RemainingWork, release_at_s: float | None) -> float:
        """Reference seconds node ``n`` works from now to ``end`` (released at ``release_at_s``
        if it is an instance), less the planner's allowance for a run's end."""
        start = max(now, n.ready_at_s or now)
        allowance = self.planner.options.allowance_s(n.speed, rem.mean_ref_s, rem.sd_ref_s)
        stop = end if n.is_private else min(end, release_at_s if release_at_s is not None else end)
        return n.slots * n.speed * max(0.0, stop - start - allowance)

    def _drifted(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> bool:
        """True when the fleet cannot finish the remaining work by the planned end."""
        if memory.planned_makespan_s is None:
            return True
        end = snap.started_at_s + memory.planned_makespan_s
        capacity = 0.0
        for n in snap.nodes:
            if n.lost:
                continue
            start = max(now, n.ready_at_s or now)
            stop = end if n.is_private else min(end, (n.release_at_s or end))
            capacity += n.slots * n.speed * max(0.0, stop - start)
        return capacity < rem.upper_ref_s * (1 - self.config.replan_drift) or capacity > rem.upper_ref_s * 3 + 1

    def _cost_first(self) -> bool:
        """No goal, or theta 1: the user asked for the cheapest run (its promise is the
        cheapest front point)."""
        g = self.goal
        return g.kind == "none" or (g.kind == "theta" and g.value is not None and float(g.value) >= 1.0)

    def _resolve_goal(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> Memory:
        g = self.goal
        if memory.deadline_at_s is not None or g.kind in ("budget",):
            return memory
        if g.kind == "deadline":
            return replace(memory, deadline_at_s=snap.started_at_s + float(g.value))
        if g.kind in ("point", "theta", "none"):
            # The point is chosen on the front the user saw: the work's point estimate. A
            # front on the upper value has other candidate makespans (its grid moves with
            # W), so "point 2" there is another promise. The plans that follow still cover
            # the upper value, by this deadline.
            pin = self._planner_input(snap, now, replace(rem, upper_ref_s=rem.point_ref_s))
            chosen = self.planner.front_choice(pin, g)
            if chosen is not None:
                return replace(memory, deadline_at_s=now + chosen.makespan_s,
                               promised_makespan_s=(now - snap.started_at_s) + chosen.makespan_s,
                               promised_cost_usd=snap.committed_usd + chosen.cost_usd)
        return memory

    def _planner_input(self, snap: Snapshot, now: float, rem: RemainingWork):
        # A private node that is lost (or quarantined as bad) is no capacity: planning with it
        # would leave its work to nobody.
        lost = {n.id for n in snap.nodes if n.is_private and n.lost}
        return self.planner.input(
            types=tuple(snap.types.values()),
            private=tuple(p for p in self.private if p.name not in lost) if lost else self.private,
            nodes=snap.nodes,
            rem=rem,
            now_s=now,
            unit_started=self.goal.kind != "budget",
        )

    def _solve(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, scale: float = 1.0,
               launches: bool = True) -> PlanResult:
        if scale != 1.0:
            rem = replace(rem, upper_ref_s=rem.upper_ref_s * scale, point_ref_s=rem.point_ref_s * scale)
        if self._cost_first():
            # The cheapest point has no slack: covering the work's upper confidence value by
            # its finish means buying hours of EC2 for work that is probably not there (300-
            # task bags without estimates spent 87% over the promise on average, and
            # finished early, which nobody asked for). A cost-first run plans for the work's
            # point value; a launch still has to survive the hysteresis band.
            rem = replace(rem, upper_ref_s=min(rem.upper_ref_s, rem.point_ref_s))
        pin = self._planner_input(snap, now, rem)
        if not launches:  # the current fleet (and private nodes) only
            pin = replace(pin, types=tuple(replace(t, limit=0) for t in pin.types))
        if self.goal.kind == "budget":
            # The planner sees existing instances paid up to their current boundary and
            # decides their extensions itself, so it gets the budget minus what is charged,
            # not minus the units already scheduled (that would count them twice).
            budget_left = float(self.goal.value) - snap.committed_usd
            hint = None
            if memory.last_plan is not None and memory.last_plan_at_s is not None and self.config.warm_start:
                # where the last plan ended, from now: the search starts there
                hint = (memory.last_plan.makespan_s - (now - memory.last_plan_at_s)) * scale
            return self.planner.fastest_within(pin, budget_left, rem.point_ref_s, hint_s=hint)
        deadline_s = (memory.deadline_at_s or math.inf) - now
        return self.planner.cheapest_by(pin, deadline_s)

    def _status_quo(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork) -> float | None:
        """Money the fleet as scheduled will still cost, if it
        finishes the work's upper value by the deadline; None when it would not (or there is
        no deadline to test)."""
        if self.goal.kind == "budget" or memory.deadline_at_s is None:
            return None
        end = memory.deadline_at_s
        if end <= now:
            return None
        capacity = 0.0
        future_usd = 0.0
        for n in snap.nodes:
            if n.lost:
                continue
            if n.is_private:
                capacity += self._capacity_term(n, now, end, rem, None)
                continue
            rel = n.release_at_s
            if rel is None or n.launched_at_s is None:
                return None
            capacity += self._capacity_term(n, now, end, rem, rel)
            t = snap.types[n.type_name]
            future_usd += t.billing.cost_usd(max(rel, now) - n.launched_at_s, t.price_per_hour) - t.billing.cost_usd(
                now - n.launched_at_s, t.price_per_hour)
        if capacity < rem.upper_ref_s:
            return None
        return future_usd + sum(p.cost_per_hour for p in self.private) * (end - now) / 3600.0

    def _apply_plan(self, snap: Snapshot, memory: Memory, now: float, result: PlanResult, s: _Scratch) -> Memory:
        plan = result.plan
        margin = self.config.margin_s
        planned_ids = {e.instance_id for e in plan.existing}
        # a surplus streak ends when a plan no longer proposes it
        shorten = {k: v for k, v in memory.shorten_streak.items() if k in planned_ids}
        rem_mean = mean_estimate(snap) or 0.0
        by_id = {n.id: n for n in snap.nodes}
        for ext in plan.existing:
            node = by_id.get(ext.instance_id)
            if node is None or node.is_private:
                continue
            target = max(now, ext.release_at_s - margin)
            current = s.release_of(node)
            if current is not None and abs(target - current) < 1.0:
                shorten.pop(node.id, None)
                continue
            if current is None or target > current:
                t = snap.types[node.type_name]
                if self._affordable_extension(snap, s, node, t, target, now):
                    s.actions.append(ScheduleRelease(node.id, target, "plan_needs_longer" if current else "plan"))
                    s.release[node.id] = target
                else:
                    s.notes.append(f"budget cap: {node.id} not extended")
                shorten.pop(node.id, None)
            else:
                busy_until = max((r.started_at_s + (r.estimate_ref_s or rem_mean) / node.speed for r in node.running),
                                 default=-math.inf)
                if busy_until > target:
                    shorten.pop(node.id, None)  # its running tasks would be killed: keep it
                    continue
                first = shorten.get(node.id, now)  # when this surplus was first proposed
                if now - first >= self.config.scale_down_after_s - 1e-9:
                    s.actions.append(ScheduleRelease(node.id, target, "surplus_at_billing_boundary"))
                    s.release[node.id] = target
                    shorten.pop(node.id, None)
                else:
                    shorten[node.id] = first
        # A new slot can only take a pending task, and a free slot already paid for takes
        # one first: never launch more slots than there are pending tasks left for them
        # (the planner sees the work as divisible; at the end of a run it would buy 50
        # machines for 23 tasks).
        open_slots = sum(n.slots - len(n.running) for n in snap.nodes
                         if not n.lost and (n.is_private or s.release_of(n) is None or s.release_of(n) > now))
        wanted_slots = max(0, len(snap.pending) - open_slots)
        trimmed_usd = 0.0  # what the plan priced but is not launched
        for group in plan.new:
            if not len(snap.pending):
                t = snap.types[group.type_name]
                trimmed_usd += group.count * t.billing.cost_usd(group.release_after_s, t.price_per_hour)
                continue
            # With nothing pending, the work left is inside running tasks, which a new
            # machine cannot take over (tail replication uses paid idle slots instead).
            t = snap.types[group.type_name]
            wanted = max(0, min(group.count, -(-wanted_slots // max(t.slots, 1))))
            if wanted < group.count:
                s.notes.append(f"launching {wanted} of {group.count} {t.name}: {len(snap.pending)} tasks pending")
            wanted_slots -= wanted * t.slots
            count = wanted
            while count > 0 and not self._affordable(snap, s, t, count, group.release_after_s):
                count -= 1
            if count < wanted:
                s.notes.append(f"budget cap: launching {count} of {group.count} {t.name}")
            if count > 0:
                s.actions.append(Launch(t.name, count, result.cause or "plan", group.release_after_s - margin))
                s.launched_usd += count * t.billing.cost_usd(group.release_after_s, t.price_per_hour)
            trimmed_usd += (group.count - count) * t.billing.cost_usd(group.release_after_s, t.price_per_hour)
        self._budget_guard(snap, memory, now, s)
        memory = replace(memory, shorten_streak=shorten)
        if trimmed_usd > 0 and memory.planned_cost_usd is not None and memory.promised_cost_usd is None:
            # The plan's cost is what it buys: instances trimmed above are not bought, so the plan
            # line, the launch question, status, the report and the metrics would otherwise show
            # a cost the run never meant to spend ($9.68 planned, 13 instances for ~$1.47 asked).
            memory = replace(memory, planned_cost_usd=max(snap.committed_usd, memory.planned_cost_usd - trimmed_usd))
        return memory

    def _short_life_s(self, t: MachineType) -> float:
        """Paid life of an instance bought without a plan (sampling, FirstFit): its first
        billed time, but never so short that the release margin eats it (per-second billing
        has a 60 s minimum; keep such an instance a few margins)."""
        return t.billing.billed_s(max(t.boot_s + 4 * self.config.margin_s, 1.0))

    # -- budget ------------------------------------------------------------------------------
    def _planned_spend(self, snap: Snapshot, release: dict[str, float], now: float) -> float:
        """Committed spend plus what every live instance will cost up to its scheduled release."""
        total = snap.committed_usd
        for n in snap.nodes:
            if n.is_private or n.launched_at_s is None:
                continue
            t = snap.types[n.type_name]
            rel = release.get(n.id, n.release_at_s)
            if rel is None:
                continue
            so_far = t.billing.cost_usd(max(now, n.launched_at_s) - n.launched_at_s, t.price_per_hour)
            planned = t.billing.cost_usd(max(rel, now) - n.launched_at_s, t.price_per_hour)
            total += max(0.0, planned - so_far)
        return total

    def _budget_left(self, snap: Snapshot, s: _Scratch, now: float) -> float:
        budget = self._budget(snap)
        if budget is None:
            return math.inf
        return budget - self._planned_spend(snap, s.release, now) - s.launched_usd

    @staticmethod
    def _cheapest_unit(snap: Snapshot) -> float:
        costs = [t.billing.cost_usd(0, t.price_per_hour) for t in snap.types.values() if t.limit > 0]
        return min(costs) if costs else math.inf

    def _budget(self, snap: Snapshot) -> float | None:
        if self.goal.kind == "budget":
            return float(self.goal.value)
        return snap.budget_usd

    def _affordable(self, snap: Snapshot, s: _Scratch, t: MachineType, count: int, life_s: float) -> bool:
        budget = self._budget(snap)
        if budget is None:
            return True
        cost = count * t.billing.cost_usd(life_s, t.price_per_hour)
        return self._planned_spend(snap, s.release, snap.now_s) + s.launched_usd + cost <= budget + 1e-9

    def _affordable_extension(self, snap, s: _Scratch, node: NodeView, t: MachineType, target: float, now: float) -> bool:
        budget = self._budget(snap)
        if budget is None:
            return True
        trial = dict(s.release)
        trial[node.id] = target
        return self._planned_spend(snap, trial, now) + s.launched_usd <= budget + 1e-9

    def _budget_guard(self, snap: Snapshot, memory: Memory, now: float, s: _Scratch) -> None:
        """Pull releases in (latest first) until the planned spend fits the budget."""
        budget = self._budget(snap)
        if budget is None:
            return
        over = self._planned_spend(snap, s.release, now) + s.launched_usd - budget
        if over <= 1e-9:
            return
        live = sorted(
            (n for n in snap.nodes if not n.is_private and s.release_of(n) is not None),
            key=lambda n: -(s.release_of(n)),
        )
        for n in live:
            if over <= 1e-9:
                break
            t = snap.types[n.type_name]
            earliest = max(now, t.billing.paid_until(n.launched_at_s, now) - self.config.margin_s)
            if earliest < s.release_of(n) - 1e-9:
                before = self._planned_spend(snap, s.release, now)
                s.release[n.id] = earliest
                s.actions.append(ScheduleRelease(n.id, earliest, "budget_cap"))
                over -= before - self._planned_spend(snap, s.release, now)

    # -- baselines (same code path, other fleet rules) ---------------------------------------
    def _baseline_fleet(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: _Scratch) -> Memory:
        policy = self.config.policy
        live = [n for n in snap.nodes if not n.is_private]
        if memory.last_plan_at_s is None:
            memory = replace(memory, last_plan_at_s=now)
            if policy == "list":
                machines = (dict(self.config.list_fleet) if self.config.list_fleet is not None
                            else _list_eta_machines(snap.types.values(), self.private, self.config.eta))
                for name, count in machines.items():
                    if count > 0:
                        s.actions.append(Launch(name, min(count, snap.types[name].limit), "list_eta", math.inf))
            elif policy == "rr":
                for t in snap.types.values():
                    if t.limit > 0:
                        s.actions.append(Launch(t.name, t.limit, "round_robin_all_machines", math.inf))
            elif policy == "1vm4all":
                t = _most_efficient(snap.types.values())
                if t is not None:
                    s.actions.append(Launch(t.name, 1, "one_vm_for_all", math.inf))
            elif policy == "bats":
                memory = self._bats_fleet(snap, memory, now, rem, s)
        elif policy == "bats":
            memory = self._bats_fleet(snap, memory, now, rem, s)
        if policy == "firstfit":
            self._firstfit_fleet(snap, now, rem, s)
        # Baselines keep machines while work is pending and let idle ones go at the end of
        # their paid time once nothing is pending (they hold no plan to release earlier).
        if len(snap.pending) == 0:
            for n in live:
                if not n.running and (s.release_of(n) is None or s.release_of(n) > now):
                    s.actions.append(ScheduleRelease(n.id, now, "idle_nothing_pending"))
                    s.release[n.id] = now
        return memory

    def _firstfit_fleet(self, snap: Snapshot, now: float, rem: RemainingWork, s: _Scratch) -> None:
        """FirstFit (004): a task goes where it fits without a new billing unit; if it fits
        nowhere, rent one more instance of the most cost-efficient type."""
        t = _most_efficient(snap.types.values())
        if t is None or len(snap.pending) == 0:
            return
        idle = sum(len(n.free_slots()) for n in snap.nodes if not n.lost)
        booting = sum(1 for n in snap.nodes if not n.is_private and not n.ready(now))
        live_of_type = sum(1 for n in snap.nodes if n.type_name == t.name and not n.lost)
        if idle == 0 and booting == 0 and live_of_type < t.limit:
            life = self._short_life_s(t)
            if self._affordable(snap, s, t, 1, life):
                s.actions.append(Launch(t.name, 1, "firstfit_no_fit", life - self.config.margin_s))

    def _bats_fleet(self, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: _Scratch) -> Memory:
        budget = self._budget(snap)
        cfg = self.planner.bats(tuple(snap.types.values()), rem, budget, self._planned_spend(snap, s.release, now))
        if cfg is None:
            return memory
        have: dict[str, int] = {}
        for n in snap.nodes:
            if not n.is_private and not n.lost and (s.release_of(n) is None or s.release_of(n) > now):
                have[n.type_name] = have.get(n.type_name, 0) + 1
        for name, count in cfg.items():
            extra = count - have.get(name, 0)
            t = snap.types[name]
            life = t.billing.unit_s
            while extra > 0 and not self._affordable(snap, s, t, extra, life):
                extra -= 1
            if extra > 0:
                s.actions.append(Launch(name, extra, "bats_configuration", life - self.config.margin_s))
                s.launched_usd += extra * t.billing.cost_usd(life, t.price_per_hour)
        # BaTS renews an instance for another ATU only while the budget allows.
        for n in snap.nodes:
            if n.is_private or n.lost or s.release_of(n) is None:
                continue
            t = snap.types[n.type_name]
            rel = s.release_of(n)
            if len(snap.pending) > 0 and rel - now < self.config.tick_s * 1.5 + self.config.margin_s:
                nxt = t.billing.paid_until(n.launched_at_s, rel + self.config.margin_s + 1) - self.config.margin_s
                if self._affordable_extension(snap, s, n, t, nxt, now):
                    s.actions.append(ScheduleRelease(n.id, nxt, "bats_renew_atu"))
                    s.release[n.id] = nxt
        return memory

    # -- pass 5 ------------------------------------------------------------------------------
    def _dispatch(self, snap: Snapshot, memory: Memory, now: float, mean_and_fit: tuple[float, float], rng,
                  s: _Scratch) -> None:
        mean, fit_size = mean_and_fit
        fit_rule = self.config.policy in ("broker", "firstfit", "bats")
        ready = sorted((n for n in snap.nodes_with_free_slots() if n.ready(now)), key=lambda n: (-n.speed, n.id))
        idle_slots: list[tuple[NodeView, int, float]] = []
        for node in ready:
            if len(node.running) >= node.slots:
                continue
            release = s.release_of(node) if not node.is_private else None
            for slot in node.free_slots():
                if (node.id, slot) in s.used_slots or (release is not None and release <= now):
                    continue
                limit_ref = math.inf
                if fit_rule and release is not None:
                    limit_ref = (release - now) * node.speed / self.config.fit_safety
                pick = snap.pending.largest_fitting(limit_ref, fit_size if fit_rule else mean, s.taken)
                if pick is None and not fit_rule:
                    pick = snap.pending.smallest(mean, s.taken)
                if pick is None:
                    idle_slots.append((node, slot, limit_ref))
                    continue
                s.taken.add(pick[0])
                s.actions.append(Assign(pick[0], SlotRef(node.id, slot), 1, "dispatch"))
        if (idle_slots and fit_rule and self._budget(snap) is None and snap.count_running() == 0
                and not s.taken and len(snap.pending)):
            # Nothing runs and nothing fits: rather than wait for a plan that thinks the
            # fleet suffices, start the smallest task where most paid time is left (the
            # tick then keeps that instance to the task's end). Not under a budget: there,
            # a task that cannot finish in paid time waits (BaTS semantics).
            node, slot, _ = max(idle_slots, key=lambda x: (x[2], x[0].id))
            pick = snap.pending.smallest(mean, s.taken)
            if pick is not None:
                s.taken.add(pick[0])
                s.actions.append(Assign(pick[0], SlotRef(node.id, slot), 1, "nothing_fits_anywhere"))
                idle_slots = [x for x in idle_slots if (x[0].id, x[1]) != (node.id, slot)]
        if self.config.replicate and self.config.policy == "broker" and len(snap.pending) - len(s.taken) <= 0 and idle_slots:
            self._replicate(snap, now, mean, idle_slots, s)

    def _replicate(self, snap: Snapshot, now: float, mean: float, idle_slots, s: _Scratch) -> None:
        """Tail replication: copy the running task expected to end last onto an idle paid slot
        when the copy would end sooner there (first result wins).

        A task's expected end is its start plus its size (estimate, else the mean) at its
        node's speed. A task already past that is *overdue*, and nothing says how long it
        still needs; it is taken to need as long again as it has run (its total twice its
        age: heavy-tailed runtimes, 2^x minutes, keep going the longer they have gone), so
        an overdue task is copied to a node more than twice as fast. The copy only uses paid
        time nobody else wants; it never keeps a machine longer (``_keep_running_work``
        protects one copy of a task, on the machine kept longest)."""
        copies: dict[str, int] = {}
        running = []
        for n in snap.nodes:
            for r in n.running:
                copies[r.task_id] = copies.get(r.task_id, 0) + 1
                est = r.estimate_ref_s if r.estimate_ref_s is not None else mean
                end = r.started_at_s + est / n.speed
                size = est
                if end <= now:  # overdue
                    age_ref = (now - r.started_at_s) * n.speed
                    size = max(est, 2.0 * age_ref)
                    end = r.started_at_s + size / n.speed
                running.append((end, size, r, n))
        running.sort(key=lambda x: (-x[0], x[2].task_id))
        for node, slot, limit_ref in idle_slots:
            for end, size, r, n in running:
                if copies.get(r.task_id, 0) >= 2 or n.id == node.id:
                    continue
                if size > limit_ref or now + size / node.speed >= end:
                    continue
                copies[r.task_id] = copies.get(r.task_id, 0) + 1
                s.actions.append(Replicate(r.task_id, SlotRef(node.id, slot), r.attempt + 1, "tail_replication"))
                break


def _match_to_schedule(existing, by_id) -> list:
    """The plan's releases, dealt to interchangeable instances so that fewest change.

    Instances of one type launched at the same moment are interchangeable to the planner, and
    it breaks ties between them arbitrarily: one re-plan shortens instance A and keeps B, the
    next the reverse, and the fleet's schedule flaps without any change of capacity (each
    flip lengthens at once, while a shortening must persist, so nothing is ever shortened).
    Within each such group the planned release times are a multiset; the instance scheduled
    latest gets the latest of them.
    """
    groups: dict[tuple, list] = {}
    for ext in existing:
        node = by_id.get(ext.instance_id)
        if node is None or node.is_private:
            groups.setdefault(("", ext.instance_id), []).append(ext)
            continue
        groups.setdefault((node.type_name, node.launched_at_s), []).append(ext)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out += group
            continue
        plans = sorted(group, key=lambda e: (e.release_at_s, e.extra_quanta))
        nodes = sorted((by_id[e.instance_id] for e in group),
                       key=lambda n: (n.release_at_s if n.release_at_s is not None else math.inf, n.id))
        out += [Extension(n.id, e.extra_quanta, e.release_at_s) for n, e in zip(nodes, plans)]
    return out


def _sd_estimate(snap: Snapshot, mean: float) -> float:
    obs = snap.observations
    if obs.count >= 10:
        return obs.sd_ref_s
    if snap.prior_sd_ref_s is not None:
        return snap.prior_sd_ref_s
    return obs.sd_ref_s if obs.count >= 2 else 0.5 * mean


def _most_efficient(types) -> MachineType | None:
    best = None
    for t in types:
        if t.limit <= 0:
            continue
        if best is None or (t.efficiency, t.capacity_per_s, t.name) > (best.efficiency, best.capacity_per_s, best.name):
            best = t
    return best


def _list_eta_machines(types, private, eta: int | None, faster_first: bool = False) -> dict[str, int]:
    """The eta most cost-efficient machines (private nodes count as machines too); equally
    efficient ones by name, or faster first (the reproduction report shows both readings)."""
    machines: list[tuple[float, float, str, str | None]] = []
    for p in private:
        eff = math.inf if p.cost_per_hour <= 0 else p.capacity_per_s * 3600 / p.cost_per_hour
        machines.append((eff, p.capacity_per_s, p.name, None))
    for t in types:
        for _ in range(t.limit):
            machines.append((t.efficiency, t.capacity_per_s, t.name, t.name))
    machines.sort(key=lambda m: (-m[0], -m[1] if faster_first else 0.0, m[2]))
    eta = len(machines) if eta is None else eta
    counts: dict[str, int] = {}
    for *_, type_name in machines[:eta]:
        if type_name is not None:
            counts[type_name] = counts.get(type_name, 0) + 1
    return counts
