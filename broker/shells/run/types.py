"""What the run loop talks to and through: narrow protocols for EC2 and the nodes' agents,
the messages its inbox carries, and the data handed to and from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from broker.core.control.snapshot import Memory
from broker.shells.agent_client import AgentClient
from broker.shells.aws.records import DescribeOutcome, LaunchOutcome, Reconciliation, TerminateOutcome
from workers.protocol import Run

SETUP_TASK = "__setup__"


class Fleet(Protocol):
    """EC2 as the run uses it (:class:`~broker.shells.aws.Ec2Fleet`; moto in a dry run)."""

    def launch(self, type_name: str, count: int, *, client_token: str,
               max_price_per_hour: float | None = None) -> LaunchOutcome: ...

    def terminate(self, instance_ids: Iterable[str]) -> TerminateOutcome: ...

    def describe(self) -> DescribeOutcome: ...

    def reconcile(self, known_ids: Iterable[str]) -> Reconciliation: ...


class Nodes(Protocol):
    """Every node's agent, private or instance, by the node's id (:class:`RunNodes`)."""

    def attach(self, node: str, slots: int, expect: tuple[Run, ...] = ()) -> AgentClient: ...

    def attach_in_background(self, node: str, slots: int,
                             done: Callable[[AgentClient | None, BaseException | None], None]) -> bool:
        """Attach on another thread and call ``done`` after; False when this node is attached
        in the loop instead (a local agent is quick)."""
        ...

    def reattach(self, node: str, slots: int, client: AgentClient) -> None: ...

    def stop(self, node: str, client: AgentClient | None) -> None: ...

    def fetch(self, node: str, workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]: ...


# -- messages the scheduler's jobs and background attaches put on the inbox ------------------
@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class BootDone:
    instance_id: str


@dataclass(frozen=True, slots=True)
class Attached:
    """An instance's or a private node's agent attached in the background (``client``), or
    could not be (``error``); ``instance_id`` is the node's id either way."""

    instance_id: str
    client: AgentClient | None
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class AttachRetrying:
    """A private node's first try at start-up failed; it is tried again in the background."""

    node: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A private node's link reconnected in the background (``transport``, for its client to
    re-handshake over), or not within its grace (``error``)."""

    node: str
    transport: Any
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class ReleaseDue:
    instance_id: str
    version: int


# -- data in and out -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpendRequest:
    """What the first launch of a run would buy, for the user to confirm."""

    launches: tuple[tuple[str, int], ...]
    estimated_usd: float
    memory: Memory
    remaining: Any  # RemainingWork | None


@dataclass(frozen=True, slots=True)
class SampledTask:
    """A task ``broker plan --sample`` already ran to success (from its ``samples.json``)."""

    task: str
    node: str
    attempt: int
    draw: int
    runtime_s: float
    runtime_ref_s: float
    exit_code: int | None = 0


@dataclass(frozen=True, slots=True)
class PriorSamples:
    """What ``broker plan --sample`` learnt: its done tasks (not run again, their runtimes
    observed) and, when its stopping rule was met, the estimate that replaces the run's own
    sampling phase."""

    source: str
    done: tuple[SampledTask, ...]
    mean_ref_s: float | None = None
    sd_ref_s: float | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    run_dir: Path
    run_id: str
    dry_run: bool = True
    tick_s: float = 60.0  # run time between monitoring ticks
    poll_s: float = 0.05  # wall time the loop waits for a message
    seed: int = 0
    resume: bool = False  # rebuild the run from its journal instead of starting it
    on_stop: str = "release"  # on SIGINT/SIGTERM: "release" everything, or "leave" it running
    trace: Path | None = None  # append every ledger event and decision here (replay tests)
    # Queue-ahead (core/control/queue_ahead.py): agents hold queued work while the bag's mean
    # task runs under this many wall seconds (hiding the round trip to the loop); 0: never.
    queue_ahead_s: float = 2.0
