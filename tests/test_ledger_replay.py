"""The daemon decides nothing the ledger and the controller would not: a dry run's ledger
events and decisions, recorded, replayed through a fresh ledger and controller, give back
every action the daemon got (the simulator feeds the same ledger the same way, so the
simulator and the daemon produce the same actions for the same recorded events)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from broker.config.inventory import load_inventory
from broker.core.control.controller import Controller, ControllerConfig
from broker.core.control.failures import FailurePolicy
from broker.core.control.ledger import Ledger
from broker.core.control.snapshot import Goal, Memory
from broker.core.model import PrivateNode
from broker.shells.run import trace
from tests.test_dryrun import REPO, query
from tests.test_resume import run_args, run_dir, write_inputs  # noqa: F401 - run_dir: the fixture

FAILING_BAG = """\
command: "python3 -c 'import sys, time; time.sleep(0.3); sys.exit({code})'"
sweep:
  code: [0, 0, 0, 0, 0, 0, 0, 0, 0, 4]
timeout: 30s
retries: 1
"""


def test_replaying_a_dry_runs_ledger_events_gives_the_same_actions(tmp_path, run_dir):  # noqa: F811
    inv, _ = write_inputs(tmp_path)
    bag = tmp_path / "bag.yaml"
    bag.write_text(FAILING_BAG)  # a failure, a retry and a quarantine are in the events too
    path = tmp_path / "trace.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "BROKER_LEDGER_TRACE": str(path)}
    done = subprocess.run([sys.executable, "-m", "broker", *run_args(inv, bag, run_dir)], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]  # one task fails for good
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert query(run_dir, "SELECT DISTINCT state FROM instances") == [("terminated",)]  # recorded to the end

    entries = trace.read(path)
    header = entries[0]["header"]
    options = dict(header["ledger"])
    options["policy"] = FailurePolicy(**{k: v for k, v in options["policy"].items() if k != "__type__"})
    inventory = load_inventory(str(inv), live=False)
    ledger = Ledger({t.name: t for t in inventory.types}, **options)
    goal = Goal(*header["goal"])
    controller = Controller(goal, ControllerConfig(tick_s=header["tick_s"], margin_s=header["margin_s"],
                                                   queue_ahead_below_s=header["queue_ahead_below_s"]),
                            private=inventory.private)
    rng = np.random.default_rng(header["seed"])
    tasks = next(e for e in entries if e.get("call") == "add_tasks")["args"][0]
    rng.permutation(len(tasks))  # the daemon's shuffle of the bag came first
    decisions = trace.replay(entries[1:], ledger, controller, rng, Memory(), {"PrivateNode": PrivateNode})

    kinds = {a["__type__"] for _, recorded, _ in decisions for a in recorded}
    assert {"Assign", "Launch", "ScheduleRelease"} <= kinds, kinds  # the run sampled, launched, released
    assert sum(1 for e in entries if e.get("call") == "on_attempt_failed") >= 2
    assert len(decisions) > 10
    mismatches = [(now, recorded, replayed) for now, recorded, replayed in decisions if recorded != replayed]
    assert mismatches == []
    # The replayed ledger ends where the daemon's did.
    assert len(ledger.done) == 9 and list(ledger.quarantined) == ["t000010"]
