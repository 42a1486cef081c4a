"""Least-squares regression of runtime on a sweep's numeric parameters: one more estimation
tool, fitted on finished tasks, weighted with the others (ALGORITHMS.md 2.4).

With ``x`` the numeric parameters of a task (those numeric in every training row and not
constant there) and ``y`` its runtime in reference seconds:

    linear:      y = b_0 + b^T x + e,            prediction max(b_0 + b^T x, 0);
    log_runtime: log y = b_0 + b^T x + e,        prediction exp(b_0 + b^T x) * mean(exp(e_j)),

the last factor being Duan's smearing estimate, which turns the back-transformed median
into a mean. Coefficients by ``numpy.linalg.lstsq``. The fit needs at least two more
finished tasks than coefficients; with fewer it is not offered (``fit`` returns None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class SweepRegression:
    """A fitted regression; :meth:`predict` gives a task's runtime in reference seconds."""

    columns: tuple[str, ...]
    coefficients: tuple[float, ...]  # intercept first
    log_runtime: bool
    smearing: float = 1.0

    @classmethod
    def fit(
        cls, params: Sequence[Mapping[str, object]], runtimes_ref_s: Sequence[float], log_runtime: bool = False
    ) -> "SweepRegression | None":
        """Fit on finished tasks' parameters and runtimes; None if too few tasks."""
        if len(params) != len(runtimes_ref_s):
            raise ValueError("one runtime per parameter row is needed")
        if not params:
            return None
        names = sorted(set.intersection(*(set(row) for row in params)))
        columns = []
        for name in names:
            values = [_number(row[name]) for row in params]
            if all(v is not None for v in values) and len(set(values)) > 1:
                columns.append(name)
        if len(params) < len(columns) + 3:
            return None
        x = np.array([[1.0] + [_number(row[c]) for c in columns] for row in params])  # type: ignore[list-item]
        y = np.asarray(runtimes_ref_s, dtype=float)
        if log_runtime:
            y = np.log(np.maximum(y, 1e-9))
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        smearing = float(np.mean(np.exp(y - x @ beta))) if log_runtime else 1.0
        return cls(tuple(columns), tuple(float(b) for b in beta), log_runtime, smearing)

    def predict(self, params: Mapping[str, object]) -> float:
        """Predicted runtime (reference seconds) of a task with these parameters."""
        row = [1.0]
        for name in self.columns:
            value = _number(params.get(name))
            if value is None:
                raise ValueError(f"task parameter {name!r} is missing or not a number")
            row.append(value)
        linear = float(np.dot(row, self.coefficients))
        if self.log_runtime:
            return math.exp(linear) * self.smearing
        return max(linear, 0.0)
