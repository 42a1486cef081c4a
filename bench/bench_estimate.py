"""Samples used and empirical coverage of every stopping rule on every workload.

    python3 bench/bench_estimate.py [--reps 300] [--bag 40000]

For each (eps, delta) in (0.1, 0.05) and (0.2, 0.1), workload (broker.core.estimate.workloads)
and rule, ``reps`` seeded repetitions each draw a fresh bag, shuffle it (sampling without
replacement) and feed every rule the same draw order. Coverage is the share of repetitions
whose estimate lies within (1 +/- eps) of the bag's mean capped runtime. The last columns
give how many times fewer samples ebstop (betting confidence sequence) and ebstop-msa
(Mnih et al.'s empirical Bernstein bound) take than aa.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from broker.core.estimate import RULE_NAMES, make_rule  # noqa: E402
from broker.core.estimate.workloads import WORKLOADS  # noqa: E402

CONTRACTS = ((0.1, 0.05), (0.2, 0.1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--bag", type=int, default=40_000)
    args = parser.parse_args()
    print(f"command: python3 bench/bench_estimate.py --reps {args.reps} --bag {args.bag}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"numpy {np.__version__}")
    print(f"repetitions per cell: {args.reps}; bag size {args.bag}; samples = mean over repetitions\n")
    started = time.perf_counter()
    for eps, delta in CONTRACTS:
        print(f"eps = {eps}, delta = {delta} (coverage target {1 - delta:.2f})")
        head = f"{'workload':10s} {'mu_Z':>5s} " + " ".join(f"{r:>17s}" for r in RULE_NAMES)
        print(head + f" {'aa/ebstop':>9s} {'aa/msa':>7s}")
        for name, w in WORKLOADS.items():
            used = dict.fromkeys(RULE_NAMES, 0.0)
            covered = dict.fromkeys(RULE_NAMES, 0)
            exhausted = dict.fromkeys(RULE_NAMES, 0)
            mu_z = 0.0
            for rep in range(args.reps):
                rng = np.random.default_rng([rep, 31337])
                z = np.minimum(w.sample_s(rng, args.bag), w.timeout_s) / w.timeout_s
                mu_z += z.mean() / args.reps
                drawn = z[rng.permutation(args.bag)]
                for rule_name in RULE_NAMES:
                    rule = make_rule(rule_name, eps, delta, w.timeout_s, n_tasks=args.bag)
                    rule.feed_many(drawn)
                    used[rule_name] += rule.samples / args.reps
                    if rule.wants_more():
                        exhausted[rule_name] += 1
                        continue
                    estimate_z = rule.estimate().mean_ref_s / w.timeout_s
                    covered[rule_name] += abs(estimate_z - z.mean()) <= eps * z.mean()
            cells = []
            for rule_name in RULE_NAMES:
                mark = f"!{exhausted[rule_name]}" if exhausted[rule_name] else ""
                cells.append(f"{used[rule_name]:8.0f} {covered[rule_name] / args.reps:6.3f}{mark:>2s}")
            ratio = used["aa"] / used["ebstop"]
            ratio_msa = used["aa"] / used["ebstop-msa"]
            print(f"{name:10s} {mu_z:5.3f} " + " ".join(f"{c:>17s}" for c in cells) + f" {ratio:9.1f} {ratio_msa:7.1f}")
        print()
    print("cells: mean samples, empirical coverage (!k: k repetitions ran out of the bag, counted as misses)")
    print(f"total time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
