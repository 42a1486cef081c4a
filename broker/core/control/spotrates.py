"""Interruption rates learned from the run (issue 21): the planner stops trusting a spot
offer's declared rate once the run shows it interrupts far more.

The inventory declares each spot type's rate lambda0 (``interruptions_per_hour``, or AWS's
monthly bucket turned into one). The run sees, per spot type, n interruptions (EC2 took an
instance back) over T instance-hours of exposure (every spot instance of the type, from its
launch to its end, or to now while it lives): the ledger keeps n and the exposure of ended
instances (``Ledger.spot_seen``), the live ones are added from the snapshot. Interruptions
of one instance are a Poisson process of rate lambda (the model ``plan/spot.py`` plans
with), so n ~ Poisson(lambda T).

**Prior: the declared rate, and a way out of it** (a robust conjugate mixture):

    lambda ~ (1 - eps) Gamma(a1 = 1, b1 = 1 / lambda0)  +  eps Gamma(a2 = 1/2, b2 = 10^-3 h)

(shape, rate). The first component is the declared rate, worth one interruption in its
mean time between interruptions (20 instance-hours at 0.05 / h): one early interruption of
an honest offer does not overturn it. The second is "any rate at all" (a Jeffreys-like
shape, a thousandth of an instance-hour of weight); eps = 0.01. Each component updates
conjugately, Gamma(a + n, b + T), and the weights by how well each predicted what was seen,
the negative binomial marginal

    m_j = Gamma(a_j + n) / (Gamma(a_j) n!) (b_j / (b_j + T))^a_j (T / (b_j + T))^n,
    w_j proportional to eps_j m_j.                                                      (R1)

An offer declared at 0.05 / h that interrupts at 30 / h shows 3 interruptions in 0.1
instance-hours (m1 ~ 1e-7, m2 ~ 0.03): the posterior is the second component's, Gamma(3.5,
0.1), median 31 / h, after three interruptions. An honest one seen once in its first hour keeps
99.6% of its weight on the first (median 0.08 / h); seen once in its first 0.1 hour (a 0.5%
chance at 0.05 / h), 90% (its 0.9 quantile 0.2 / h).
Once the data dominate, the posterior is Gamma(1/2 + n, T) and its intervals cover the true
rate at about their level (``tests/test_spot_rates.py`` measures it).

The rate a re-plan uses is, per spot type, once it has been interrupted at least once,

    deadline goals:   the posterior's 1 - delta quantile (``ControllerConfig.confidence``);
    other goals:      the posterior median (its mean is no use: the second component's is
                      huge while its weight is small);

and never less than lambda0 (a short run's luck does not make an offer safer than its
declared rate). Before the first interruption it is lambda0: seeing none can only lower it. The quantile: the regularized lower incomplete gamma P(a, x) by its series
(x < a + 1) or its continued fraction (Legendre's, by the modified Lentz method); the
mixture's distribution function inverted by bisection. A rate that makes a type's
efficiency eta vanish (``plan/spot.py``) removes it from the plans: the offer stops being
rented.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

from ..model import MachineType
from .causes import GoalKind
from .snapshot import NodeView

if TYPE_CHECKING:
    from .controller import Controller
    from .snapshot import Snapshot

_TINY = 1e-300


def gamma_p(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x) (a > 0)."""
    if x <= 0:
        return 0.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = 0
        while abs(term) > abs(total) * 1e-15 and n < 10_000:
            n += 1
            term *= x / (a + n)
            total += term
        return min(1.0, total * math.exp(log_front))
    b = x + 1 - a
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


PRIOR_EPS = 0.01  # the weight of "any rate at all"
VAGUE_SHAPE, VAGUE_RATE_H = 0.5, 1e-3


def mixture_cdf(x: float, parts: Sequence[tuple[float, float, float]]) -> float:
    """P(lambda <= x) for a mixture of (weight, shape, rate) gamma components."""
    return sum(w * gamma_p(a, x * b) for w, a, b in parts)


def mixture_quantile(p: float, parts: Sequence[tuple[float, float, float]]) -> float:
    """The ``p`` quantile of a gamma mixture, by bisection on its distribution function."""
    hi = max(a / b for _, a, b in parts) + 1e-12
    while mixture_cdf(hi, parts) < p:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mixture_cdf(mid, parts) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def gamma_quantile(p: float, shape: float, rate: float) -> float:
    """The ``p`` quantile of Gamma(shape, rate) (rate = 1 / scale)."""
    return mixture_quantile(p, ((1.0, shape, rate),))


def _log_marginal(a: float, b: float, n: int, t: float) -> float:
    if t <= 0:
        return 0.0 if n == 0 else -math.inf
    return (math.lgamma(a + n) - math.lgamma(a) - math.lgamma(n + 1) + a * math.log(b / (b + t))
            + n * math.log(t / (b + t)))


def posterior(declared_per_h: float, seen: int, exposure_h: float) -> tuple[tuple[float, float, float], ...]:
    """The posterior (R1): its (weight, shape, rate) components (rates per hour)."""
    prior = [(PRIOR_EPS, VAGUE_SHAPE, VAGUE_RATE_H)]
    if declared_per_h > 0:
        prior.insert(0, (1 - PRIOR_EPS, 1.0, 1.0 / declared_per_h))
    logs = [math.log(e) + _log_marginal(a, b, seen, exposure_h) for e, a, b in prior]
    top = max(logs)
    ws = [math.exp(x - top) for x in logs]
    total = sum(ws)
    return tuple((w / total, a + seen, b + exposure_h) for w, (_, a, b) in zip(ws, prior))


def learned_rate(declared_per_h: float, seen: int, exposure_h: float, level: float | None = None) -> float:
    """The rate a re-plan uses: the posterior's ``level`` quantile (None: its median), never
    below the declared rate; the declared rate until an interruption is seen."""
    if seen <= 0:
        return declared_per_h
    value = mixture_quantile(0.5 if level is None else level, posterior(declared_per_h, seen, exposure_h))
    return max(declared_per_h, value)


def exposure_s(name: str, closed_s: float, nodes: Sequence[NodeView], now: float) -> float:
    """Instance-seconds of the type's spot instances: ended ones (``closed_s``) and live ones."""
    return closed_s + sum(max(0.0, now - n.launched_at_s) for n in nodes
                          if n.type_name == name and n.launched_at_s is not None)


def learned_types(ctl: Controller, snap: Snapshot, now: float) -> tuple[MachineType, ...]:
    """``snap.types`` with each spot type's rate learned (the module docstring); as they are
    when learning is off or nothing has been seen."""
    types = tuple(snap.types.values())
    seen: Mapping[str, Sequence[float]] = snap.spot_seen
    if not ctl.config.learn_spot_rates or not any(t.is_spot for t in types):
        return types
    level = ctl.config.confidence if ctl.goal.kind == GoalKind.DEADLINE else None
    out = []
    for t in types:
        if t.is_spot:
            n, closed = seen.get(t.name, (0, 0.0))
            hours = exposure_s(t.name, closed, snap.nodes, now) / 3600.0
            if n:
                rate = learned_rate(t.interruptions_per_hour, int(n), hours, level)
                if rate != t.interruptions_per_hour:
                    t = replace(t, interruptions_per_hour=rate)
        out.append(t)
    return tuple(out)
