"""Spot interruptions in the simulator (broker/sim/spot.py) with the ledger's rules
(ledger/spot.py): invariants over generated scenarios, and the rules one at a time.

- under a budget goal with spot interruptions, cloud spend never exceeds the budget;
- each task is done exactly once (all of them unless a budget stopped the run);
- an interrupted attempt is no failure of its task (no task is given up for interruptions);
- a task interrupted ``max_spot_attempts`` times runs on on-demand or private nodes only;
- every fault asked for fired (a test of interruptions that never happen tests nothing).
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.core.billing import Billing
from broker.core.control.controller import ControllerConfig
from broker.core.control.failures import FailurePolicy
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode, spot_key
from broker.sim.engine import SimOptions, SimWorkload, Simulation
from broker.sim.spot import SpotFaults


def offers(ec2: str, slots: int, speed: float, price: float, limit: int, boot_s: float, rate: float,
           discount: float, od_billing: Billing) -> tuple[MachineType, MachineType]:
    """An EC2 type offered on both markets: on-demand, and spot at ``discount`` of its price."""
    od = MachineType(ec2, slots, speed, price, limit, boot_s, od_billing)
    spot = MachineType(spot_key(ec2), slots, speed, price * discount, limit, boot_s, Billing.per_second(),
                       market="spot", ec2_type=ec2, interruptions_per_hour=rate)
    return od, spot


@st.composite
def scenarios(draw):
    od_billing = draw(st.sampled_from([Billing.hourly(), Billing.per_second()]))
    types = []
    for i in range(draw(st.integers(1, 2))):
        types += offers(f"type{i}", draw(st.integers(1, 4)), draw(st.sampled_from([1.0, 2.0, 4.0])),
                        draw(st.sampled_from([0.1, 0.4, 0.8])), draw(st.integers(1, 6)),
                        draw(st.sampled_from([0.0, 60.0])), draw(st.sampled_from([0.5, 2.0, 6.0])),
                        draw(st.sampled_from([0.3, 0.6])), od_billing)
    private = ()
    if draw(st.booleans()):
        private = (PrivateNode("own", slots=draw(st.integers(1, 2)), speed=1.0, local=True),)
    n = draw(st.integers(5, 150))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    runtimes = rng.lognormal(math.log(draw(st.sampled_from([60.0, 600.0, 1800.0]))) - 0.125, 0.5, n)
    estimates = runtimes * rng.uniform(0.7, 1.3, n) if draw(st.booleans()) else None
    prior = float(runtimes.mean()) if estimates is None else float(estimates.mean())
    faults = SpotFaults(loss_at_s=draw(st.sampled_from([None, 600.0, 3000.0])),
                        loss_rate_per_hour=draw(st.sampled_from([0.0, 0.5])))
    return Inventory(private=private, types=tuple(types)), SimWorkload(runtimes, estimates, prior), seed, faults


def run(inv, wl, goal, seed, faults=SpotFaults(), **opt):
    cfg = ControllerConfig(margin_s=120.0, tick_s=60.0, replan_every_s=600.0)
    return Simulation(inv, wl, goal, cfg, SimOptions(seed=seed, max_virtual_s=20 * 86400.0, spot=faults,
                                                     **opt)).run()


@pytest.mark.slow
@given(scenarios(), st.sampled_from([0.05, 0.5, 2.0, 10.0]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_budget_is_never_exceeded_under_spot_interruptions(sc, budget):
    inv, wl, seed, faults = sc
    r = run(inv, wl, Goal("budget", budget), seed, faults)
    assert r.max_committed_usd <= budget + 1e-9
    assert r.cloud_cost_usd <= budget + 1e-9
    assert all(c == 1 for c in r.completions.values()) and r.tasks_done == len(r.completions)
    assert not r.quarantined  # interruptions are no failures


@given(scenarios())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_each_task_is_done_exactly_once_under_spot_interruptions(sc):
    inv, wl, seed, faults = sc
    total = float(wl.runtimes_ref_s.sum())
    r = run(inv, wl, Goal("deadline", total / 4 + 1800), seed, faults)
    assert sorted(r.completions.values()) == [1] * r.tasks_total
    assert not r.quarantined
    assert r.spot is not None and r.spot["interruptions"] == r.faults["spot_interruption"]


# -- the rules, on one fixed scenario ---------------------------------------------------------
# One interruption an hour: often enough to fire dozens of times, seldom enough that the
# spot-aware planner (plan/spot.py) still rents spot for these 5-25 minute tasks.
OD, SPOT = offers("c5", 2, 1.0, 0.4, 8, 60.0, 1.0, 0.3, Billing.hourly())
RUNTIMES = np.random.default_rng(5).uniform(300, 1500, 200)


def spot_run(rate_scale=1.0, types=(OD, SPOT), private=(), policy=FailurePolicy(), seed=5, goal=None, **faults):
    inv = Inventory(private=private, types=types)
    wl = SimWorkload(RUNTIMES, RUNTIMES, float(RUNTIMES.mean()))
    sim = Simulation(inv, wl, goal or Goal("deadline", 6 * 3600), ControllerConfig(),
                     SimOptions(seed=seed, spot=SpotFaults(rate_scale=rate_scale, **faults), failures=policy))
    starts = []
    start = sim.ledger.start

    def recording(task_id, node_id, slot, now, **kw):
        barred = task_id in sim.ledger.spot_barred
        a = start(task_id, node_id, slot, now, **kw)
        if a is not None:
            node = sim.ledger.nodes[node_id]
            fallback = any(not n.lost and (n.type is None or not n.type.is_spot) for n in sim.ledger.live_nodes())
            starts.append((task_id, node.type is not None and node.type.is_spot, barred, fallback))
        return a

    sim.ledger.start = recording
    return sim.run(), sim, starts


def test_interruptions_fire_at_the_types_rate_lose_work_and_are_not_failures():
    r, sim, _ = spot_run()
    assert r.faults["spot_interruption"] >= 5 and r.spot["attempts_interrupted"] > 0
    lost = sim.ledger.spot_counts.lost_work_ref_s
    assert lost > 0 and r.wasted_ref_s >= lost - 1e-6
    assert sorted(r.completions.values()) == [1] * 200 and not r.quarantined
    assert sim.ledger.book.failures == {} and sim.ledger.book.losses == {}
    # with the rate at 0, nothing is interrupted
    r0, _, _ = spot_run(rate_scale=0.0)
    assert r0.faults["spot_interruption"] == 0 and r0.spot["attempts_interrupted"] == 0


def test_a_task_interrupted_max_spot_attempts_times_moves_to_on_demand():
    r, sim, starts = spot_run(policy=FailurePolicy(max_spot_attempts=1), private=(PrivateNode("own", 1, local=True),))
    assert r.spot["fallback_tasks"] > 0 and r.spot["fallback_attempts"] > 0
    # never started on spot once barred, while an on-demand or private node could take it
    assert not [s for s in starts if s[1] and s[2] and s[3]]
    assert sorted(r.completions.values()) == [1] * 200


def test_an_interrupted_spot_instance_is_charged_only_for_what_it_ran():
    r, sim, _ = spot_run(types=(SPOT,))
    interrupted = [n for n in sim.ledger.nodes.values() if n.interrupted]
    assert interrupted
    for n in interrupted:  # per-second billing, interrupted: the seconds it ran
        assert n.cost_usd(1e9) == pytest.approx((n.terminated_at_s - n.launched_at_s) // 1 / 3600 * SPOT.price_per_hour)
    assert r.cloud_cost_usd == pytest.approx(sum(n.cost_usd(r.makespan_s) for n in sim.ledger.nodes.values()))


def test_a_correlated_loss_takes_every_instance_of_the_type_and_its_capacity():
    r, sim, _ = spot_run(rate_scale=0.0, loss_at_s=1800.0, loss_type=SPOT.name, capacity_back_after_s=7200.0)
    lost = [n for n in sim.ledger.nodes.values() if n.interrupted]
    assert r.faults["spot_type_loss"] == 1 and lost
    assert all(n.notice_at_s == 1800.0 and n.terminated_at_s == 1920.0 for n in lost)
    alive_then = [n for n in sim.ledger.nodes.values() if n.type is SPOT and n.launched_at_s <= 1800.0
                  and (n.terminated_at_s is None or n.terminated_at_s >= 1920.0)]
    assert set(alive_then) == set(lost)
    # no spot instance launched while the capacity was gone; the run still finished on on-demand
    assert not [n for n in sim.ledger.nodes.values() if n.type is SPOT and 1800.0 <= n.launched_at_s < 9000.0]
    assert sorted(r.completions.values()) == [1] * 200 and r.spot["cost_usd_by_market"]["on-demand"] > 0


# -- broker simulate ----------------------------------------------------------------------------
SPOT_INVENTORY = """
aws:
  billing: hourly
  types:
    - {name: c1.xlarge, slots: 1, speed: 20, price: 0.66, limit: 10}
    - {name: c1.xlarge, market: spot, slots: 1, speed: 20, price: 0.2, limit: 10, interruptions_per_hour: 0.5}
"""


def test_simulate_takes_the_spot_options_and_reports_the_interruptions(tmp_path, capsys):
    import json

    from broker.cli import main

    inv = tmp_path / "inv.yaml"
    inv.write_text(SPOT_INVENTORY)
    args = ["simulate", "--inventory", str(inv), "--workload", "LM", "--tasks", "400", "--deadline", "2h",
            "--seed", "2"]
    rc = main(args + ["--spot-loss-at", "20m", "--spot-loss-type", "c1.xlarge@spot", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["tasks"]["done"] == 400
    assert obj["spot"]["interruptions"] >= 1 and obj["spot"]["notices"] == obj["spot"]["interruptions"]
    assert set(obj["spot"]["cost_usd_by_market"]) == {"spot", "on-demand"}
    rc = main(args + ["--spot-rate", "0"])
    assert rc == 0 and "spot: 0 interruptions" in capsys.readouterr().out
    for bad, says in ((["--spot-loss-type", "c1.xlarge"], "is not a spot type"),
                      (["--spot-notice", "soon"], "--spot-notice"),
                      (["--max-spot-attempts", "0"], "max_spot_attempts must be >= 1"),
                      (["--spot-rate", "-1"], "rate_scale")):
        assert main(args + bad) == 2
        assert says in capsys.readouterr().err
