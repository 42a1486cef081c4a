"""The peers (``peers.py``) and PANDA (``panda.py``) as baseline policies of ``baselines.BASELINES``.

Same interface as :class:`~broker.core.control.baselines.BaselinePolicy` (``name``, ``fit_rule``,
``fleet``), plus three hooks the controller reads with defaults for the other baselines:

- ``every_decision``: the rule runs on every decision (a task's end included), not only on the
  monitoring tick, so the peers' own time scales (Dask's 1 s checks, Ray's 5 min idle timeout)
  are kept to the moment the simulator or the daemon next decides;
- ``releases_idle``: False for rules that release idle instances by their own clock (the shared
  "idle once nothing is pending, go now" rule would pre-empt them);
- ``pick``: PANDA's dispatch (a free slot runs the largest task assigned to its machine).

Each rule's state lives in ``Memory.peer_state``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from . import panda, peers
from .causes import GoalKind, Policy
from .estimates import RemainingWork


class _Peer:
    name: Policy
    fit_rule = False
    every_decision = True
    releases_idle = False

    def fleet(self, ctl, snap, memory, now, rem: RemainingWork, s, first):
        state = memory.peer_state if isinstance(memory.peer_state, dict) else {}
        return replace(memory, peer_state=self.rule(ctl, snap, now, s, state, rem))

    def rule(self, ctl, snap, now, s, state, rem):  # pragma: no cover - overridden
        raise NotImplementedError


class AutoscaleIdle(_Peer):
    """Ray autoscaler / Parsl simple strategy (``peers.autoscale_idle``)."""

    name = Policy.AUTOSCALE_IDLE

    def rule(self, ctl, snap, now, s, state, rem):
        return peers.autoscale_idle(snap, now, s, state, ctl.config.peer)


class Adaptive(_Peer):
    """Dask Adaptive (``peers.adaptive``) on the remaining work's point value."""

    name = Policy.ADAPTIVE

    def rule(self, ctl, snap, now, s, state, rem):
        return peers.adaptive(snap, now, s, state, ctl.config.peer, rem.point_ref_s)


class Batch(_Peer):
    """AWS Batch, BEST_FIT_PROGRESSIVE (``peers.batch``)."""

    name = Policy.BATCH

    def rule(self, ctl, snap, now, s, state, rem):
        return peers.batch(snap, now, s, state, ctl.config.peer)


class Static(_Peer):
    """condor_annex's leased fleet (``peers.static``)."""

    name = Policy.STATIC

    def rule(self, ctl, snap, now, s, state, rem):
        return peers.static(snap, now, s, state, ctl.config.peer, ctl.config.tick_s)


class Panda:
    """The thesis's scheduler (``panda.py``): re-planned every ``replan_every_s`` (its interval)."""

    name = Policy.PANDA
    fit_rule = False
    every_decision = False
    releases_idle = False

    def fleet(self, ctl, snap, memory, now, rem: RemainingWork, s, first):
        memory = self._resolve_point(ctl, snap, memory, now, rem)
        state = memory.peer_state if isinstance(memory.peer_state, panda.PandaState) else None
        if state is None or now - state.at_s >= ctl.config.replan_every_s - 1e-9:
            left = rem.pending + rem.running
            mean = rem.point_ref_s / left if left and rem.point_ref_s > 0 else rem.mean_ref_s
            horizon = max(memory.deadline_at_s - now, ctl.config.replan_every_s)
            state = panda.plan_interval(snap, now, horizon, mean, s.release_of)
        panda.fleet(snap, now, s, state, ctl.config.margin_s)
        return replace(memory, peer_state=state)

    @staticmethod
    def _resolve_point(ctl, snap, memory, now, rem):
        """T_r: the deadline, else the front row a point or theta goal names, else T_upper."""
        if memory.deadline_at_s is not None:
            return memory
        g = ctl.goal
        if g.kind == GoalKind.DEADLINE:
            return replace(memory, deadline_at_s=snap.started_at_s + float(g.value))
        if g.kind in (GoalKind.POINT, GoalKind.THETA):
            from .replan import resolve_goal

            resolved = resolve_goal(ctl, snap, memory, now, rem)
            if resolved.deadline_at_s is not None:
                return resolved
        costs = {p.name: p.cost_per_hour for p in ctl.private}
        t_upper = panda.t_upper_s(snap, costs, rem.point_ref_s)
        return replace(memory, deadline_at_s=now + (t_upper if math.isfinite(t_upper) else ctl.config.replan_every_s))

    @staticmethod
    def pick(ctl, snap, memory, node, s) -> str | None:
        state = memory.peer_state
        if not isinstance(state, panda.PandaState):
            return None
        bins = panda.node_of_bin(snap, snap.now_s, s.release_of)
        bin_id = next((b for b, n in bins.items() if n.id == node.id), None)
        return panda.pick(snap, state, bin_id, s.taken)


PEER_POLICIES = (AutoscaleIdle(), Adaptive(), Batch(), Static(), Panda())
