"""What takes time: EC2 calls, each written to the journal as an intent before and an outcome
after, and the timers (APScheduler) that post the loop's timed messages.

EC2 calls run off the loop. The loop writes a call's intent, hands the call to a worker
thread and goes on; there is one worker per lane (:data:`LANES`: launches, terminations,
describes), so a launch stuck in its retries holds up neither terminations nor the tick's
describe, while calls of one kind keep the order they were made in; the worker makes the call (with the
fleet's own bounded retries, which may take minutes in an outage) and puts an
:class:`Ec2Answer` on the loop's inbox. The loop takes the answer (:meth:`Ec2Actuator.take`)
and records its outcome in the journal, then turns it into ledger events exactly as it
would a return value. So dispatch, result acknowledgements and release timers never wait on
AWS. The journal is written by the loop thread only; the workers touch nothing but EC2.

Rules kept across the hand-off: an intent is written before a call and its outcome after
the answer; a failed call is never recorded as done; a termination is recorded only when
EC2 confirms it (the rest stay in :attr:`Ec2Actuator.unconfirmed`, asked again every tick);
at most one describe is in flight, and an instance is never in two terminations at once.
When the run ends, :meth:`Ec2Actuator.settle` waits for every call still in flight so
that the final sweep starts from EC2's answers. Nothing here decides.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from broker.core.model import MachineType
from broker.shells.aws.records import (
    AwsFailure,
    DescribeOutcome,
    InstanceRecord,
    InstanceState,
    LaunchOutcome,
    TerminateOutcome,
)
from broker.shells.clock import RunClock
from broker.shells.journal import Journal

from .types import Fleet

# How long an instance EC2 has never listed may stay unlisted before it counts as gone (run s):
# describe is eventually consistent after a launch, for seconds, sometimes minutes.
UNLISTED_GRACE_S = 600.0

LANES = {"launch": "launch", "terminate": "terminate", "stray": "terminate", "describe": "describe"}


@dataclass(frozen=True, slots=True)
class Ec2Answer:
    """An EC2 call's result, back on the loop's inbox as ``(None, Ec2Answer)``."""

    call: int


@dataclass(frozen=True, slots=True)
class Launched:
    """What a launch call gave: the instances (id, launch time in run s) and any failure."""

    token: str
    type_name: str
    count: int
    cause: str
    instances: tuple[tuple[str, float], ...]
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class Terminated:
    """What a termination call gave: the instances EC2 confirmed (with their causes) and
    the error of each it did not."""

    confirmed: dict[str, str]
    errors: dict[str, str]


@dataclass(frozen=True, slots=True)
class Surveyed:
    """What a describe by the run's tag gave (``sent_at_s``: when it was asked), or None
    when it failed."""

    records: tuple[InstanceRecord, ...] | None
    sent_at_s: float
    failure: AwsFailure | None = None


@dataclass(frozen=True, slots=True)
class StrayTerminated:
    instance_id: str
    type_name: str
    terminated: bool


@dataclass
class _Call:
    kind: str  # launch | terminate | describe | stray
    sent_at_s: float
    payload: dict[str, Any]
    future: Future | None = None
    answer: Any = field(default=None)


class Ec2Actuator:
    """EC2 for one run: launches with client tokens ``<run>-<seq>``, terminations, and the
    per-tick check of the fleet against EC2's own view, all off the loop (module docstring).

    ``post`` puts a message on the loop's inbox (from a worker thread); without one (a
    caller that wants the old synchronous behaviour) every call is made at once in the
    caller's thread and its answer posted nowhere: :meth:`settle` returns it."""

    def __init__(self, fleet: Fleet, journal: Journal, clock: RunClock, run_id: str,
                 post: Callable[[Any], None] | None = None) -> None:
        self.fleet, self.journal, self.clock, self.run_id = fleet, journal, clock, run_id
        self.post = post
        self.launch_seq = 0  # continued on resume (resume.py)
        # Terminations asked for that EC2 has not confirmed (instance -> cause): retried every
        # tick and in the final sweep; the journal keeps them ``terminating`` meanwhile.
        self.unconfirmed: dict[str, str] = {}
        # Launches that failed: EC2 may have carried them out anyway (a lost response whose
        # retries ran out), so every tick's describe looks for instances under their tokens.
        self.suspect_launches = 0
        self.states: dict[str, InstanceState] = {}  # each instance's state in the last describe
        self._calls: dict[int, _Call] = {}
        self._numbers = itertools.count(1)
        self._lanes = ({lane: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ec2-{lane}")
                        for lane in set(LANES.values())} if post else None)

    # -- in flight -------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def launch_tokens(self) -> set[str]:
        """Client tokens of the launches sent and not yet answered."""
        return {c.payload["token"] for c in list(self._calls.values()) if c.kind == "launch"}

    def terminating(self) -> set[str]:
        """Instances in a termination call not yet answered."""
        return {i for c in list(self._calls.values()) if c.kind == "terminate" for i in c.payload["intents"]}

    def describing(self) -> bool:
        return any(c.kind == "describe" for c in list(self._calls.values()))

    def _send(self, kind: str, payload: dict[str, Any], call: Callable[[], Any]) -> int:
        number = next(self._numbers)
        c = _Call(kind, self.clock.now_s(), payload)
        self._calls[number] = c
        if self._lanes is None:
            c.answer = _guarded(call)
            return number

        def work() -> None:
            c.answer = _guarded(call)
            self.post(Ec2Answer(number))

        c.future = self._lanes[LANES[kind]].submit(work)
        return number

    def take(self, answer: Ec2Answer) -> Launched | Terminated | Surveyed | StrayTerminated | None:
        """The outcome of an answered call, journaled; None if it was taken already."""
        c = self._calls.pop(answer.call, None)
        if c is None:
            return None
        return getattr(self, f"_took_{c.kind}")(c)

    def settle(self) -> list:
        """Wait for every call in flight and take its answer (when the run ends)."""
        out = []
        for number in sorted(self._calls):
            c = self._calls.get(number)
            if c is None:
                continue
            if c.future is not None:
                c.future.result()
            out.append(self.take(Ec2Answer(number)))
        return [o for o in out if o is not None]

    def launched_unjournaled(self) -> list[str]:
        """The journal cannot be written (a full disk): wait for the launches in flight and
        return the instances they launched, so they can be terminated all the same."""
        ids = []
        for c in list(self._calls.values()):
            if c.kind != "launch":
                continue
            if c.future is not None:
                c.future.result()
            if isinstance(c.answer, LaunchOutcome):
                ids.extend(c.answer.instance_ids)
        return ids

    def shutdown(self) -> None:
        for lane in (self._lanes or {}).values():
            lane.shutdown(wait=False, cancel_futures=True)

    # -- launches --------------------------------------------------------------------------
    def launch(self, t: MachineType, count: int, cause: str) -> str:
        """The intent, then RunInstances under the next client token (returned) off the loop."""
        self.launch_seq += 1
        token = f"{self.run_id}-{self.launch_seq}"
        intent = self.journal.intend("launch", {"type": t.name, "count": count, "client_token": token}, cause)
        cap = {"max_price_per_hour": t.max_price_per_hour} if t.is_spot and t.max_price_per_hour is not None else {}
        self._send("launch", {"type": t, "count": count, "cause": cause, "token": token, "intent": intent},
                   lambda: self.fleet.launch(t.name, count, client_token=token, **cap))
        return token

    def _took_launch(self, c: _Call) -> Launched:
        """One journal row per instance (its own token), then the outcome."""
        p = c.payload
        t, token, intent = p["type"], p["token"], p["intent"]
        outcome = c.answer
        if isinstance(outcome, BaseException):
            outcome = LaunchOutcome(t.name, p["count"], token, failure=_failure_of(outcome))
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
        return Launched(token, t.name, p["count"], p["cause"], tuple(launched), outcome.failure)

    # -- terminations ----------------------------------------------------------------------
    def terminate(self, instance_id: str, cause: str) -> None:
        """Terminate one instance; see :meth:`terminate_all`."""
        self.terminate_all({instance_id: cause})

    def terminate_all(self, causes: dict[str, str]) -> None:
        """An intent per instance (``terminating`` in the journal), then one
        TerminateInstances off the loop (only ever this run's tagged instances). An instance
        already in a call in flight is not asked twice."""
        busy = self.terminating()
        causes = {i: c for i, c in causes.items() if i not in busy}
        if not causes:
            return
        intents = {}
        for i, cause in causes.items():
            intents[i] = self.journal.intend("terminate", {"instance_id": i}, cause)
            self.journal.record_instance_state(i, "terminating")
            self.unconfirmed.setdefault(i, cause)
        self._send("terminate", {"intents": intents, "causes": causes}, lambda: self.fleet.terminate(list(causes)))

    def _took_terminate(self, c: _Call) -> Terminated:
        """Outcomes: an instance is recorded terminated only when EC2 says so (its answer, or
        a describe showing it shutting down or terminated); otherwise it stays
        ``terminating`` and in :attr:`unconfirmed`, to be asked again."""
        intents, causes = c.payload["intents"], c.payload["causes"]
        outcome = c.answer
        if isinstance(outcome, BaseException):
            outcome = TerminateOutcome(failed=tuple(intents), failure=_failure_of(outcome))
        confirmed = set(outcome.terminated) | set(outcome.already_terminated)
        done, errors = {}, {}
        for instance_id, intent in intents.items():
            if instance_id in confirmed:
                self.journal.complete(intent, {"terminated": [instance_id]})
                self.journal.record_instance_state(instance_id, "terminated")
                self.unconfirmed.pop(instance_id, None)
                done[instance_id] = causes[instance_id]
                continue
            error = (outcome.failure.render() if outcome.failure and instance_id in outcome.failed
                     else "refused: EC2 does not list the instance under this run's tag (yet)")
            self.journal.fail(intent, error)
            self.unconfirmed[instance_id] = causes[instance_id]
            errors[instance_id] = error
        return Terminated(done, errors)

    def terminate_stray(self, record: InstanceRecord) -> None:
        """An instance under the run's tag that no intent launched: terminated, no journal row."""
        self._send("stray", {"record": record}, lambda: self.fleet.terminate([record.id]))

    def _took_stray(self, c: _Call) -> StrayTerminated:
        record, outcome = c.payload["record"], c.answer
        ok = not isinstance(outcome, BaseException) and bool(outcome.terminated or outcome.already_terminated)
        return StrayTerminated(record.id, record.type_name, ok)

    # -- the fleet against EC2 -------------------------------------------------------------
    def survey(self, force: bool = False, cause: str = "tick") -> bool:
        """One DescribeInstances by the run's tag off the loop (when ``force``, or a failed
        launch may have left an instance), unless one is in flight. Journaled like the other
        calls: an intent before, its outcome after (so the journal shows every EC2 call's
        span, e.g. an outage's). True when one was sent."""
        if self.describing() or not (force or self.suspect_launches):
            return False
        intent = self.journal.intend("describe", {}, cause)
        self._send("describe", {"intent": intent}, self.fleet.describe)
        return True

    def _took_describe(self, c: _Call) -> Surveyed:
        outcome = c.answer
        if isinstance(outcome, BaseException):
            outcome = DescribeOutcome(failure=_failure_of(outcome))
        if outcome.failure is not None:
            self.journal.fail(c.payload["intent"], outcome.failure.render())
            return Surveyed(None, c.sent_at_s, outcome.failure)
        self.journal.complete(c.payload["intent"], {"instances": len(outcome.instances)})
        for r in outcome.instances:
            self.states[r.id] = r.state
        return Surveyed(outcome.instances, c.sent_at_s)

    def gone_and_unknown(self, surveyed: Surveyed, alive: list[tuple[str, float]], known: set[str], grace_s: float,
                         in_flight: set[str]) -> tuple[list[tuple[str, str]], list[InstanceRecord]]:
        """Which of ``alive`` (id, launch time) a describe says are gone, with why, and the live
        instances under the run's tag that are not in ``known`` nor launched by a call still
        in flight (``in_flight``: their client tokens). An instance the describe does not list
        gets ``max(grace_s, UNLISTED_GRACE_S)`` from its launch to when the describe was sent
        if no describe ever listed it (describe is eventually consistent after a launch); one
        listed before and listed no more is gone at once."""
        from broker.shells.aws.fleet import TOKEN_TAG

        by_id = {r.id: r for r in surveyed.records or ()}
        out = []
        for instance_id, launched_at in alive:
            record = by_id.get(instance_id)
            if record is not None and not record.state.gone:
                continue
            if (record is None and instance_id not in self.states
                    and surveyed.sent_at_s - launched_at < max(grace_s, UNLISTED_GRACE_S)):
                continue
            state = "not listed by EC2" if record is None else record.state.value
            out.append((instance_id, f"instance {state}: terminated outside the broker"))
        unknown = [r for r in surveyed.records or () if r.id not in known and not r.state.gone
                   and r.tags.get(TOKEN_TAG) not in in_flight]
        return out, unknown


def _guarded(call: Callable[[], Any]) -> Any:
    """The call's result, or the exception it raised (a worker must always answer)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - handed back to the loop as a failure
        return exc


def _failure_of(exc: BaseException) -> AwsFailure:
    from broker.shells.aws.records import LaunchErrorKind

    return AwsFailure(LaunchErrorKind.UNKNOWN, type(exc).__name__, str(exc))


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
