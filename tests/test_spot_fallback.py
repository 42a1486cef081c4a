"""Rule "a task interrupted ``max_spot_attempts`` times runs on on-demand" when the plan rents
spot only (broker/core/control/spotfallback.py): the controller rents on-demand capacity for
the barred tasks, and dispatch keeps them off spot from the decision that launches it."""

import numpy as np

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.failures import FailurePolicy
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, spot_key
from broker.sim.engine import SimOptions, SimWorkload, Simulation
from broker.sim.spot import SpotFaults

# Spot at 30% of the price, declared at 1 interruption an hour (the planner rents spot only
# for these 5-25 minute tasks), interrupted 10x as often: many tasks reach the bar.
OD = MachineType("c5", 2, 1.0, 0.4, 8, 60.0, Billing.hourly())
SPOT = MachineType(spot_key("c5"), 2, 1.0, 0.12, 8, 60.0, Billing.per_second(), market="spot", ec2_type="c5",
                   interruptions_per_hour=1.0)
RUNTIMES = np.random.default_rng(5).uniform(300, 1500, 120)


def barred_run(seed: int, learn: bool = True):
    inv = Inventory(private=(), types=(OD, SPOT))
    wl = SimWorkload(RUNTIMES, RUNTIMES, float(RUNTIMES.mean()))
    cfg = ControllerConfig(learn_spot_rates=learn)
    sim = Simulation(inv, wl, Goal("deadline", 6 * 3600), cfg,
                     SimOptions(seed=seed, spot=SpotFaults(rate_scale=10.0), failures=FailurePolicy(max_spot_attempts=1)))
    done_on: dict[str, bool] = {}  # task -> finished on a spot node
    on_result = sim.ledger.on_result

    def recording(node_id, task_id, attempt, now, *a, **kw):
        ended = on_result(node_id, task_id, attempt, now, *a, **kw)
        if ended.outcome.name == "DONE":
            node = sim.ledger.nodes[node_id]
            done_on[task_id] = node.type is not None and node.type.is_spot
        return ended

    sim.ledger.on_result = recording
    return sim.run(), sim, done_on


def test_barred_tasks_end_on_on_demand_when_the_plan_rents_spot_only():
    for seed in (1, 2, 3):
        # learning off: the plan keeps renting spot, so only the fallback rule brings on-demand
        r, sim, done_on = barred_run(seed, learn=False)
        barred = sim.ledger.spot_barred
        assert r.spot["fallback_tasks"] >= 3 and barred
        assert sorted(r.completions.values()) == [1] * len(RUNTIMES)
        assert [t for t in barred if done_on[t]] == []  # every barred task ended off spot
        assert r.spot["fallback_attempts"] >= len(barred)
        launches = [n for n in sim.ledger.nodes.values() if n.type is OD]
        assert launches  # the on-demand capacity was rented for them
