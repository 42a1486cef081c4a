"""Per-type speed by the ratio estimator, shrunk toward the declared speed
(ALGORITHMS.md 2.3).

For the tasks finished on machine type ``i``, with estimated reference work ``w_j`` and wall
time ``t_j``:

    ratio_i = sum_j w_j / sum_j t_j,
    s_i = lambda ratio_i + (1 - lambda) s_i^declared,    lambda = min(1, n_i / n_0),

where ``n_i`` is how many tasks finished there and ``n_0`` (default 10) how many it takes
to trust the data alone. Before any task finishes, ``s_i`` is the declared speed.
"""

from __future__ import annotations

from typing import Mapping

DEFAULT_TRUST_AFTER_TASKS = 10


class SpeedEstimator:
    """Running sums per type; :meth:`speed` gives the shrunk ratio estimate."""

    def __init__(self, declared: Mapping[str, float], trust_after_tasks: int = DEFAULT_TRUST_AFTER_TASKS):
        for name, speed in declared.items():
            if not speed > 0:
                raise ValueError(f"declared speed of {name!r} must be positive, got {speed!r}")
        if trust_after_tasks < 1:
            raise ValueError(f"trust_after_tasks must be >= 1, got {trust_after_tasks}")
        self._declared = dict(declared)
        self._trust_after = trust_after_tasks
        self._work_ref_s = {name: 0.0 for name in declared}
        self._wall_s = {name: 0.0 for name in declared}
        self._tasks = {name: 0 for name in declared}

    def record(self, type_name: str, ref_work_s: float, wall_s: float) -> None:
        """A task of estimated reference work ``ref_work_s`` took ``wall_s`` on ``type_name``."""
        if type_name not in self._declared:
            raise KeyError(f"no declared speed for machine type {type_name!r}")
        if not (ref_work_s >= 0 and wall_s > 0):
            raise ValueError(f"need work >= 0 and wall time > 0, got {ref_work_s!r} and {wall_s!r}")
        self._work_ref_s[type_name] += ref_work_s
        self._wall_s[type_name] += wall_s
        self._tasks[type_name] += 1

    def tasks(self, type_name: str) -> int:
        return self._tasks[type_name]

    def speed(self, type_name: str) -> float:
        """Estimated reference seconds per wall second of one slot of ``type_name``."""
        declared = self._declared[type_name]
        n = self._tasks[type_name]
        if n == 0:
            return declared
        weight = min(1.0, n / self._trust_after)
        ratio = self._work_ref_s[type_name] / self._wall_s[type_name]
        return weight * ratio + (1.0 - weight) * declared
