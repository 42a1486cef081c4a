"""The broker's league points over many seeds, and a change judged against another checkout.

    python3 bench/league_seeds.py [--seeds 8] [--jobs 2] [--only NAME] [--points ...] [--against DIR]

The league (``bench/league.py``) runs one seed, which is what its goal lines quote; a change of
policy is not judged on it. A rule that made LM20 without estimates at point 1 $0.34 cheaper on
seed 1 moved the total cost of 96 runs by +0.06%, and that point by +0.43% (two seeds cheaper,
one dearer): one seed's noise. This runs the broker at point 1, a deadline at the front's knee,
the cheapest point and a budget at the knee's cost on the quick league's scenarios (or
``--only``), seeds 1..N, each seed with its own bounds, and prints per scenario and point: the
total cost, the mean cost / fluid bound at the delivered makespan, how many runs met their goal
(the deadline met, the bag finished within the budget). With ``--against DIR`` the same runs are
made on the checkout in DIR (``git worktree add DIR COMMIT``; its own league and broker code,
this script's harness) in a separate process, and each
line shows both and how many seeds got cheaper or dearer. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
POINTS = ("point 1", "knee deadline", "cheapest", "budget (knee cost)")


def one(job: tuple[str, str, str, int]) -> dict:
    root, name, label, seed = job
    if sys.path[:2] != [os.path.join(root, "bench"), root]:  # once a worker process
        sys.path[:0] = [os.path.join(root, "bench"), root]
    import league
    import scenarios as sc

    scn = next(s for s in sc.league_scenarios(quick=True) if s.name == name)
    b = league.bounds_for(scn, seed)
    spec = next(s for s in league.first_round(scn, b, seed) if s.label == label)
    r = league.run(spec)
    met = r.complete and (spec.goal_kind != "deadline" or r.makespan_s <= spec.goal_value + 1e-6)
    met = met and (spec.goal_kind != "budget" or r.max_committed_usd <= spec.goal_value + 1e-6)
    return {"name": name, "label": label, "seed": seed, "cost": r.cost_usd, "error": r.error, "h": r.makespan_s / 3600,
            "x_fluid": r.cost_usd / b.fluid(scn.inventory(), r.makespan_s), "met": bool(met)}


def run_here(root: str, names: list[str], points: list[str], seeds: int, jobs: int) -> list[dict]:
    work = [(root, n, p, s) for n in names for p in points for s in range(1, seeds + 1)]
    done = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for k, row in enumerate(pool.map(one, work), 1):
            done.append(row)
            print(f"[{k}/{len(work)}] {row['name']}: {row['label']} seed {row['seed']}", file=sys.stderr, flush=True)
    return done


def summary(rows: list[dict]) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        g = out.setdefault((r["name"], r["label"]), {"cost": 0.0, "h": 0.0, "x": [], "met": 0, "n": 0, "by_seed": {}})
        g["cost"] += r["cost"]
        g["h"] += r["h"]
        g["x"].append(r["x_fluid"])
        g["met"] += r["met"]
        g["n"] += 1
        g["by_seed"][r["seed"]] = r["cost"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", help="a quick league scenario (repeatable)")
    ap.add_argument("--points", default=",".join(POINTS), help="comma-separated broker points")
    ap.add_argument("--against", help="another checkout (a git worktree) to run the same on")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one checkout's rows, for --against
    ap.add_argument("--root", default=os.path.dirname(HERE), help=argparse.SUPPRESS)  # the checkout to run
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    sys.path[:0] = [os.path.join(root, "bench"), root]  # its league, scenarios and broker, not this one's
    import scenarios as sc

    names = args.only or [s.name for s in sc.league_scenarios(quick=True)]
    points = [p.strip() for p in args.points.split(",") if p.strip()]
    unknown = [p for p in points if p not in POINTS]
    if unknown:
        ap.error(f"unknown point {unknown[0]!r}; one of: {', '.join(POINTS)}")
    rows = run_here(root, names, points, args.seeds, args.jobs)
    if args.json:
        json.dump(rows, sys.stdout)
        return 0
    other = None
    if args.against:
        # this script, on the other checkout's code (which may predate it)
        cmd = [sys.executable, os.path.abspath(__file__), "--json", "--root", os.path.abspath(args.against),
               "--seeds", str(args.seeds), "--jobs", str(args.jobs), "--points", ",".join(points)]
        for n in names:
            cmd += ["--only", n]
        other = summary(json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout))
    here = summary(rows)
    print(f"command: python3 bench/league_seeds.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"seeds 1-{args.seeds}; cost and makespan: totals over the seeds; x fluid: mean cost / fluid bound at "
          f"the delivered makespan; met: goal met (deadline, or finished within the budget)")
    if other is not None:
        print(f"A = {os.path.abspath(args.against)}, B = this checkout ({root})")
    for (name, label), g in here.items():
        mean_x = sum(g["x"]) / len(g["x"])
        line = f"{name:20s} {label:19s} "
        if other is None:
            line += f"cost ${g['cost']:9.2f}  makespan {g['h']:7.2f}h  x fluid {mean_x:.4f}  met {g['met']}/{g['n']}"
        else:
            a = other[(name, label)]
            mean_a = sum(a["x"]) / len(a["x"])
            cheaper = sum(g["by_seed"][s] < a["by_seed"][s] - 1e-9 for s in g["by_seed"])
            dearer = sum(g["by_seed"][s] > a["by_seed"][s] + 1e-9 for s in g["by_seed"])
            line += (f"cost ${a['cost']:9.2f} -> ${g['cost']:9.2f} ({(g['cost'] / a['cost'] - 1) * 100:+.2f}%)  "
                     f"makespan {a['h']:.2f} -> {g['h']:.2f}h ({(g['h'] / a['h'] - 1) * 100:+.2f}%)  "
                     f"x fluid {mean_a:.4f} -> {mean_x:.4f}  met {a['met']} -> {g['met']} of {g['n']}  "
                     f"cheaper on {cheaper}, dearer on {dearer}")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
