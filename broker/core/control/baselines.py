"""The baselines' fleet rules: the policies the broker is compared with, on the same code path.

A baseline sees the same snapshot as the broker (the same estimates, the same pending tasks)
and differs only in how it sizes the fleet. Each is one :class:`BaselinePolicy` class in
``BASELINES``: ``fleet`` is called on every re-plan tick (``first`` on the first one) and
returns the memory; ``fit_rule`` says whether dispatch places only tasks that end before their
slot's release. After the rule, every baseline lets its idle instances go once nothing is
pending (they hold no plan to release them earlier).

To add a baseline: subclass :class:`BaselinePolicy`, set ``name`` and ``fit_rule``, write
``fleet``, and list an instance in ``BASELINES``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from ..model import MachineType
from .actions import Launch, ScheduleRelease
from .budget import affordable, affordable_extension, budget_of, private_rate_usd_per_s, short_life_s, total_spend
from .causes import LaunchCause, Policy, ReleaseCause
from .estimates import RemainingWork
from .peer_policies import PEER_POLICIES
from .scratch import Scratch
from .snapshot import Memory, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


class BaselinePolicy:
    """One baseline's fleet rule (stateless: what it remembers lives in ``Memory``)."""

    name: ClassVar[Policy]
    fit_rule: ClassVar[bool] = False  # dispatch places only tasks that end before the release

    def fleet(self, ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: Scratch,
              first: bool) -> Memory:
        """Launch or keep instances for this tick; ``first``: the run's first re-plan tick."""
        return memory


class ListEta(BaselinePolicy):
    """List_eta: the eta most cost-efficient machines (or ``list_fleet``), kept for the whole run."""

    name = Policy.LIST

    def fleet(self, ctl, snap, memory, now, rem, s, first):
        if first:
            machines = (dict(ctl.config.list_fleet) if ctl.config.list_fleet is not None
                        else list_eta_machines(snap.types.values(), ctl.private, ctl.config.eta))
            for name, count in machines.items():
                if count > 0:
                    s.actions.append(Launch(name, min(count, snap.types[name].limit), LaunchCause.LIST_ETA, math.inf))
        return memory


class RoundRobin(BaselinePolicy):
    """Every machine there is, tasks dealt round robin."""

    name = Policy.RR

    def fleet(self, ctl, snap, memory, now, rem, s, first):
        if first:
            for t in snap.types.values():
                if t.limit > 0:
                    s.actions.append(Launch(t.name, t.limit, LaunchCause.ROUND_ROBIN_ALL_MACHINES, math.inf))
        return memory


class OneVmForAll(BaselinePolicy):
    """One instance of the most cost-efficient type runs everything."""

    name = Policy.ONE_VM_FOR_ALL

    def fleet(self, ctl, snap, memory, now, rem, s, first):
        if first:
            t = most_efficient(snap.types.values())
            if t is not None:
                s.actions.append(Launch(t.name, 1, LaunchCause.ONE_VM_FOR_ALL, math.inf))
        return memory


class FirstFit(BaselinePolicy):
    """FirstFit (004): a task goes where it fits without a new billing unit; if it fits
    nowhere, rent one more instance of the most cost-efficient type."""

    name = Policy.FIRSTFIT
    fit_rule = True

    def fleet(self, ctl, snap, memory, now, rem, s, first):
        t = most_efficient(snap.types.values())
        if t is None or len(snap.pending) == 0:
            return memory
        idle = sum(len(n.free_slots()) for n in snap.nodes if not n.lost)
        booting = sum(1 for n in snap.nodes if not n.is_private and not n.ready(now))
        live_of_type = sum(1 for n in snap.nodes if n.type_name == t.name and not n.lost)
        if idle == 0 and booting == 0 and live_of_type < t.limit:
            life = short_life_s(ctl, t)
            if affordable(ctl, snap, s, t, 1, life):
                s.actions.append(Launch(t.name, 1, LaunchCause.FIRSTFIT_NO_FIT, life - ctl.config.margin_s))
        return memory


class Bats(BaselinePolicy):
    """BaTS: the budget-constrained configuration for the remaining work, bought one ATU at a
    time and renewed for another only while the budget allows."""

    name = Policy.BATS
    fit_rule = True

    def fleet(self, ctl, snap, memory, now, rem, s, first):
        budget = budget_of(ctl, snap)
        cfg = ctl.planner.bats(tuple(snap.types.values()), rem, budget, total_spend(ctl, snap, s.release, now),
                               private_rate_usd_per_s(ctl))
        if cfg is None:
            return memory
        self._launch_configuration(ctl, snap, now, s, cfg)
        self._renew(ctl, snap, now, s)
        return memory

    @staticmethod
    def _launch_configuration(ctl, snap: Snapshot, now: float, s: Scratch, cfg: dict[str, int]) -> None:
        have: dict[str, int] = {}
        for n in snap.nodes:
            if not n.is_private and not n.lost and (s.release_of(n) is None or s.release_of(n) > now):
                have[n.type_name] = have.get(n.type_name, 0) + 1
        for name, count in cfg.items():
            extra = count - have.get(name, 0)
            t = snap.types[name]
            life = t.billing.unit_s
            while extra > 0 and not affordable(ctl, snap, s, t, extra, life):
                extra -= 1
            if extra > 0:
                s.actions.append(Launch(name, extra, LaunchCause.BATS_CONFIGURATION, life - ctl.config.margin_s))
                s.launched_usd += extra * t.billing.cost_usd(life, t.price_per_hour)

    @staticmethod
    def _renew(ctl, snap: Snapshot, now: float, s: Scratch) -> None:
        """BaTS renews an instance for another ATU only while the budget allows."""
        for n in snap.nodes:
            if n.is_private or n.lost or s.release_of(n) is None:
                continue
            t = snap.types[n.type_name]
            rel = s.release_of(n)
            if len(snap.pending) > 0 and rel - now < ctl.config.tick_s * 1.5 + ctl.config.margin_s:
                nxt = t.billing.paid_until(n.launched_at_s, rel + ctl.config.margin_s + 1) - ctl.config.margin_s
                if affordable_extension(ctl, snap, s, n, t, nxt, now):
                    s.actions.append(ScheduleRelease(n.id, nxt, ReleaseCause.BATS_RENEW_ATU))
                    s.release[n.id] = nxt


BASELINES: dict[Policy, BaselinePolicy] = {
    p.name: p for p in (ListEta(), RoundRobin(), FirstFit(), OneVmForAll(), Bats(), *PEER_POLICIES)}


def baseline_fleet(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork,
                   s: Scratch) -> Memory:
    """The re-plan pass of a baseline policy: its fleet rule, then idle instances let go."""
    live = [n for n in snap.nodes if not n.is_private]
    first = memory.last_plan_at_s is None
    if first:
        memory = replace(memory, last_plan_at_s=now)
    memory = BASELINES[ctl.config.policy].fleet(ctl, snap, memory, now, rem, s, first)
    # Baselines keep machines while work is pending and let idle ones go at the end of
    # their paid time once nothing is pending (they hold no plan to release earlier); the
    # peers release idle instances by their own clocks.
    if len(snap.pending) == 0 and getattr(BASELINES[ctl.config.policy], "releases_idle", True):
        for n in live:
            if not n.running and (s.release_of(n) is None or s.release_of(n) > now):
                s.actions.append(ScheduleRelease(n.id, now, ReleaseCause.IDLE_NOTHING_PENDING))
                s.release[n.id] = now
    return memory


def most_efficient(types) -> MachineType | None:
    best = None
    for t in types:
        if t.limit <= 0:
            continue
        if best is None or (t.efficiency, t.capacity_per_s, t.name) > (best.efficiency, best.capacity_per_s, best.name):
            best = t
    return best


def list_eta_machines(types, private, eta: int | None, faster_first: bool = False) -> dict[str, int]:
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
