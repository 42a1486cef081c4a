"""A run's figures, read from its journal: for Prometheus metrics, ``broker status`` and reports.

Decoupled from the daemon: :class:`JournalCollector` opens the run's journal read-only and
reads it afresh on every scrape, so a scrape sees exactly what ``broker status`` would and
can never disturb the run. ``broker run --metrics-port PORT`` serves it on 127.0.0.1 only
(:func:`serve_metrics`); metric names are listed in the README's "Metrics" section.

The predicted makespan's interval
---------------------------------
The controller plans on the remaining work at its upper confidence value
``W_hi = W + z * err`` (``z = 1.645``, ALGORITHMS.md), so the adopted plan's makespan is the
*high* end. Each ``plan.solved`` event also records the point value ``W`` and ``W_hi``; with
the fleet of the plan the time left scales with the work, so

    low      = t_plan + (M - t_plan) * max(0, 2W - W_hi) / W_hi
    expected = t_plan + (M - t_plan) * W / W_hi
    high     = M

where ``M`` is the plan's makespan from the run's start and ``t_plan`` the run time at which
it was made. ``[low, high]`` is the two-sided interval of level ``erf(z / sqrt 2)`` (90%)
under the normal approximation of the remaining work; it ignores boot delays and whole
billing units, which do not scale with the work.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from broker.shells.journal import INSTANCE_STATES, TASK_STATES, Journal, JournalError, Overview, RunRecord
from broker.shells.node_view import node_rows

# The controller's default z (ControllerConfig.confidence_z); the interval's level follows.
CONFIDENCE_Z = 1.645
METRICS_HOST = "127.0.0.1"


def interval_level(z: float = CONFIDENCE_Z) -> float:
    return math.erf(z / math.sqrt(2.0))


def run_now_s(run: RunRecord | None, wall_now_s: float) -> float:
    """Journal time "now" for a run seen from outside its process.

    The journal stores ``epoch_anchor + run time``; at time scale ``K`` run time passes ``K``
    times faster than the wall, so a running dry run's "now" is ahead of the wall clock. An
    ended run's now is its end.
    """
    if run is None:
        return wall_now_s
    if run.ended_at_s is not None:
        return run.ended_at_s
    scale = float(run.options.get("time_scale", 1.0) or 1.0)
    anchor = float(run.options.get("epoch_anchor_s", run.created_at_s))
    return anchor + scale * (wall_now_s - anchor)


@dataclass(frozen=True)
class Figures:
    """What a run looks like at ``now_s`` (journal time); run times in seconds from its start."""

    overview: Overview
    elapsed_s: float
    instances: dict[tuple[str, str], int]  # (type, state) -> count
    planned_makespan_s: float | None
    makespan_low_s: float | None
    makespan_expected_s: float | None
    mean_ref_s: float | None
    samples: int
    failures: dict[str, list[str]] = field(default_factory=dict)  # task -> errors, final failures only
    planned_cost_usd: float | None = None  # the last plan's cost, from the run's start
    # The first plan adopted: what the user was promised (and confirmed), as plain figures
    # (makespan_s, cost_usd; the promise's intervals when its event carries them).
    promise: dict[str, Any] | None = None
    nodes: tuple = ()  # the private nodes (broker.shells.node_view.node_rows)

    @property
    def run(self) -> RunRecord | None:
        return self.overview.run

    @property
    def budget_left_usd(self) -> float | None:
        budget = self.overview.status["budget_usd"]
        return None if budget is None else budget - self.overview.status["committed_usd"]

    def eta_interval_s(self) -> tuple[float, float, float] | None:
        """(low, expected, high) run time left until the predicted end; None without a plan."""
        if self.planned_makespan_s is None:
            return None
        low = self.makespan_low_s if self.makespan_low_s is not None else self.planned_makespan_s
        mid = self.makespan_expected_s if self.makespan_expected_s is not None else self.planned_makespan_s
        return (low - self.elapsed_s, mid - self.elapsed_s, self.planned_makespan_s - self.elapsed_s)


def anchor_s(run: RunRecord | None) -> float:
    if run is None:
        return 0.0
    return float(run.options.get("epoch_anchor_s", run.created_at_s))


def figures(journal: Journal, now_s: float) -> Figures:
    """Read the figures of the journal's run at journal time ``now_s``."""
    overview = journal.overview(now_s)
    start = anchor_s(overview.run)
    instances = Counter((i.type_name, i.state) for i in overview.fleet)
    planned = overview.last_plan.makespan_s if overview.last_plan is not None else None
    planned_usd = overview.last_plan.cost_usd if overview.last_plan is not None else None
    low = expected = mean = None
    plans = journal.goal_plans()  # made for the run's goal (a resume may have changed it)
    promise = promise_of(plans[0][2]) if plans else None
    if plans:
        at, _, f = plans[-1]
        makespan, point, upper = f.get("makespan_s"), f.get("work_ref_s"), f.get("work_upper_ref_s")
        mean = f.get("mean_ref_s")
        if f.get("cost_usd") is not None:
            planned_usd = f["cost_usd"]
        if makespan is not None and point is not None and upper:
            made_s = at - start
            left = max(0.0, makespan - made_s)
            low = made_s + left * max(0.0, 2 * point - upper) / upper
            expected = made_s + left * point / upper
            planned = makespan
    samples = journal.events("sample.done")
    if mean is None and samples:
        mean = samples[-1][2].get("mean_ref_s")
    failed_events = [f for _, _, f in journal.events("task.failed")]
    final = {f["task"] for f in failed_events if f.get("final")}
    failures: dict[str, list[str]] = {}
    for f in failed_events:  # every attempt's error, for the tasks that failed for good
        if f["task"] in final:
            failures.setdefault(f["task"], []).append(str(f.get("error")))
    return Figures(
        overview=overview,
        elapsed_s=max(0.0, now_s - start),
        instances=dict(instances),
        planned_makespan_s=planned,
        makespan_low_s=low,
        makespan_expected_s=expected,
        mean_ref_s=mean,
        samples=len(samples),
        failures=failures,
        planned_cost_usd=planned_usd,
        promise=promise,
        nodes=tuple(node_rows(journal, now_s, start)),
    )


# The fields of a promise (issue 16's ``promise`` object) that a plan.solved event may carry.
PROMISE_KEYS = ("makespan_s", "cost_usd", "makespan_s_range", "cost_usd_range", "confidence")


def promise_of(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The promise a ``plan.solved`` event made: the plan's figures (those of the plan table,
    the plan line, the launch question and the report's "proposed" column), with intervals
    only when the event has them flat. The nested ``promise`` is the Monte Carlo forecast
    (its median, not the plan's figure): it has gauges of its own (``_promise_gauges``)."""
    out = {k: fields[k] for k in PROMISE_KEYS if fields.get(k) is not None}
    return out if "makespan_s" in out or "cost_usd" in out else None


class JournalCollector:
    """A prometheus-client collector reading ``run_dir``'s journal (read-only) on each scrape.

    ``now_s`` gives the journal's "now" (the run clock's ``epoch_s`` inside the run's process);
    by default it is derived from the wall clock and the run's time scale.
    """

    def __init__(self, run_dir: str | Path, now_s: Callable[[], float] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._now = now_s
        self._journal: Journal | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._journal is not None:
                self._journal.close()
                self._journal = None

    def read(self) -> Figures:
        with self._lock:
            if self._journal is None:
                self._journal = Journal.open(self.run_dir, readonly=True)
            now = self._now() if self._now is not None else run_now_s(self._journal.run(), time.time())
            return figures(self._journal, now)

    def describe(self) -> list:
        return []  # no scrape at registration: the journal may not exist yet

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            fig = self.read()
        except JournalError:  # the run has not written its journal yet
            self.close()  # open it afresh on the next scrape
            fig = None
        if fig is None or fig.run is None:
            yield GaugeMetricFamily("broker_run_info", "the run this broker serves (value 1)", labels=["run_id", "state"])
            return
        run, status = fig.run, fig.overview.status
        info = GaugeMetricFamily("broker_run_info", "the run this broker serves (value 1)", labels=["run_id", "state"])
        if run is not None:
            info.add_metric([run.id, run.state], 1.0)
        yield info
        yield GaugeMetricFamily("broker_run_elapsed_seconds", "run time since the run started", value=fig.elapsed_s)
        tasks = GaugeMetricFamily("broker_tasks", "tasks by state", labels=["state"])
        for state in TASK_STATES:
            tasks.add_metric([state], fig.overview.task_states[state])
        yield tasks
        instances = GaugeMetricFamily("broker_instances", "EC2 instances by type and state", labels=["type", "state"])
        for type_name in sorted({t for t, _ in fig.instances}):
            for state in INSTANCE_STATES:
                instances.add_metric([type_name, state], fig.instances.get((type_name, state), 0))
        yield instances
        yield GaugeMetricFamily("broker_committed_usd", "committed spend: charged billing units so far plus "
                                "private nodes' cost", value=status["committed_usd"])
        if status["budget_usd"] is not None:
            yield GaugeMetricFamily("broker_budget_usd", "the run's budget", value=status["budget_usd"])
            yield GaugeMetricFamily("broker_budget_left_usd", "budget minus committed spend", value=fig.budget_left_usd)
        if fig.planned_makespan_s is not None:
            yield GaugeMetricFamily("broker_planned_makespan_seconds", "the adopted plan's makespan from the run's "
                                    "start (at the upper confidence value of the work)", value=fig.planned_makespan_s)
            predicted = GaugeMetricFamily(
                "broker_predicted_makespan_seconds",
                f"predicted makespan from the run's start; low and high bound a {interval_level():.0%} interval",
                labels=["bound"])
            for bound, value in (("low", fig.makespan_low_s), ("expected", fig.makespan_expected_s),
                                 ("high", fig.planned_makespan_s)):
                if value is not None:
                    predicted.add_metric([bound], value)
            yield predicted
            yield GaugeMetricFamily("broker_predicted_makespan_confidence", "level of the predicted makespan's "
                                    "interval", value=interval_level())
        if fig.planned_cost_usd is not None:
            yield GaugeMetricFamily("broker_planned_cost_usd", "the adopted plan's cost from the run's start",
                                    value=fig.planned_cost_usd)
        if fig.promise is not None:
            # The first plan: the figures the plan table, the launch question and the report's
            # "proposed" column show.
            for key, name in (("makespan_s", "broker_promised_makespan_seconds"), ("cost_usd", "broker_promised_cost_usd")):
                if fig.promise.get(key) is not None:
                    yield GaugeMetricFamily(name, "the first plan's (the promise's) "
                                            + ("makespan from the run's start" if key == "makespan_s" else "cost"),
                                            value=fig.promise[key])
        yield from _promise_gauges(fig)
        yield from _node_gauges(fig)
        if fig.mean_ref_s is not None:
            yield GaugeMetricFamily("broker_mean_runtime_estimate_seconds", "estimated mean task runtime on a "
                                    "reference slot (speed 1)", value=fig.mean_ref_s)
        yield GaugeMetricFamily("broker_samples", "tasks run as samples to learn runtimes", value=fig.samples)
        yield from self._spot_gauges(fig)

    def _spot_gauges(self, fig: Figures) -> Iterator[Any]:
        """Spot interruptions so far (broker.shells.spot_figures); none for a run without spot."""
        from prometheus_client.core import GaugeMetricFamily

        from broker.shells.spot_figures import spot_figures

        by_type: Counter = Counter()
        for inst in fig.overview.fleet:
            by_type[inst.type_name] += inst.committed_usd(fig.overview.now_s)
        with self._lock:
            spot = spot_figures(self._journal, self.run_dir, dict(by_type)) if self._journal is not None else None
        if spot is None:
            return
        for key, name, what in (("notices", "broker_spot_notices", "two-minute notices read by the agents"),
                                ("interruptions", "broker_spot_interruptions", "spot instances EC2 took back"),
                                ("attempts_interrupted", "broker_spot_attempts_interrupted",
                                 "attempts ended by a spot interruption (no failure: re-queued)"),
                                ("lost_work_s", "broker_spot_lost_work_seconds",
                                 "run time the interrupted attempts had run, thrown away"),
                                ("fallback_tasks", "broker_spot_fallback_tasks",
                                 "tasks interrupted on spot and done on an on-demand instance or a private node")):
            yield GaugeMetricFamily(name, what, value=spot[key])
        cost = GaugeMetricFamily("broker_market_cost_usd", "committed spend of the instances of each market",
                                 labels=["market"])
        cost.add_metric(["spot"], spot["spot_cost_usd"])
        cost.add_metric(["on-demand"], spot["on_demand_cost_usd"])
        yield cost


def _promise_gauges(fig: Figures) -> Iterator[Any]:
    """The current promise (the last plan's, broker.core.plan.promise): point and interval
    of the makespan from the run's start and of the total cost, and its confidence."""
    from prometheus_client.core import GaugeMetricFamily

    plan = fig.overview.last_plan
    promise = (plan.chosen or {}).get("promise") if plan is not None and isinstance(plan.chosen, dict) else None
    if not promise:
        return
    for name, key, what in (("broker_promise_makespan_seconds", "makespan_s", "promised makespan from the run's start"),
                            ("broker_promise_cost_usd", "cost_usd", "promised total cost")):
        gauge = GaugeMetricFamily(name, f"{what}: the point and the bounds of its interval", labels=["bound"])
        low, high = promise.get(f"{key}_range") or (None, None)
        for bound, value in (("low", low), ("point", promise.get(key)), ("high", high)):
            if value is not None:
                gauge.add_metric([bound], float(value))
        yield gauge
    yield GaugeMetricFamily("broker_promise_confidence", "the promise's confidence (1 - delta)",
                            value=float(promise["confidence"]))


def _node_gauges(fig: Figures) -> Iterator[Any]:
    """Each private node (:mod:`broker.shells.node_view`), labelled ``node``: its slots, the
    attempts it runs, its state (1 for the state it is in, 0 for the others) and the run
    time since its agent was last heard from (absent until it has been)."""
    from prometheus_client.core import GaugeMetricFamily

    from broker.shells.node_view import NODE_STATES

    if not fig.nodes:
        return
    slots = GaugeMetricFamily("broker_node_slots", "a private node's slots", labels=["node"])
    running = GaugeMetricFamily("broker_node_running", "attempts running on a private node", labels=["node"])
    state = GaugeMetricFamily("broker_node_state", "a private node's state (1: the one it is in)",
                              labels=["node", "state"])
    heard = GaugeMetricFamily("broker_node_last_heard_seconds", "run time since a private node's agent was "
                              "last heard from", labels=["node"])
    for n in fig.nodes:
        slots.add_metric([n["node"]], n["slots"])
        running.add_metric([n["node"]], n["running"])
        for s in NODE_STATES:
            state.add_metric([n["node"], s], 1.0 if n["state"] == s else 0.0)
        if n["last_heard_ago_s"] is not None:
            heard.add_metric([n["node"]], n["last_heard_ago_s"])
    yield from (slots, running, state, heard)


class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it and releases the journal."""

    def __init__(self, collector: JournalCollector, httpd: Any, thread: threading.Thread) -> None:
        self.collector = collector
        self._httpd = httpd
        self._thread = thread
        self.host, self.port = httpd.server_address[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
        self.collector.close()


class MetricsUnavailable(Exception):
    """prometheus-client is missing or the port cannot be bound; the message says which."""


def serve_metrics(run_dir: str | Path, port: int, *, now_s: Callable[[], float] | None = None,
                  host: str = METRICS_HOST) -> MetricsServer:
    """Serve ``run_dir``'s metrics at ``http://host:port/metrics`` (port 0: any free port)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise MetricsUnavailable("--metrics-port needs prometheus-client: pip install 'hybrid-broker[metrics]'") from None
    registry = CollectorRegistry(auto_describe=False)
    collector = JournalCollector(run_dir, now_s)
    registry.register(collector)
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsUnavailable(f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return MetricsServer(collector, httpd, thread)
