"""What tasks are packed into, and the result of packing them.

A :class:`Bin` is one machine seen by the packer: ``slots`` task slots of speed ``speed``
(so ``capacity_per_s = slots * speed`` reference seconds of work per wall second), a price,
and optionally the wall time it may work (``horizon_s``, e.g. its release time minus the
moment it is ready). It knows nothing of the planner: the planner (or a test) builds bins
from :class:`~broker.core.model.MachineType` and :class:`~broker.core.model.PrivateNode`.

An :class:`Assignment` maps task indices (positions in the array of task sizes, in reference
seconds) to bin indices; ``-1`` marks a task the packer could not place.

Cost efficiency is work per dollar, ``capacity_per_s * 3600 / price_per_hour`` (the thesis's
``s_i / c_i``); free machines are infinitely efficient. Every packer visits bins in
:func:`efficiency_order`: efficiency descending, ties kept in the caller's order, so results
are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..model import MachineType, PrivateNode

UNASSIGNED = -1


@dataclass(frozen=True, slots=True)
class Bin:
    """One machine to pack into. ``private`` machines are prorated, never billed by units."""

    id: str
    type_name: str
    slots: int
    speed: float
    price_per_hour: float
    horizon_s: float = math.inf
    private: bool = False

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"bin {self.id!r}: slots must be >= 1, got {self.slots!r}")
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"bin {self.id!r}: speed must be a positive number, got {self.speed!r}")
        if not (self.price_per_hour >= 0 and math.isfinite(self.price_per_hour)):
            raise ValueError(f"bin {self.id!r}: price must be >= 0 USD per hour, got {self.price_per_hour!r}")
        if not self.horizon_s >= 0:
            raise ValueError(f"bin {self.id!r}: horizon must be >= 0 seconds, got {self.horizon_s!r}")

    @property
    def capacity_per_s(self) -> float:
        """Reference seconds of work the machine does per wall second, all slots busy."""
        return self.slots * self.speed

    @property
    def efficiency(self) -> float:
        """Work per dollar (reference seconds per USD); +inf for a free machine."""
        if self.price_per_hour <= 0:
            return math.inf
        return self.capacity_per_s * 3600.0 / self.price_per_hour

    @classmethod
    def of_type(cls, machine_type: MachineType, id: str, horizon_s: float = math.inf) -> "Bin":
        return cls(id, machine_type.name, machine_type.slots, machine_type.speed,
                   machine_type.price_per_hour, horizon_s)

    @classmethod
    def of_private(cls, node: PrivateNode, horizon_s: float = math.inf) -> "Bin":
        return cls(node.name, node.name, node.slots, node.speed, node.cost_per_hour,
                   horizon_s, private=True)


def efficiency_order(bins: Sequence[Bin]) -> np.ndarray:
    """Bin indices by efficiency descending; equal efficiencies keep the input order."""
    efficiency = np.array([b.efficiency for b in bins], dtype=float)
    return np.argsort(-efficiency, kind="stable")


def as_task_sizes(task_sizes_ref_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """A read-only float64 copy of the task sizes, checked finite and non-negative."""
    sizes = np.array(task_sizes_ref_s, dtype=float).reshape(-1)
    bad = ~np.isfinite(sizes) | (sizes < 0)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"task {j}: size must be a finite number of reference seconds >= 0, got {sizes[j]!r}")
    sizes.flags.writeable = False
    return sizes


def as_targets(targets_ref_s: Sequence[float] | np.ndarray, bins: Sequence[Bin]) -> np.ndarray:
    """Per-bin workload targets as float64, checked: one per bin, finite, non-negative."""
    targets = np.array(targets_ref_s, dtype=float).reshape(-1)
    if targets.size != len(bins):
        raise ValueError(f"{targets.size} targets given for {len(bins)} bins: give one per bin")
    bad = ~np.isfinite(targets) | (targets < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"bin {bins[i].id!r}: target must be a finite number >= 0, got {targets[i]!r}")
    return targets


@dataclass(frozen=True, slots=True, eq=False)
class Assignment:
    """Tasks placed on bins: ``bin_of_task[j]`` is the bin index of task j, or -1."""

    bins: tuple[Bin, ...]
    sizes_ref_s: np.ndarray
    bin_of_task: np.ndarray

    def __post_init__(self) -> None:
        if self.bin_of_task.shape != self.sizes_ref_s.shape:
            raise ValueError("an assignment needs exactly one bin index per task")
        if self.bin_of_task.size and not (
            (self.bin_of_task >= UNASSIGNED).all() and (self.bin_of_task < len(self.bins)).all()
        ):
            raise ValueError("bin indices must lie in [-1, number of bins)")
        self.bin_of_task.flags.writeable = False

    @property
    def unassigned(self) -> np.ndarray:
        """Indices of the tasks no bin could take, in increasing order."""
        return np.flatnonzero(self.bin_of_task == UNASSIGNED)

    @property
    def loads_ref_s(self) -> np.ndarray:
        """Work placed on each bin (reference seconds)."""
        placed = self.bin_of_task != UNASSIGNED
        return np.bincount(self.bin_of_task[placed], weights=self.sizes_ref_s[placed],
                           minlength=len(self.bins)).astype(float)

    def parts(self) -> list[np.ndarray]:
        """For each bin, the indices of its tasks in increasing order."""
        order = np.argsort(self.bin_of_task, kind="stable")
        counts = np.bincount(self.bin_of_task + 1, minlength=len(self.bins) + 1)
        bounds = np.cumsum(counts)
        return [order[bounds[i]:bounds[i + 1]] for i in range(len(self.bins))]
