"""Workload models for the simulator (ALGORITHMS.md 7) and their YAML form.

A workload file says how many tasks, how their true reference runtimes are drawn, and
what the broker knows beforehand:

    name: LM
    tasks: 100000
    runtime: {dist: pow2, x_normal: [1.8, 3], unit: 1m, x_cut: [-2, 8]}
    estimates: {error: 0.1}      # per-task tool estimates within +/-10% of the truth (or omit)
    prior: exact                 # exact | none: the mean is known (a stated hint) or must be sampled

Distributions (``dist``):
- ``pow2``: 2^x units with x ~ U(a, b) (``x_uniform: [a, b]``) or x ~ N(m, sd)
  (``x_normal: [m, sd]``) cut to ``x_cut`` (thesis Tables 5.6, 6.3; the tail cut is a stated
  parameter because the thesis's normal cases have an unbounded tail it must have cut);
- ``uniform`` (``low``, ``high``), ``normal`` (``mean``, ``sd``, truncated at ``min``,
  default 1 s), ``lognormal`` (``mean``, ``sigma``), ``bimodal`` (two normals, ``weight``),
  ``constant`` (``value``).

Thesis Table 4.2 (minutes): Short U(0, 8); Long N(36, 6); Mixture N(12, 3).
Thesis LS: x ~ U(0, 3); LL: x ~ N(3.5, 3); LM: x ~ N(1.8, 3), 2^x minutes.
BaTS: 1000 tasks N(15 min, sd sqrt(5) min).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from ..core.units import parse_duration
from .engine import SimWorkload

DEFAULT_X_CUT = (-2.0, 8.0)  # 2^-2 = 15 s ... 2^8 = 256 min: the stated tail cut for pow2 normals

BUILTIN: dict[str, dict] = {
    "short": {"tasks": 1000, "runtime": {"dist": "uniform", "low": "1s", "high": "8m"}},
    "long": {"tasks": 1000, "runtime": {"dist": "normal", "mean": "36m", "sd": "6m"}},
    "mixture": {"tasks": 1000, "runtime": {"dist": "normal", "mean": "12m", "sd": "3m"}},
    "LS": {"tasks": 100000, "runtime": {"dist": "pow2", "x_uniform": [0, 3], "unit": "1m"}},
    "LM": {"tasks": 100000, "runtime": {"dist": "pow2", "x_normal": [1.8, 3], "unit": "1m"}},
    "LL": {"tasks": 100000, "runtime": {"dist": "pow2", "x_normal": [3.5, 3], "unit": "1m"}},
    "bats": {"tasks": 1000, "runtime": {"dist": "normal", "mean": "15m", "sd": f"{math.sqrt(5) * 60:.3f}s"}},
}


class WorkloadError(ValueError):
    pass


def draw_runtimes(spec: dict, n: int, rng: np.random.Generator) -> np.ndarray:
    dist = spec.get("dist")
    try:
        if dist == "pow2":
            unit = parse_duration(spec.get("unit", "1m"))
            if "x_uniform" in spec:
                a, b = spec["x_uniform"]
                x = rng.uniform(float(a), float(b), n)
            elif "x_normal" in spec:
                m, sd = spec["x_normal"]
                lo, hi = spec.get("x_cut", DEFAULT_X_CUT)
                x = _truncated_normal(rng, float(m), float(sd), float(lo), float(hi), n)
            else:
                raise WorkloadError("pow2 needs x_uniform: [a, b] or x_normal: [mean, sd]")
            return unit * np.power(2.0, x)
        if dist == "uniform":
            return rng.uniform(parse_duration(spec["low"]), parse_duration(spec["high"]), n)
        if dist == "normal":
            lo = parse_duration(spec.get("min", 1))
            return _truncated_normal(rng, parse_duration(spec["mean"]), parse_duration(spec["sd"]), lo, math.inf, n)
        if dist == "lognormal":
            mean = parse_duration(spec["mean"])
            sigma = float(spec.get("sigma", 1.0))
            mu = math.log(mean) - sigma * sigma / 2
            return rng.lognormal(mu, sigma, n)
        if dist == "bimodal":
            w = float(spec.get("weight", 0.5))
            a = _truncated_normal(rng, parse_duration(spec["mean1"]), parse_duration(spec["sd1"]), 1.0, math.inf, n)
            b = _truncated_normal(rng, parse_duration(spec["mean2"]), parse_duration(spec["sd2"]), 1.0, math.inf, n)
            return np.where(rng.random(n) < w, a, b)
        if dist == "constant":
            return np.full(n, parse_duration(spec["value"]))
    except KeyError as exc:
        raise WorkloadError(f"runtime distribution {dist!r} needs the field {exc.args[0]!r}") from None
    raise WorkloadError(f"unknown runtime distribution {dist!r} (pow2, uniform, normal, lognormal, bimodal, constant)")


def _truncated_normal(rng, mean: float, sd: float, lo: float, hi: float, n: int) -> np.ndarray:
    out = rng.normal(mean, sd, n)
    bad = (out < lo) | (out > hi)
    for _ in range(100):
        k = int(bad.sum())
        if not k:
            break
        out[bad] = rng.normal(mean, sd, k)
        bad = (out < lo) | (out > hi)
    return np.clip(out, lo, hi)


def build_workload(spec: dict, seed: int, *, tasks: int | None = None, name: str | None = None) -> SimWorkload:
    rng = np.random.default_rng(seed)
    n = int(tasks or spec.get("tasks", 1000))
    if n <= 0:
        raise WorkloadError("a workload needs at least one task")
    runtimes = draw_runtimes(spec["runtime"], n, rng)
    estimates = None
    est = spec.get("estimates")
    if est:
        err = float(est.get("error", 0.1))
        estimates = runtimes * (1.0 + rng.uniform(-err, err, n))
    prior = spec.get("prior", "exact" if estimates is None else "none")
    prior_mean = float(np.mean(runtimes)) if prior == "exact" else None
    prior_sd = float(np.std(runtimes)) if prior == "exact" else None
    if estimates is not None and prior_mean is None:
        prior_mean, prior_sd = float(np.mean(estimates)), float(np.std(estimates))
    return SimWorkload(runtimes, estimates, prior_mean, prior_sd, name or spec.get("name", "workload"))


def load_workload(path: str | Path, seed: int, tasks: int | None = None) -> SimWorkload:
    name = str(path)
    if name in BUILTIN:
        return build_workload(BUILTIN[name], seed, tasks=tasks, name=name)
    p = Path(path)
    try:
        spec = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise WorkloadError(f"{p}: no such workload file (built-in names: {', '.join(BUILTIN)})") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(spec, dict) or "runtime" not in spec:
        raise WorkloadError(f"{p}: a workload needs a 'runtime' mapping (see broker/sim/workloads.py)")
    return build_workload(spec, seed, tasks=tasks, name=spec.get("name", p.stem))


def load_runtimes_csv(path: str | Path) -> SimWorkload:
    """A trace: a CSV with ``runtime_s`` (reference seconds) and optional ``estimate_s``."""
    import csv

    p = Path(path)
    runtimes: list[float] = []
    estimates: list[float] = []
    try:
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or "runtime_s" not in reader.fieldnames:
                raise WorkloadError(f"{p}: needs a 'runtime_s' column (found {reader.fieldnames})")
            has_est = "estimate_s" in reader.fieldnames
            for line, row in enumerate(reader, start=2):
                try:
                    runtimes.append(float(row["runtime_s"]))
                    if has_est:
                        estimates.append(float(row["estimate_s"]))
                except (TypeError, ValueError):
                    raise WorkloadError(f"{p}:{line}: runtime_s/estimate_s must be numbers") from None
                if runtimes[-1] < 0:
                    raise WorkloadError(f"{p}:{line}: runtime_s must be >= 0")
    except FileNotFoundError:
        raise WorkloadError(f"{p}: no such file") from None
    if not runtimes:
        raise WorkloadError(f"{p}: no rows")
    arr = np.asarray(runtimes)
    est = np.asarray(estimates) if estimates else None
    prior = float(est.mean()) if est is not None else None
    prior_sd = float(est.std()) if est is not None else None
    return SimWorkload(arr, est, prior, prior_sd, p.stem)
