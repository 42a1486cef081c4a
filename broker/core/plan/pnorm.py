"""Workloads that minimize the p-norm utility (ALGORITHMS.md 3.4; thesis Ch. 4.3, 4.4.1).

Machine i has speed s_i (reference seconds per second: slots x speed) and cost c_i (USD per
hour); it gets workload psi_i (reference seconds). The thesis minimizes sum alpha_i C_i^r,
r >= 1 (Eq. 4.5). Relaxed (no ceilings) with beta_i = alpha_i c_i / s_i^r this is

    minimize  sum_i beta_i psi_i^r   subject to  sum_i psi_i = W,  psi_i >= 0.

r > 1: the objective is strictly convex; KKT gives r beta_i psi_i^(r-1) = lambda for all i, so

    psi_i = W beta_i^(-1/(r-1)) / sum_k beta_k^(-1/(r-1)).

(Thesis Eq. 4.14 prints an extra sum_(i != j) beta_i psi_i^r term in the gradient; it does not
belong there: see Errata.) Machines with beta_i = 0 (free) take all the work, split equally.
r = 1: the objective is linear; all work goes to the least beta_i (the most cost-efficient
machine), split equally among exact ties.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

from ..model import MachineType, PrivateNode
from .types import Work

Machine = Union[MachineType, PrivateNode, tuple[float, float]]


def _speed_and_cost(machine: Machine) -> tuple[float, float]:
    if isinstance(machine, MachineType):
        return machine.capacity_per_s, machine.price_per_hour
    if isinstance(machine, PrivateNode):
        return machine.capacity_per_s, machine.cost_per_hour
    speed, cost = machine
    return float(speed), float(cost)


def pnorm_allocation(
    types_or_caps: Sequence[Machine],
    work: Union[Work, float],
    r: float,
    alphas: Sequence[float] | None = None,
) -> tuple[float, ...]:
    """psi_i for each machine (MachineType, PrivateNode or a (speed, cost per hour) pair)."""
    total = work.total_ref_s if isinstance(work, Work) else float(work)
    machines = [_speed_and_cost(m) for m in types_or_caps]
    if not machines:
        raise ValueError("p-norm allocation needs at least one machine")
    if r < 1:
        raise ValueError(f"the p-norm exponent r must be >= 1, got {r}")
    alphas = [1.0] * len(machines) if alphas is None else [float(a) for a in alphas]
    if len(alphas) != len(machines):
        raise ValueError(f"{len(alphas)} alphas for {len(machines)} machines")
    if any(s <= 0 for s, _ in machines) or any(c < 0 for _, c in machines) or any(a < 0 for a in alphas):
        raise ValueError("speeds must be > 0, costs and alphas >= 0")
    betas = [a * c / s**r for a, (s, c) in zip(alphas, machines)]
    least = min(betas)
    if r == 1 or least == 0:
        winners = [b <= least for b in betas]  # exact ties share equally
        share = total / sum(winners)
        return tuple(share if w else 0.0 for w in winners)
    # Scale by the least beta before the power so large exponents cannot overflow.
    weights = [(b / least) ** (-1.0 / (r - 1.0)) for b in betas]
    norm = math.fsum(weights)
    return tuple(total * w / norm for w in weights)

