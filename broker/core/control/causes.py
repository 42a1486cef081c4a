"""The control core's closed vocabularies: policies, goal kinds, the causes of actions, the
states of a task and the outcomes of its attempts.

Each is a ``StrEnum`` whose values are the strings the event log and the journal have always
carried, so an enum member compares equal to its string and is written as it (JSON, SQLite,
structlog): shells that still compare plain strings keep working, and no stored event changes.
A cause the controller does not emit but a shell does (a node lost, a resume) is listed too,
marked as a shell's, so that one place names every reason the broker spends or saves money.
"""

from __future__ import annotations

from enum import StrEnum

from ..goal import GoalKind  # noqa: F401 - the goal's own module holds it; re-exported


class Policy(StrEnum):
    """Who decides the fleet: the broker's planner, or one of the baselines it is compared with."""

    BROKER = "broker"
    LIST = "list"  # List_eta: the eta most cost-efficient machines, for the whole run
    RR = "rr"  # round robin over every machine there is
    FIRSTFIT = "firstfit"  # one more instance whenever a task fits nowhere
    ONE_VM_FOR_ALL = "1vm4all"  # one instance of the most cost-efficient type
    BATS = "bats"  # the BaTS budget-constrained configuration, renewed per unit
    # peers' autoscalers (peers.py) and the thesis's own scheduler (panda.py)
    AUTOSCALE_IDLE = "autoscale-idle"  # Ray autoscaler / Parsl simple: pending demand, idle timeout
    ADAPTIVE = "adaptive"  # Dask Adaptive: work / target duration, scale down after wait_count
    BATCH = "batch"  # AWS Batch managed compute environment, BEST_FIT_PROGRESSIVE
    STATIC = "static"  # condor_annex: a fixed fleet on a renewed lease
    PANDA = "panda"  # thesis Ch. 6: estimator tools, workload targets, FFD with targets


class LaunchCause(StrEnum):
    """Why instances are bought (``Launch.cause``); the plan causes are also ``PlanResult.cause``."""

    PLAN = "plan"  # a plan without a more specific cause
    DEADLINE_PLAN = "deadline_plan"  # the cheapest plan that meets the deadline
    DEADLINE_AT_RISK = "deadline_at_risk"  # no plan meets it: the fastest one
    DEADLINE_PASSED_FASTEST_PLAN = "deadline_passed_fastest_plan"
    BUDGET_PLAN = "budget_plan"  # the fastest plan within the budget
    BUDGET_TIGHT = "budget_tight"  # ... for the point value of the work only
    BUDGET_SHORT = "budget_short"  # ... for the share of the work the budget buys
    STATUS_QUO = "status_quo"  # the fleet as scheduled meets the goal: no change
    SURPLUS = "surplus"  # the fleet as scheduled meets the goal: shed
    SAMPLING_WITHOUT_PRIVATE_NODES = "sampling_without_private_nodes"
    LIST_ETA = "list_eta"
    ROUND_ROBIN_ALL_MACHINES = "round_robin_all_machines"
    ONE_VM_FOR_ALL = "one_vm_for_all"
    BATS_CONFIGURATION = "bats_configuration"
    FIRSTFIT_NO_FIT = "firstfit_no_fit"
    PENDING_DEMAND = "pending_demand"  # autoscale-idle
    ADAPTIVE_TARGET = "adaptive_target"
    RUNNABLE_VCPUS = "runnable_vcpus"  # batch
    ANNEX_LEASE = "annex_lease"  # static
    PANDA_TARGETS = "panda_targets"
    ADOPTED_ON_RESUME = "adopted_on_resume"  # a shell's: an instance found running on resume
    SPOT_FALLBACK = "spot_fallback"  # on-demand for tasks barred from spot (spotfallback.py)


class ReleaseCause(StrEnum):
    """Why an instance's release is (re)scheduled (``ScheduleRelease.cause``) or it goes."""

    BAG_DONE = "bag_done"
    USER_STOP = "user_stop"
    PLAN = "plan"  # the first release a plan gives an instance
    PLAN_NEEDS_LONGER = "plan_needs_longer"
    SURPLUS_AT_BILLING_BOUNDARY = "surplus_at_billing_boundary"
    BUDGET_CAP = "budget_cap"
    RUNNING_TASK_NEEDS_LONGER = "running_task_needs_longer"
    SAMPLING_IN_PROGRESS = "sampling_in_progress"
    IDLE_NOTHING_PENDING = "idle_nothing_pending"
    BATS_RENEW_ATU = "bats_renew_atu"
    IDLE_TIMEOUT = "idle_timeout"  # autoscale-idle
    ADAPTIVE_SCALE_DOWN = "adaptive_scale_down"
    NO_RUNNABLE_JOBS = "no_runnable_jobs"  # batch
    ANNEX_IDLE = "annex_idle"  # static
    ANNEX_LEASE_RENEWED = "annex_lease_renewed"
    PANDA_NO_WORK_ASSIGNED = "panda_no_work_assigned"
    # the run ledger's (ledger/): not the controller's decisions, the lifecycle's
    PLANNED = "planned"
    PLANNED_LIFE = "planned_life"  # launch + max(release_after_s, boot)
    BAD_NODE = "bad_node"
    NODE_LOST = "node_lost"
    INSTANCE_LOST = "instance_lost"  # EC2 says it is gone
    SETUP_FAILED = "setup_failed"
    PENDING_TIMEOUT = "pending_timeout"  # EC2 kept it pending past its type's pending_timeout
    RESUMED = "resumed"  # a resumed run's timer, as journaled or at paid-until minus the margin
    RESUMED_PAST_RELEASE = "resumed_past_release"
    INTERRUPTED_RELEASE = "interrupted_release"  # the dead daemon was terminating it
    SPOT_INTERRUPTED = "spot_interrupted"  # EC2 took a spot instance back (ledger/spot.py)
    # a shell's: an instance the journal had, gone from EC2 when the run resumed
    GONE_ON_RESUME = "gone_on_resume"


class WorkCause(StrEnum):
    """Why a task goes to a slot (``Assign.cause``, ``Replicate.cause``)."""

    SAMPLING = "sampling"
    DISPATCH = "dispatch"
    NOTHING_FITS_ANYWHERE = "nothing_fits_anywhere"
    TAIL_REPLICATION = "tail_replication"
    PRIVATE_BUDGET_SPENT = "private_budget_spent"  # Cancel: the budget pays no more private time
    # Cancel and Requeue causes of the ledger's spot rules (ledger/spot.py): not failures
    SPOT_NOTICE = "spot_notice"  # it cannot end before the two-minute notice runs out
    SPOT_INTERRUPTED = "spot_interrupted"  # it was still running when EC2 took the instance


class TaskState(StrEnum):
    """Where a task stands (the journal's ``tasks.state``)."""

    PENDING = "pending"  # waiting for a slot (again, after a failure within its retries)
    SAMPLING = "sampling"  # running as a drawn sample
    RUNNING = "running"
    DONE = "done"  # a result counts (the first success)
    FAILED = "failed"  # out of retries
    QUARANTINED = "quarantined"  # poison: failed everywhere, or killed its nodes
    CANCELLED = "cancelled"  # given up without running (a stop for the budget)
    DROPPED = "dropped"  # removed from the bag by a resume after an edit (its history is kept)


# Task states that are given up: no attempt will be made again.
SETTLED_FAILED = (TaskState.FAILED, TaskState.QUARANTINED, TaskState.CANCELLED)


class AttemptOutcome(StrEnum):
    """How one attempt of a task ended (the journal's ``attempts.outcome``)."""

    RUNNING = "running"  # not ended yet
    OK = "ok"  # exit code 0 within the timeout
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"  # vanished with its agent or node
    CANCELLED = "cancelled"  # stopped by the broker (a replica that lost the race, a re-queue)
    INTERRUPTED = "interrupted"  # its spot instance was taken back (or was about to be): no failure


# Attempt outcomes that count as a failure of the task.
FAILURES = (AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LOST)


class Ending(StrEnum):
    """What the end of an attempt meant to the ledger (``ledger.Ended.outcome``)."""

    DONE = "done"  # the first result: the task is done
    REPLICA = "replica"  # a success after the task was done
    FAILED = "failed"  # counted by the failure rules
    LOST = "lost"  # vanished with its agent or node: a failure without a signature
    CANCELLED = "cancelled"  # no failure: re-queued
    INTERRUPTED = "interrupted"  # its spot instance was taken back: no failure, re-queued
    STALE = "stale"  # no such attempt runs (a replay, a written-off copy): nothing changed
