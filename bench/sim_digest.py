"""A digest of the simulator's results over 27 scenarios, to compare code before and after a
change that must not alter a decision (a speed-up):

    python3 bench/sim_digest.py [TASKS]      # default 2,000 tasks a scenario; about 20 s

Thesis catalogue (20 of each type, hourly) plus the private Xeon; workloads LM, mixture and
bats; goals point 1, deadline 4 h, budget $30 and none; seeds 1 and 2; and one run each with
faults (failures, instance losses, agent kills, speed noise), with a spot type, and of rr.
Each line prints a scenario's digest (its whole JSON result but the wall time), makespan and
cost; the last line digests them all. Two trees that print the same last line made the same
decisions in every scenario.
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from broker.core.billing import Billing  # noqa: E402
from broker.core.control.controller import ControllerConfig  # noqa: E402
from broker.core.control.snapshot import Goal  # noqa: E402
from broker.core.model import Inventory, MachineType, PrivateNode  # noqa: E402
from broker.sim.engine import SimOptions, Simulation  # noqa: E402
from broker.sim.workloads import BUILTIN, build_workload  # noqa: E402

CATALOGUE = [("m1.small", 1, 0.080), ("c1.medium", 5, 0.165), ("m1.large", 4, 0.320), ("c1.xlarge", 20, 0.660)]
FAULTS = dict(failure_rate=0.05, instance_loss_rate=0.1, agent_kill_rate=0.2, speed_noise=0.2)


def inventory(per_type: int, slots: int = 1, spot: bool = False) -> Inventory:
    types = [MachineType(n, slots, speed, price, per_type, 60.0, Billing.hourly()) for n, speed, price in CATALOGUE]
    if spot:
        types.append(MachineType("c1.xlarge.spot", slots, 20, 0.2, per_type, 60.0, Billing.per_second(),
                                 market="spot", ec2_type="c1.xlarge", interruptions_per_hour=0.5))
    return Inventory(private=(PrivateNode("xeon", 1, 10.0, 0.32, local=True),), types=tuple(types))


def scenarios() -> list[tuple]:
    """(seed, workload, goal, policy, fault options, a spot type, slots per machine)."""
    out = [(seed, wl, goal, "broker", {}, False, 1) for seed in (1, 2) for wl in ("LM", "mixture", "bats")
           for goal in (Goal("point", 1), Goal("deadline", 4 * 3600), Goal("budget", 30.0), Goal())]
    return out + [(3, "LM", Goal("point", 1), "broker", FAULTS, False, 2),
                  (4, "LM", Goal("deadline", 3 * 3600), "broker", {}, True, 1),
                  (5, "LM", Goal(), "rr", {}, False, 1)]


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    digests = []
    for seed, wl, goal, policy, faults, spot, slots in scenarios():
        bag = build_workload(BUILTIN[wl], seed, tasks=tasks)
        r = Simulation(inventory(20, slots, spot), bag, goal, ControllerConfig(policy=policy),
                       SimOptions(seed=seed, **faults)).run()
        result = r.to_json()
        result.pop("sim_wall_s", None)
        digests.append(hashlib.sha1(json.dumps(result, sort_keys=True, default=str).encode()).hexdigest()[:10])
        print(seed, wl, goal.kind, policy, "faults" if faults else "-", "spot" if spot else "-", digests[-1],
              f"{r.makespan_s:.1f} s", f"${r.cost_usd:.2f}", flush=True)
    print("ALL", hashlib.sha1("".join(digests).encode()).hexdigest()[:12])


if __name__ == "__main__":
    main()
