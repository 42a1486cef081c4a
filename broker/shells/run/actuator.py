"""What takes time: EC2 calls, each written to the journal as an intent before and an outcome
after, and the timers (APScheduler) that post the loop's timed messages.

The loop calls these and turns what comes back into ledger events; nothing here decides.
This is the seam where EC2 calls can move off the loop later (their results would come back
on the inbox as events instead of return values).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from broker.core.model import MachineType
from broker.shells.aws.records import AwsFailure, InstanceRecord
from broker.shells.clock import RunClock
from broker.shells.journal import Journal

from .types import Fleet

# How long an instance EC2 has never listed may stay unlisted before it counts as gone (run s):
# describe is eventually consistent after a launch, for seconds, sometimes minutes.
UNLISTED_GRACE_S = 600.0


@dataclass(frozen=True, slots=True)
class Launched:
    """What a launch call gave: the instances (id, launch time in run s) and any failure."""

    instances: tuple[tuple[str, float], ...]
    failure: AwsFailure | None = None


class Ec2Actuator:
    """EC2 for one run: launches with client tokens ``<run>-<seq>``, terminations, and the
    per-tick check of the fleet against EC2's own view."""

    def __init__(self, fleet: Fleet, journal: Journal, clock: RunClock, run_id: str) -> None:
        self.fleet, self.journal, self.clock, self.run_id = fleet, journal, clock, run_id
        self.launch_seq = 0  # continued on resume (resume.py)
        # Terminations asked for that EC2 has not confirmed (instance -> cause): retried every
        # tick and in the final sweep; the journal keeps them ``terminating`` meanwhile.
        self.unconfirmed: dict[str, str] = {}
        # Launches that failed: EC2 may have carried them out anyway (a lost response whose
        # retries ran out), so every tick's describe looks for instances under their tokens.
        self.suspect_launches = 0
        self.listed: set[str] = set()  # instances some describe has listed: unlisted later, gone

    def launch(self, t: MachineType, count: int, cause: str) -> Launched:
        """Intent, RunInstances, one journal row per instance (its own token), outcome."""
        self.launch_seq += 1
        token = f"{self.run_id}-{self.launch_seq}"
        intent = self.journal.intend("launch", {"type": t.name, "count": count, "client_token": token}, cause)
        outcome = self.fleet.launch(t.name, count, client_token=token)
        now = self.clock.now_s()
        launched = []
        for k, record in enumerate(outcome.instances, 1):
            # EC2's LaunchTime is billing's; at a scaled time it means nothing, so: now.
            at = self.clock.to_run_s(record.launched_at_s) if self.clock.time_scale == 1.0 else now
            at = min(at, now)
            self.journal.record_launch(record.id, t.name, launched_at_s=at, price_per_hour=t.price_per_hour,
                                       billing=t.billing, client_token=f"{token}-{k}", action_seq=intent)
            launched.append((record.id, at))
        if outcome.failure is None:
            self.journal.complete(intent, {"instances": list(outcome.instance_ids)})
        else:
            self.suspect_launches += 1
            self.journal.fail(intent, outcome.failure.render())
        return Launched(tuple(launched), outcome.failure)

    def terminate(self, instance_id: str, cause: str) -> str | None:
        """Terminate one instance; see :meth:`terminate_all`. Returns the error, else None."""
        return self.terminate_all({instance_id: cause}).get(instance_id)

    def terminate_all(self, causes: dict[str, str]) -> dict[str, str]:
        """An intent per instance, one TerminateInstances (only ever this run's tagged
        instances), outcomes. An instance is recorded terminated only when EC2 says so (its
        answer, or a describe showing it shutting down or terminated); otherwise it stays
        ``terminating`` in the journal and in :attr:`unconfirmed`, to be asked again.
        Returns the error of each instance EC2 did not confirm."""
        intents = {i: self.journal.intend("terminate", {"instance_id": i}, cause) for i, cause in causes.items()}
        outcome = self.fleet.terminate(list(causes))
        confirmed = set(outcome.terminated) | set(outcome.already_terminated)
        errors = {}
        for instance_id, intent in intents.items():
            if instance_id in confirmed:
                self.journal.complete(intent, {"terminated": [instance_id]})
                self.journal.record_instance_state(instance_id, "terminated")
                self.unconfirmed.pop(instance_id, None)
                continue
            error = (outcome.failure.render() if outcome.failure and instance_id in outcome.failed
                     else "refused: EC2 does not list the instance under this run's tag (yet)")
            self.journal.fail(intent, error)
            self.journal.record_instance_state(instance_id, "terminating")
            self.unconfirmed[instance_id] = causes[instance_id]
            errors[instance_id] = error
        return errors

    def survey(self, alive: list[tuple[str, float]], known: set[str], now: float, grace_s: float,
               force: bool = False) -> tuple[list[tuple[str, str]], list[InstanceRecord]]:
        """One DescribeInstances by the run's tag (when there is something to look at, or
        ``force``): which of ``alive`` (id, launch time) EC2 says are gone, with why, and the
        live instances under the run's tag that are not in ``known`` (a launch EC2 carried out
        though its answer never came). An instance EC2 has never listed is not gone until
        ``max(grace_s, UNLISTED_GRACE_S)`` after its launch (describe is eventually consistent
        after a launch); one it listed before and lists no more is. A failed describe finds
        nothing."""
        if not (alive or self.suspect_launches or force):
            return [], []
        described = self.fleet.describe()
        if described.failure is not None:
            return [], []
        by_id = {r.id: r for r in described.instances}
        self.listed.update(by_id)
        out = []
        for instance_id, launched_at in alive:
            record = by_id.get(instance_id)
            if record is not None and not record.state.gone:
                continue
            if record is None and instance_id not in self.listed and now - launched_at < max(grace_s,
                                                                                                 UNLISTED_GRACE_S):
                continue
            state = "not listed by EC2" if record is None else record.state.value
            out.append((instance_id, f"instance {state}: terminated outside the broker"))
        unknown = [r for r in described.instances if r.id not in known and not r.state.gone]
        return out, unknown


class Timers:
    """APScheduler jobs that put a message on the loop's inbox at a run time (or every tick)."""

    def __init__(self, clock: RunClock, post: Callable[[Any], None]) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        self.clock, self.post = clock, post
        self.scheduler = BackgroundScheduler(timezone=timezone.utc)
        self.scheduler.start()

    def every(self, run_s: float, message: Any, job_id: str) -> None:
        self.scheduler.add_job(self.post, "interval", args=(message,), id=job_id,
                               seconds=self.clock.wall_delay_s(run_s), coalesce=True, max_instances=1,
                               misfire_grace_time=None)

    def at(self, run_s: float, message: Any, job_id: str) -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=self.clock.wall_delay_s(run_s - self.clock.now_s()))
        self.scheduler.add_job(self.post, "date", args=(message,), id=job_id, run_date=when,
                               replace_existing=True, misfire_grace_time=None)

    def cancel(self, job_id: str) -> None:
        from apscheduler.jobstores.base import JobLookupError

        try:
            self.scheduler.remove_job(job_id)
        except JobLookupError:
            pass

    def shutdown(self) -> None:
        self.scheduler.shutdown(wait=False)
