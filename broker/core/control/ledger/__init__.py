"""The run ledger (see :mod:`.ledger`): one owner of a run's state for the simulator, the
daemon and resume."""

from .ledger import Ledger, launch_cost_usd, planned_life_s, private_cost_usd
from .records import (
    LATE_READY_S,
    Attempt,
    Ended,
    Followup,
    NodeQuarantined,
    NodeRecord,
    Quarantine,
    Requeue,
)
from .spot import SpotCounts
from .resume import AttemptRow, InstanceRow, JournalRows, Restored, TaskRow, restore, restore_instance, resume_release

__all__ = [
    "LATE_READY_S", "Attempt", "AttemptRow", "Ended", "Followup", "InstanceRow", "JournalRows", "Ledger",
    "NodeQuarantined", "NodeRecord", "Quarantine", "Requeue", "Restored", "SpotCounts", "TaskRow", "launch_cost_usd",
    "planned_life_s", "private_cost_usd", "restore", "restore_instance", "resume_release",
]
