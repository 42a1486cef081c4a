"""``broker estimate --runtimes CSV --rule RULE --eps E --delta D``: replay a stopping rule.

Reads a list of runtimes (a CSV with a ``runtime_s`` column), draws tasks from it uniformly
at random without replacement (``--seed``), feeds the rule in draw order as the live
sampling phase would, and reports the estimate next to the true mean of the list. Runtimes
above ``--timeout`` (default: the largest runtime) count as the timeout, and the true mean
is the mean of the runtimes so capped: that is what every rule estimates.

Output: a human summary, or with ``--json`` exactly one JSON object on standard output:
``{"rule", "samples", "mean_ref_s", "true_mean_ref_s", "eps", "delta", "exact"}``.
When the rule still wants samples after the whole list, every runtime has been used: the
estimate is then the list's mean exactly (``exact``: true), and the summary says so.

Exit status: 0 done; 2 bad input.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys

import numpy as np
import structlog

from broker.cli import UsageError
from broker.core.units import format_duration, parse_duration
from broker.config.errors import ConfigError, Problem
from broker.core.estimate.contract import census
from broker.core.estimate.rules import RULE_NAMES, expected_samples, make_rule

COLUMN = "runtime_s"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="replay a sampling stopping rule over a list of runtimes",
        description="Replay a stopping rule (the sampling phase) over known runtimes: how "
        "many samples it takes and how close its estimate of the mean comes.",
    )
    parser.add_argument("--runtimes", required=True, metavar="CSV", help=f"CSV file with a {COLUMN!r} column")
    parser.add_argument("--rule", required=True, choices=RULE_NAMES, help="stopping rule")
    parser.add_argument("--eps", required=True, type=float, help="relative error, e.g. 0.1")
    parser.add_argument("--delta", required=True, type=float, help="failure probability, e.g. 0.05")
    parser.add_argument("--timeout", metavar="DUR", help="R_max, e.g. 2h (default: the largest runtime)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draw order (default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.set_defaults(func=run)


def read_runtimes(path: str) -> np.ndarray:
    """The ``runtime_s`` column; every bad line reported at once as a ConfigError."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
            header = rows[0].keys() if rows else None
    except OSError as exc:
        raise ConfigError([Problem(path, None, f"cannot read the file: {exc.strerror or exc}")]) from None
    if header is None or COLUMN not in header:
        raise ConfigError([Problem(path, COLUMN, f"no {COLUMN!r} column (or no data rows)", line=1)])
    problems, values = [], []
    for line, row in enumerate(rows, start=2):
        text = (row.get(COLUMN) or "").strip()
        try:
            value = float(text)
        except ValueError:
            problems.append(Problem(path, COLUMN, f"not a number: {text!r}", line=line))
            continue
        if not (math.isfinite(value) and value >= 0):
            problems.append(Problem(path, COLUMN, f"a runtime must be a finite number >= 0, got {text!r}", line=line))
            continue
        values.append(value)
    if problems:
        raise ConfigError(problems)
    return np.array(values)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.eps < 1:
        raise UsageError(f"--eps must lie strictly between 0 and 1, got {args.eps}")
    if not 0 < args.delta < 1:
        raise UsageError(f"--delta must lie strictly between 0 and 1, got {args.delta}")
    runtimes = read_runtimes(args.runtimes)
    if args.timeout is None:
        r_max_s = float(runtimes.max())
    else:
        try:
            r_max_s = parse_duration(args.timeout)
        except ValueError as exc:
            raise UsageError(f"--timeout: {exc}") from None
    if not r_max_s > 0:
        raise UsageError("the timeout R_max must be positive (all runtimes are 0?): pass --timeout")

    capped = np.minimum(runtimes, r_max_s)
    true_mean = float(capped.mean())
    rule = make_rule(args.rule, args.eps, args.delta, r_max_s, n_tasks=runtimes.size)
    order = np.random.default_rng(args.seed).permutation(runtimes.size)
    rule.feed_many(capped[order] / r_max_s)
    log = structlog.get_logger()
    if rule.wants_more():  # every runtime of the list was used: their mean is the list's, exactly
        estimate = census(rule, capped)
        log.info("sample.exhausted", rule=args.rule, samples=rule.samples)
    else:
        estimate = rule.estimate()
    log.info("sample.done", rule=estimate.rule, samples=estimate.samples, mean_ref_s=estimate.mean_ref_s,
             capped=estimate.capped, eps=estimate.eps, delta=estimate.delta, exact=estimate.exact)
    if args.json:
        print(json.dumps({
            "rule": estimate.rule,
            "samples": estimate.samples,
            "mean_ref_s": estimate.mean_ref_s,
            "true_mean_ref_s": true_mean,
            "eps": estimate.eps,
            "delta": estimate.delta,
            "exact": estimate.exact,
        }))
        return 0
    mu_z, sigma_z = true_mean / r_max_s, float(capped.std()) / r_max_s
    expected = expected_samples(args.rule, args.eps, args.delta, mu_z, sigma_z, runtimes.size)
    error = estimate.mean_ref_s / true_mean - 1 if true_mean > 0 else math.nan
    print(f"rule {estimate.rule}, eps {estimate.eps:g}, delta {estimate.delta:g}, "
          f"R_max {format_duration(r_max_s)} ({r_max_s:g} s), seed {args.seed}")
    print(f"  samples        {estimate.samples} of {runtimes.size} ({estimate.samples / runtimes.size:.1%}); "
          f"expected from the list's own mean and sd: {expected:.0f}; capped at R_max: {estimate.capped}")
    if estimate.exact:
        print(f"  note           rule {args.rule} still wanted samples after all {runtimes.size} runtimes: "
              "every one was used, so the mean is exact")
    print(f"  estimate       {estimate.mean_ref_s:.2f} s   true mean {true_mean:.2f} s   "
          f"relative error {error:+.2%} ({'within' if abs(error) <= estimate.eps else 'OUTSIDE'} eps)")
    print(f"  guarantee      {estimate.guarantee}")
    for warning in estimate.warnings:
        print(f"  warning        {warning}")
    return 0
