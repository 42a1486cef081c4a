"""Runtime estimation (ALGORITHMS.md 2): how long the bag's tasks take.

* :mod:`.contract` - the stopping-rule interface and the :class:`Estimate` it returns;
* :mod:`.aa`, :mod:`.bats`, :mod:`.ebstop` - the rules; :mod:`.rules` - them by name, and
  their expected sample counts before sampling starts;
* :mod:`.sampling` - the sampling phase: random draws, draw-order feeding, extra results;
* :mod:`.survival` - online estimation of the remaining work (Kaplan-Meier, BaTS's tau_e);
* :mod:`.speed` - per-type speed by the ratio estimator;
* :mod:`.tools` and :mod:`.regression` - per-task estimates from tools, weighted by accuracy;
* :mod:`.workloads` - the runtime distributions of the sources (tests, bench, simulator).

Pure logic: no clock, no I/O; randomness comes from a numpy Generator passed in.
"""

from .contract import Estimate, Need, StoppingRule, census
from .rules import RULE_NAMES, RmaxSaving, expected_samples, make_rule, tighter_rmax_saving
from .sampling import BagExhausted, SamplingDriver

__all__ = [
    "RULE_NAMES",
    "BagExhausted",
    "Estimate",
    "Need",
    "RmaxSaving",
    "SamplingDriver",
    "StoppingRule",
    "census",
    "expected_samples",
    "make_rule",
    "tighter_rmax_saving",
]
