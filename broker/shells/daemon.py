"""The live shell moved to :mod:`broker.shells.run`; these names stay importable from here."""

from broker.shells.run import (  # noqa: F401
    SETUP_TASK,
    Daemon,
    DaemonOptions,
    PriorSamples,
    RunNodes,
    RunReport,
    SampledTask,
    SpendRequest,
    failure_reason,
)
