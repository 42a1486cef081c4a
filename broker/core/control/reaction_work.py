"""The controller's reaction to a bag whose remaining work comes out larger, in the promise.

``reaction.py`` carries out the controller's reaction to estimates biased as a whole, while
their correction ratio is not known. Once it is (or when the tasks have no estimates at all)
what is still uncertain is the remaining work's total under the runtime law: the forecast's
replicates draw it (the law's mean by the bootstrap, the tasks' own spread, the ratio's
error) and carry out the fleet as this decision leaves it. A replicate with more work than
that fleet covers by the deadline runs late; the controller does not let it: an hour later
its own forecast overshoots, the tail allowance pulls the planning deadline in
(``promises._adjust_allowance``) and the re-plan buys (lognormal sigma 1.5, 10,000 tasks:
the promise at 10% done said 15.8 h (90%: 12.9-20.3 h) against a 16.5 h deadline; the run
ended at 12.4 h, below the interval; over 40 runs the interval held the makespan in 75%,
every miss below it).

So the same walk as ``reaction.py``, with the replicates grouped by the work each drew
(``Forecast.work_ref_s``) into ``reaction.STRATA`` groups: from the largest down, a group's
work (its median over the whole forecast's median, ``scale``) is given to the controller's
rules as if it were known: the remaining work scaled by it, the runtime law's values and
the estimates' ratio scaled by it, its error the group's spread
(:func:`reaction.reacted`: pull in, re-plan, at most ``reaction.ROUNDS`` times). When that
changed the fleet, the reacted fleet's forecast joins the group's replicates and those of
the group that ended past the deadline leave. The first group whose fleet needs no
reaction, or whose work is not above the median, ends the walk.

Only the promise reads this: nothing here is a decision, and its draws come from their own
generators (``SALT``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .reaction import STRATA, after_decision, applies, joined, reacted

if TYPE_CHECKING:
    from .controller import Controller
    from .estimates import RemainingWork
    from .scratch import Scratch
    from .snapshot import Memory, Snapshot

SALT = 23  # the reacted forecasts' draws: a stream of their own (reaction.py uses 17 and 18)


def with_work_reaction(ctl: Controller, snap: Snapshot, memory: Memory, now: float, rem: RemainingWork, s: Scratch,
                       launches, told, told_se: float | None):
    """``told`` with the forecast of the controller's reaction joined to each work group it
    would react to, that group's replicates past the deadline left out; see the module docstring."""
    work = told.work_ref_s
    if (ctl.goal.kind != "deadline" or memory.deadline_at_s is None or work is None or work.size < STRATA
            or applies(ctl, snap, told, told_se)):
        return told
    middle = float(np.median(work))
    if middle <= 0:
        return told
    order = np.argsort(work, kind="stable")
    keep = np.ones(work.size, dtype=bool)
    fleet = after_decision(snap, now, dict(s.release), launches)
    extra = []
    for k, idx in enumerate(reversed(np.array_split(order, STRATA))):
        w = work[idx]
        scale = float(np.median(w)) / middle
        if scale <= 1.0 + 1e-9:
            break
        rel = float(np.std(w) / np.median(w))
        f = reacted(ctl, fleet, memory, now, _scaled(rem, scale), idx.size, k, salt=SALT,
                    ratio_rel_se=rel, law_of=lambda law, c=scale, e=rel: _law_scaled(law, c, e))
        if f is None:
            break
        keep[idx] = told.makespans_s[idx] <= float(ctl.goal.value)
        extra.append(f)
    return joined(told, keep, extra, [f.ratios for f in extra])


def _scaled(rem: RemainingWork, scale: float) -> RemainingWork:
    """The remaining work ``scale`` x as large (its band kept as a share), the estimates'
    ratio with it (the mean and sd are the law's: ``_law_scaled`` scales its values)."""
    return replace(rem, point_ref_s=rem.point_ref_s * scale, upper_ref_s=rem.upper_ref_s * scale,
                   estimate_ratio=rem.estimate_ratio * scale, ratio_upper_ref_s=rem.ratio_upper_ref_s * scale)


def _law_scaled(law, scale: float, rel_se: float):
    """The runtime law with every runtime ``scale`` x as long (the cap kept) and its mean
    known to ``rel_se``: a stated law (no bootstrap), the group's spread, not the whole's."""
    tail = None if law.tail_from_ref_s is None else law.tail_from_ref_s * scale
    return replace(law, values_ref_s=np.minimum(law.values_ref_s * scale, law.cap_ref_s), mean_rel_se=rel_se,
                   sample_size=None, atom_counts=None, tail_atoms=0, tail_cut_ref_s=None, tail_from_ref_s=tail,
                   tail_excess_ref_s=law.tail_excess_ref_s * scale)
