"""The control core's vocabularies are closed: every cause the controller emits is a member
of its enum, and the enums' values are the strings the event log has always carried."""

from __future__ import annotations

import json

import numpy as np
import pytest

from broker.core.billing import Billing
from broker.core.control.actions import Assign, Cancel, Launch, Replicate, ScheduleRelease, StopForBudget
from broker.core.control.causes import (AttemptOutcome, Ending, GoalKind, LaunchCause, Policy, ReleaseCause, TaskState,
                                        WorkCause)
from broker.core.control.controller import POLICIES, Controller, ControllerConfig
from broker.core.control.snapshot import Goal
from broker.core.model import Inventory, MachineType, PrivateNode
from broker.sim.engine import SimOptions, SimWorkload, Simulation

# The strings journals and event logs already hold: renaming a member's value breaks them.
STORED = {
    Policy: {"broker", "list", "rr", "firstfit", "1vm4all", "bats", "autoscale-idle", "adaptive", "batch", "static",
             "panda"},
    GoalKind: {"deadline", "budget", "point", "theta", "none"},
    WorkCause: {"sampling", "dispatch", "nothing_fits_anywhere", "tail_replication", "private_budget_spent",
                "spot_notice", "spot_interrupted"},
    TaskState: {"pending", "sampling", "running", "done", "failed", "quarantined", "cancelled", "dropped"},
    AttemptOutcome: {"running", "ok", "failed", "timed_out", "lost", "cancelled", "interrupted"},
    Ending: {"done", "replica", "failed", "lost", "cancelled", "interrupted", "stale"},
}
EMITTED_BY_CONTROLLER = {
    Launch: LaunchCause, ScheduleRelease: ReleaseCause, Assign: WorkCause, Replicate: WorkCause,
    StopForBudget: ReleaseCause, Cancel: WorkCause,
}


@pytest.mark.parametrize("enum", list(STORED))
def test_enum_values_are_the_stored_strings(enum):
    assert {m.value for m in enum} == STORED[enum]


def test_a_member_is_its_string_everywhere_it_is_written():
    cause = ReleaseCause.SURPLUS_AT_BILLING_BOUNDARY
    assert cause == "surplus_at_billing_boundary" and f"{cause}" == str(cause) == "surplus_at_billing_boundary"
    assert json.dumps({"cause": cause}) == '{"cause": "surplus_at_billing_boundary"}'


def test_policies_and_goal_kinds_given_as_strings_become_members_and_others_are_refused():
    assert ControllerConfig(policy="rr").policy is Policy.RR
    assert Goal("budget", 1.0).kind is GoalKind.BUDGET
    assert set(POLICIES) == set(Policy)
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        ControllerConfig(policy="fastest")
    with pytest.raises(ValueError, match="unknown goal kind"):
        Goal("cheapest")


class _Recording(Controller):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.actions = []

    def decide(self, *args, **kwargs):
        d = super().decide(*args, **kwargs)
        self.actions += d.actions
        return d


TYPES = (MachineType("small", 1, 1.0, 0.1, 4, 30.0, Billing.hourly()),
         MachineType("big", 2, 4.0, 0.5, 2, 60.0, Billing.hourly()))


@pytest.mark.parametrize("policy,goal", [
    ("broker", Goal("deadline", 3 * 3600.0)), ("broker", Goal("budget", 0.8)), ("broker", Goal()),
    ("list", Goal()), ("rr", Goal()), ("firstfit", Goal()), ("1vm4all", Goal()), ("bats", Goal("budget", 2.0)),
    ("autoscale-idle", Goal()), ("adaptive", Goal()), ("batch", Goal()), ("static", Goal()), ("panda", Goal()),
])
def test_every_cause_the_controller_emits_is_a_member_of_its_vocabulary(policy, goal):
    rng = np.random.default_rng(5)
    wl = SimWorkload(rng.lognormal(np.log(600.0), 1.0, 120), None, None, name="heavy")
    inv = Inventory(private=(PrivateNode("lab", 1, 1.0, 0.0, local=True),), types=TYPES)
    config = ControllerConfig(policy=policy, eta=3 if policy == "list" else None)
    ctl = _Recording(goal, config, private=inv.private)
    Simulation(inv, wl, goal, config, SimOptions(seed=5, speed_noise=0.2), controller=ctl).run()
    assert ctl.actions
    unclassified = [a for a in ctl.actions if not isinstance(a.cause, EMITTED_BY_CONTROLLER[type(a)])]
    assert unclassified == []


def test_the_journal_accepts_exactly_the_task_states_and_attempt_outcomes(tmp_path):
    """The journal's CHECK constraints are written from the enums: every member is stored, and a
    string outside them is refused by SQLite itself."""
    import sqlite3

    from broker.shells.journal import Journal

    journal = Journal.open(tmp_path / "run")
    journal.create_run("r", goal_kind="budget", budget_usd=1.0, retries=0, at_s=0.0)
    db = sqlite3.connect(tmp_path / "run" / "journal.sqlite")
    for k, state in enumerate(TaskState):
        db.execute("INSERT INTO tasks (id, command, state, done_attempt) VALUES (?, 'true', ?, ?)",
                   (f"t{k}", state, 1 if state is TaskState.DONE else None))
    for k, outcome in enumerate(AttemptOutcome):
        db.execute("INSERT INTO attempts (task_id, attempt, node, outcome, ended_at) VALUES ('t0', ?, 'n', ?, ?)",
                   (k + 1, outcome, None if outcome is AttemptOutcome.RUNNING else 1.0))
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO tasks (id, command, state) VALUES ('x', 'true', 'finished')")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO attempts (task_id, attempt, node, outcome, ended_at) VALUES ('t0', 99, 'n', 'done', 1)")
    db.close()
    journal.close()
