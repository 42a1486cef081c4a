"""The live shell (``broker run``): an adapter between the world and the run ledger.

- :mod:`.loop`: the daemon's loop (events in, ledger, ``decide()``, actions out);
- :mod:`.attempts`: attempts and the agents' messages;
- :mod:`.nodes_mixin`: launches, boots, releases, the fleet against EC2;
- :mod:`.actuator`: EC2 calls off the loop (worker threads, answers on the inbox) with their
  intents, and the timers;
- :mod:`.sweep`: terminations confirmed by EC2, unknown instances under the run's tag adopted;
- :mod:`.resume`: a run rebuilt from its journal;
- :mod:`.report`: what the run delivered;
- :mod:`.nodes`: every node's agent behind one :class:`~.types.Nodes`;
- :mod:`.trace`: the ledger's events and the decisions, recorded and replayed;
- :mod:`.types`: the protocols, messages and data the loop uses.
"""

from .attempts import failure_reason
from .loop import Daemon
from .nodes import RunNodes
from .report import RunReport
from .types import SETUP_TASK, DaemonOptions, Fleet, Nodes, PriorSamples, SampledTask, SpendRequest

__all__ = ["SETUP_TASK", "Daemon", "DaemonOptions", "Fleet", "Nodes", "PriorSamples", "RunNodes", "RunReport",
           "SampledTask", "SpendRequest", "failure_reason"]
