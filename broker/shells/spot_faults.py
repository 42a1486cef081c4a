"""The dry run's spot interruptions: ``BROKER_DRY_RUN_FAULTS=spot_interrupt:TYPE:RATE``.

moto launches spot instances but never takes one back. A :class:`SpotInterrupter` does it
the way EC2 does, on the run's clock:

1. every instance a RunInstances launches for the spot offer ``TYPE`` (``c5.xlarge@spot``;
   ``c5.xlarge`` means the same) draws its time to interruption from an exponential law
   of rate ``RATE`` per hour of run time (a Poisson process per instance, seeded by the run);
2. then the notice: the fake metadata service (:mod:`broker.shells.fake_imds`) serves the
   instance-action document with a time two minutes of run time ahead (``120 / K`` wall
   seconds at ``--time-scale K``), which the instance's local agent reads over IMDSv2;
3. two minutes of run time later the instance is terminated in moto, and from then on every
   DescribeInstances shows it ``terminated`` with ``StateReason`` ``Server.SpotInstanceTermination``
   (:meth:`broker.shells.faults.FaultInjector.mark_interrupted`), as EC2 shows an interrupted one.

Each notice and each termination is an injection (kind ``spot_interrupt``) told to the
injector's ``on_inject``: the dry run logs it as ``fault.injected``. An instance the broker
terminated first is dropped without either.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from broker.shells.fake_imds import FakeMetadata
from broker.shells.faults import FaultInjector, FaultKind, Injection

NOTICE_S = 120.0  # EC2's two-minute warning, in run seconds
_GONE = ("shutting-down", "terminated")


@dataclass
class _Doomed:
    instance_id: str
    offer: str
    notice_at_s: float  # run clock
    terminate_at_s: float | None = None  # set when the notice is posted


class SpotInterrupter:
    """Interrupts the spot instances of the ``rates`` offers (key -> interruptions per run hour)."""

    def __init__(self, rates: dict[str, float], injector: FaultInjector, client: Any, metadata: FakeMetadata,
                 clock: Callable[[], float], time_scale: float, seed: int = 0, poll_s: float = 0.05) -> None:
        self.rates = dict(rates)
        self.injector = injector
        self.client = client  # terminates in moto: a client without the injector's faults
        self.metadata = metadata
        self.clock = clock  # run seconds
        self.time_scale = time_scale
        self.poll_s = poll_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._doomed: dict[str, _Doomed] = {}
        self.spot_instances: set[str] = set()  # every spot instance launched (their agents watch)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-interrupter", daemon=True)

    def attach(self, launching_client: Any) -> "SpotInterrupter":
        """Learn every instance the run launches, from its RunInstances answers."""
        launching_client.meta.events.register("after-call.ec2.RunInstances", self._launched,
                                              unique_id=f"spot-interrupter-{id(self)}")
        self._adopt_running()
        self._thread.start()
        return self

    def _adopt_running(self) -> None:
        """The spot instances moto already runs (a resumed dry run: launched before the daemon
        died) are interrupted like new ones; each draws its time from now (the law is
        memoryless). Without this a resumed run's earlier spot instances were never taken back."""
        answer = self.client.describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
        self._launched({"Instances": [i for r in answer.get("Reservations", ()) for i in r.get("Instances", ())]})

    def close(self) -> None:
        self._stop.set()

    def is_spot(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self.spot_instances

    def _launched(self, parsed: Any = None, **_: Any) -> None:
        if not isinstance(parsed, dict) or "Error" in parsed:
            return
        now = self.clock()
        for instance in parsed.get("Instances", ()):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", ())}
            offer = tags.get("broker:offer") or instance.get("InstanceType", "")
            spot = instance.get("InstanceLifecycle") == "spot" or offer.endswith("@spot")
            instance_id = instance["InstanceId"]
            with self._lock:
                if spot:
                    self.spot_instances.add(instance_id)
                rate = self.rates.get(offer)
                if not spot or not rate or instance_id in self._doomed:
                    continue
                after_s = self._rng.expovariate(rate / 3600.0)
                self._doomed[instance_id] = _Doomed(instance_id, offer, now + after_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = self.clock()
            with self._lock:
                due = [d for d in self._doomed.values()
                       if (d.terminate_at_s is None and now >= d.notice_at_s)
                       or (d.terminate_at_s is not None and now >= d.terminate_at_s)]
            for d in due:
                try:
                    self._step(d, now)
                except Exception as exc:  # noqa: BLE001 - moto unreachable at the run's end: tried again
                    self._note(d, f"{d.instance_id}: not done yet ({type(exc).__name__}: {exc})", log=False)

    def _step(self, d: _Doomed, now: float) -> None:
        if d.terminate_at_s is None:
            if self._gone(d.instance_id):  # the broker released it first
                with self._lock:
                    self._doomed.pop(d.instance_id, None)
                return
            wall_left = NOTICE_S / self.time_scale
            self.metadata.post_notice(d.instance_id, time.time() + wall_left)
            d.terminate_at_s = now + NOTICE_S
            self._note(d, f"{d.instance_id} ({d.offer}): two-minute notice posted, terminated {NOTICE_S:g} s "
                          f"of run time later")
            return
        with self._lock:
            self._doomed.pop(d.instance_id, None)
        if self._gone(d.instance_id):
            return
        self.injector.mark_interrupted(d.instance_id)
        self.client.terminate_instances(InstanceIds=[d.instance_id])
        self._note(d, f"{d.instance_id} ({d.offer}): terminated by EC2 (Server.SpotInstanceTermination)")

    def _gone(self, instance_id: str) -> bool:
        answer = self.client.describe_instances(InstanceIds=[instance_id])
        states = [i["State"]["Name"] for r in answer["Reservations"] for i in r["Instances"]]
        return not states or states[0] in _GONE

    def _note(self, d: _Doomed, detail: str, log: bool = True) -> None:
        if log:
            self.injector._note(Injection(-1, "SpotInterruption", -1, FaultKind.SPOT_INTERRUPT, detail))


def spot_rates(entries: Sequence[Any]) -> dict[str, float]:
    """The ``spot_interrupt`` entries of a parsed spec: offer key -> rate per run hour."""
    return {e.target: e.rate for e in entries if e.kind is FaultKind.SPOT_INTERRUPT}
