"""``Controller.decide(snapshot, memory, now) -> Decision``: the control loop of ALGORITHMS.md 5.

A fixed pipeline of named passes, each pure and each in its own module:

1. ``_finish_or_stop``  bag done or the user stops: release everything now.
2. sampling          no runtime estimate yet: draw tasks uniformly at random onto free
                     slots (a minimal instance is launched only if there is nowhere to sample).
3. replan            every re-plan interval (or when the fleet is off its plan): remaining
                     work at its upper confidence value, re-solved against the goal with
                     the current fleet as existing instances (``baselines``: the policy's
                     fleet rule instead).
4. fleet             diff plan and fleet: launch what is missing; schedule each instance's
                     release at its planned paid-until minus a margin; lengthen at once,
                     shorten only once a surplus persists ``scale_down_after_s``; a fleet
                     that still meets the goal is only ever shed (the first-leaving instance
                     pulled in furthest), never relaunched; launches must survive a -h
                     change of the work (hysteresis);
                     the budget cap (``budget``) is applied to every unit before it is bought.
5. dispatch          free slots pull work: largest task that ends before the slot's
                     release (never one that would be killed or buy an unplanned unit);
                     tail replication on paid idle slots when nothing is pending.

Budget invariant: every instance always has a scheduled release, and the planned spend
(each live instance charged up to its scheduled release, plus what terminated ones cost)
never exceeds the budget; a launch or a lengthening that would break it is cut or refused.

The passes are functions of the deciding controller (its goal, configuration, planner and
private nodes), the snapshot, the memory and the decision's scratch state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..goal import Goal
from .actions import Action, ScheduleRelease
from .baselines import BASELINES, baseline_fleet
from .budget import stop_private_work
from .baselines import list_eta_machines as _list_eta_machines  # noqa: F401 (bench/reproduce.py)
from .baselines import most_efficient as _most_efficient  # noqa: F401
from .causes import Policy, ReleaseCause
from .dispatch import dispatch, keep_running_work
from .estimate_bias import check_estimate_bias
from .estimates import RemainingWork, mean_estimate, remaining_work
from .fleet import plan_and_fleet
from .peers import PeerOptions
from .planning import FleetPlanner
from .sampling import sample, samples_needed, sd_estimate
from .scratch import Scratch
from .snapshot import Memory, Snapshot

POLICIES = (Policy.BROKER, *BASELINES)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    policy: Policy = Policy.BROKER
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
    # band (upper - point) / point, but never less than this (see fleet.hysteresis_band)
    hysteresis_min: float = 0.01
    confidence_z: float = 1.645
    replicate: bool = True
    min_samples: int = 30  # sampling phase length when nothing is known about runtimes
    max_sample_fraction: float = 0.2  # ... but at most this share of the bag
    fit_safety: float = 1.0  # a task with an estimate fits when estimate x this <= time to release x speed
    warm_start: bool = True  # budget re-plans start their search where the last plan ended
    fit_z: float = 1.28  # a task without one fits when mean + fit_z sd does (about its 90% quantile)
    # The broker's rule the league (bench/league.py) measures; replan.solve_hedging_later says
    # what it buys: at a deadline, buy for the work's point value with the lean allowance while
    # the upper value can still be covered by capacity bought at the next re-plan.
    hedge_later: bool = True
    peer: PeerOptions = PeerOptions()  # the peers' published defaults (peers.py)
    list_order: str = "longest"  # List_eta takes tasks longest first, or at "random" (thesis 6.5.2)
    # The promise (promises.py): its confidence 1 - delta (a deadline is held at it), how
    # often the forecast is refreshed between launches, and its number of replicates.
    confidence: float = 0.9
    promise_every_s: float = 3600.0
    promise_replicates: int = 200
    promise: bool = True
    # How far the bag's estimates may be off as a whole, at the confidence, as the user
    # declares it (``--estimate-bias``; None: undeclared): the promise's prior on the
    # correction ratio until tasks with estimates have run (estimate_bias.py).
    estimate_bias: float | None = None
    # Spot offers (spotrates.py): re-plan with each type's interruption rate learned from what
    # the run saw (the declared rate is the prior); False: trust the declared rate.
    learn_spot_rates: bool = True
    # Queue-ahead (queue_ahead.py): a node holds queued work beyond its slots while the mean
    # task runs under this many seconds there and plenty is pending; 0 (the simulator): never.
    queue_ahead_below_s: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        object.__setattr__(self, "policy", Policy(self.policy))  # a plain string comes in too
        if self.list_order not in ("longest", "random"):
            raise ValueError(f"list_order must be longest or random, got {self.list_order!r}")
        check_estimate_bias(self.estimate_bias)
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {self.confidence!r}")
        if self.list_fleet is not None and any(count < 0 for _, count in self.list_fleet):
            raise ValueError(f"list_fleet counts must be >= 0, got {self.list_fleet!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    memory: Memory
    remaining: RemainingWork | None = None
    notes: tuple[str, ...] = ()


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
        s = Scratch()
        if self._finish_or_stop(snap, now, s):
            return Decision(tuple(s.actions), memory, None, tuple(s.notes))
        if not memory.private_stopped and stop_private_work(self, snap, now, s):
            memory = replace(memory, private_stopped=True)
        mean = mean_estimate(snap)
        if mean is not None:
            mean = (mean, mean + self.config.fit_z * sd_estimate(snap, mean))
        if mean is None or snap.observations.count < samples_needed(self, snap):
            # Sampling phase: no plan is made on a handful of runtimes.
            memory = sample(self, snap, memory, now, rng, s)
            return Decision(tuple(s.actions), memory, None, tuple(s.notes))
        # Remaining work is only needed to re-plan; dispatch needs the mean alone (a peer's
        # rule runs on every decision: its own clock is finer than the monitoring tick).
        every = self.config.policy != Policy.BROKER and getattr(BASELINES[self.config.policy], "every_decision", False)
        rem = remaining_work(snap, self.config.confidence_z) if tick or every else None
        s.remaining = rem
        if rem is not None:
            if self.config.policy == Policy.BROKER:
                memory = plan_and_fleet(self, snap, memory, now, rem, s)
                keep_running_work(self, snap, now, mean[1], s, ReleaseCause.RUNNING_TASK_NEEDS_LONGER)
            else:
                memory = baseline_fleet(self, snap, memory, now, rem, s)
        dispatch(self, snap, memory, now, mean, rng, s)
        return Decision(tuple(s.actions), memory, rem, tuple(s.notes))

    # -- pass 1 ------------------------------------------------------------------------------
    def _finish_or_stop(self, snap: Snapshot, now: float, s: Scratch) -> bool:
        nothing_left = len(snap.pending) == 0 and snap.count_running() == 0
        if not (nothing_left or snap.stopping):
            return False
        cause = ReleaseCause.USER_STOP if snap.stopping else ReleaseCause.BAG_DONE
        for n in snap.nodes:
            if n.is_private:
                continue
            if n.release_at_s is None or n.release_at_s > now:
                if snap.stopping or not n.running:
                    s.actions.append(ScheduleRelease(n.id, now, cause))
        return True
