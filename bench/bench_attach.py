"""Start-up with one private host of several unreachable: how long until the others work.

    python3 bench/bench_attach.py [--hosts 4] [--tree PATH] [--repeat 3]

Needs root (``ip netns``): ``--hosts`` hosts in network namespaces, each with its own sshd
(``tests/netns_hosts.py``), the first one's link cut for the whole run. A live private-only
``broker run`` of 16 two-second tasks (with estimates, so no sampling pass) on them, from the
code tree ``--tree`` (default: this checkout; pass another checkout, e.g. ``git archive
be5fa0e | tar -x -C /tmp/old``, to compare). It prints, per repetition, the run time from
``run.start`` to each reachable host's ``node.ready`` and to the first ``task.start``, and
the run's wall time. Before issue 18's parallel attach, the reachable hosts waited for the
unreachable one's connect to fail, then for each other in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import yaml  # noqa: E402

from tests.netns_hosts import netns_hosts  # noqa: E402


def _stamp(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def once(tree: Path, hosts_count: int, work: Path) -> dict:
    with netns_hosts(hosts_count, work / "hosts") as hosts:
        (work / "tasks.csv").write_text("command,estimate_user\n" + "".join(
            f'"sleep 2; echo {i}",2\n' for i in range(16)))
        inventory = work / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"private": [h.inventory_entry(2, grace="30s") for h in hosts]}))
        (work / "bag.yaml").write_text("csv: tasks.csv\ntimeout: 5m\n")
        hosts[0].cut_link()
        home = work / "home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(HOME=str(home), PYTHONPATH=str(tree))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "broker", "run", "--yes", "--inventory", str(inventory),
                               str(work / "bag.yaml"), "--run-dir", str(work / "run"), "--tick", "5s"],
                              env=env, cwd=work, capture_output=True, text=True)
        wall = time.monotonic() - started
    events = [json.loads(line) for line in (work / "run" / "events.jsonl").read_text().splitlines()]
    start = _stamp(next(e for e in events if e["event"] == "run.start"))
    ready = {e["node"]: _stamp(e) - start for e in events if e["event"] == "node.ready"}
    first = min(_stamp(e) for e in events if e["event"] == "task.start") - start
    return {"exit": done.returncode, "wall_s": wall, "ready_s": ready, "first_task_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"# python3 bench/bench_attach.py --hosts {args.hosts} --tree {args.tree} --repeat {args.repeat}"
          f"  ({platform.node()}, {platform.python_version()})")
    firsts = []
    for k in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-attach-") as scratch:
            r = once(args.tree.resolve(), args.hosts, Path(scratch))
        firsts.append(r["first_task_s"])
        ready = ", ".join(f"{n} {s:.2f}s" for n, s in sorted(r["ready_s"].items()))
        print(f"run {k + 1}: exit {r['exit']}, first task {r['first_task_s']:.2f}s after run.start, "
              f"ready: {ready}, wall {r['wall_s']:.1f}s")
    print(f"first task after run.start: median {statistics.median(firsts):.2f}s "
          f"(host h0 unreachable, {args.hosts - 1} reachable)")


if __name__ == "__main__":
    main()
