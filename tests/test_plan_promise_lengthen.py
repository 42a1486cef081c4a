"""The promise does not keep on an instance the controller lets go (issue 16).

Thesis LS (runtimes 2^U(0, 3) minutes) under a 4 h deadline, seed 12 of bench/promises.py,
at 1.68 h: eight c1.xlarge and a c1.medium paid to 3.15 h, one c1.xlarge released at 2.15 h,
a c1.medium to 2.65 h, the private xeon; 4,703 tasks left, the planning deadline at 4 h. The
work fits before the releases (a fluid end at 3.10 h; delivered 3.145 h, the xlarge let go
at 2.15 h). The forecast's shedding counts a slot's time less an end allowance and the work
with a keep margin, came out 1% short, and kept the first instance to leave on for another
hour: the promise said 3.01 h (90%: 2.99-3.04 h), and at 10% done LS's makespan was held in
85% of 20 runs, LS-boot's in 80%. The promise's view lengthens only when the work itself
does not fit. Here (a law of 3,500 LS runtimes): a median end of 3.12 h without lengthening,
3.12 h in the promise's view, 3.02 h in the controller's.
"""

import math

import numpy as np

from broker.core.billing import Billing
from broker.core.plan.promise import Machine, Pending, RuntimeLaw, forecast

H = 3600.0
NOW = 1.683 * H


def ls_fleet():
    def inst(speed, launched, release):
        return Machine(1, speed, NOW, release, 0.68, launched, Billing.hourly())

    return ([Machine(1, 10.0, NOW)] + [inst(5.0, 0.183 * H, 3.15 * H)] + [inst(20.0, 0.183 * H, 3.15 * H)] * 8
            + [inst(20.0, 0.183 * H, 2.15 * H), inst(5.0, NOW, 2.65 * H)])


def ls_law():
    x = 60.0 * 2.0 ** np.random.default_rng(12).uniform(0.0, 3.0, 3500)
    return RuntimeLaw.observed(x, [], 3600.0, fit_tail=True)


def median_end_h(**kw):
    f = forecast(ls_fleet(), ls_law(), Pending(4703), now_s=NOW, rng=np.random.default_rng(1), **kw)
    return f.makespan_quantile(0.5) / H, f.makespan_quantile(0.95) / H


def test_the_promise_keeps_no_instance_on_that_the_work_does_not_need():
    free, _ = median_end_h()  # every instance to its release, no shedding rule at all
    promised, _ = median_end_h(horizon_at_s=4 * H, keep_margin=0.01, end_allowance_s=300.0, bare_lengthen=True)
    assert math.isclose(promised, free, rel_tol=0.005), (promised, free)
    # the controller's own view (what its rules were tuned on) keeps the xlarge on
    kept, _ = median_end_h(horizon_at_s=4 * H, keep_margin=0.01, end_allowance_s=300.0)
    assert kept < free - 0.05, (kept, free)
