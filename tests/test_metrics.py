"""Prometheus metrics: scraped over real HTTP on 127.0.0.1 during a dry run, and the collector's
figures checked exactly on a hand-written journal."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.core.billing import Billing
from broker.core.model import Task
from broker.shells.journal import TASK_STATES, AttemptResult, Journal
from broker.shells.metrics import JournalCollector, interval_level, serve_metrics
from tests.run_fixtures import INVENTORY, TASKS

REPO = Path(__file__).resolve().parent.parent


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(name, sorted label items): value} of one scrape."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(scrape: dict, name: str, **labels) -> float | None:
    return scrape.get((name, tuple(sorted(labels.items()))))


def test_scrapes_during_a_dry_run_follow_its_progress(observed_dry_run):
    run = observed_dry_run
    scrapes = [samples(text) for text in run.scrapes]
    assert len(scrapes) >= 5, "the run should have been scraped several times"
    run_id = run.events("run.start")[0]["run_id"]
    during = [s for s in scrapes if value(s, "broker_run_info", run_id=run_id, state="running") == 1.0]
    assert during, "no scrape saw the run running"
    total = TASKS + 1
    done = []
    for s in during:
        assert sum(value(s, "broker_tasks", state=st) for st in TASK_STATES) == total
        done.append(value(s, "broker_tasks", state="done"))
    assert done == sorted(done), "done tasks never go down"
    assert any(0 < d < total for d in done), "no scrape caught the run midway"
    # An instance was seen running, under its type, and its hour was committed.
    types = {e["type"] for e in run.events("instance.launch")}
    assert any(value(s, "broker_instances", type=t, state="running") for s in during for t in types)
    assert any(value(s, "broker_committed_usd") > 0 for s in during)
    # The private node, by name (issue 18): its slots; up, with its agent's last word recorded.
    assert {value(s, "broker_node_slots", node="local") for s in during} - {None} == {2}
    assert any(value(s, "broker_node_state", node="local", state="up") == 1.0
               and value(s, "broker_node_last_heard_seconds", node="local") is not None for s in during)
    assert all(value(s, "broker_budget_left_usd") is None for s in during)  # a deadline goal has no budget
    # Once planned: the interval is ordered and its high end is the plan's makespan.
    planned = [s for s in during if value(s, "broker_planned_makespan_seconds") is not None]
    assert planned
    decided_means = {round(e["mean_ref_s"], 3) for e in run.events("plan.solved") + run.events("sample.done")
                     if e.get("mean_ref_s") is not None}
    promised = []
    for s in planned:
        low, mid, high = (value(s, "broker_predicted_makespan_seconds", bound=b) for b in ("low", "expected", "high"))
        assert 0 < low <= mid <= high == value(s, "broker_planned_makespan_seconds")
        assert value(s, "broker_predicted_makespan_confidence") == pytest.approx(0.90, abs=1e-3)
        # The gauge is the estimate the controller planned with (the last plan's mean, else the
        # sampling phase's), not a figure of its own: on a loaded machine the tasks run longer
        # than their 0.25 s sleep, and the estimate follows them.
        mean = value(s, "broker_mean_runtime_estimate_seconds")
        assert mean in decided_means
        # Each task sleeps 0.25 s at time scale 60: at least 15 reference seconds on the speed-1
        # local node (more on an instance of speed 1.5, and more when the machine is slow).
        assert mean > 12
        low, point, high = (value(s, "broker_promise_makespan_seconds", bound=b) for b in ("low", "point", "high"))
        if low is None:  # no promise yet: a bag without estimates gets its first after 30 runtimes
            continue
        promised.append(s)
        assert 0 < low <= point <= high  # the run's promise, with its interval
        assert value(s, "broker_promise_confidence") == 0.9
    assert promised, "no scrape saw the run's promise"
    assert max(value(s, "broker_samples") for s in during) == len(run.events("sample.done"))
    plans = run.events("plan.solved")
    assert value(planned[-1], "broker_planned_makespan_seconds") in {p["makespan_s"] for p in plans}


def _journal_with_a_plan(run_dir: Path, *, start: float) -> None:
    j = Journal.open(run_dir)
    j.create_run("r-metrics", goal_kind="budget", goal_value=2.0, budget_usd=2.0,
                 options={"time_scale": 1.0, "epoch_anchor_s": start}, at_s=start)
    j.add_tasks(Task(f"t{i}", "true") for i in range(5))
    j.task_started("t0", 1, "i-1", at_s=start + 10)
    j.task_finished("t0", 1, AttemptResult(0, 30.0), at_s=start + 40)
    j.task_started("t1", 1, "i-1", at_s=start + 40)
    j.record_launch("i-1", "c5.large", launched_at_s=start + 5, price_per_hour=0.5, billing=Billing.hourly(),
                    state="running")
    j.record_launch("i-2", "c5.large", launched_at_s=start + 5, price_per_hour=0.5, billing=Billing.hourly())
    promise = {"confidence": 0.9, "makespan_s": 950.0, "makespan_s_range": [900.0, 1100.0], "cost_usd": 1.0,
               "cost_usd_range": [0.9, 1.5]}
    j.record_plan(makespan_s=1000.0, cost_usd=1.0, fleet={"c5.large": 2}, chosen={"promise": promise},
                  reason="initial", at_s=start + 200)
    j.record_event("plan.solved", {"makespan_s": 1000.0, "cost_usd": 1.0, "work_ref_s": 300.0,
                                   "work_upper_ref_s": 400.0, "mean_ref_s": 30.0}, at_s=start + 200)
    j.close()


def test_collector_figures_on_a_known_journal(tmp_path):
    start = 1_000_000.0
    _journal_with_a_plan(tmp_path, start=start)
    collector = JournalCollector(tmp_path, now_s=lambda: start + 500)
    try:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        s = samples(generate_latest(registry).decode())
    finally:
        collector.close()
    assert value(s, "broker_run_info", run_id="r-metrics", state="running") == 1.0
    assert value(s, "broker_run_elapsed_seconds") == pytest.approx(500.0)
    assert value(s, "broker_tasks", state="done") == 1 and value(s, "broker_tasks", state="running") == 1
    assert value(s, "broker_tasks", state="pending") == 3
    assert value(s, "broker_instances", type="c5.large", state="running") == 1
    assert value(s, "broker_instances", type="c5.large", state="pending") == 1
    assert value(s, "broker_instances", type="c5.large", state="terminated") == 0
    assert value(s, "broker_committed_usd") == pytest.approx(1.0)  # two instances, one hour each at $0.50
    assert value(s, "broker_budget_usd") == 2.0 and value(s, "broker_budget_left_usd") == pytest.approx(1.0)
    # Planned at t = 200 for an end at 1000, on W_hi = 400 with W = 300: 800 s left scale with the work.
    assert value(s, "broker_predicted_makespan_seconds", bound="high") == 1000.0
    assert value(s, "broker_predicted_makespan_seconds", bound="expected") == pytest.approx(200 + 800 * 300 / 400)
    assert value(s, "broker_predicted_makespan_seconds", bound="low") == pytest.approx(200 + 800 * 200 / 400)
    assert value(s, "broker_mean_runtime_estimate_seconds") == 30.0
    # the promise standing: the last plan's
    assert [value(s, "broker_promise_makespan_seconds", bound=b) for b in ("low", "point", "high")] == [900, 950, 1100]
    assert [value(s, "broker_promise_cost_usd", bound=b) for b in ("low", "point", "high")] == [0.9, 1.0, 1.5]
    assert value(s, "broker_promise_confidence") == 0.9
    assert interval_level() == pytest.approx(math.erf(1.645 / math.sqrt(2)))


def test_server_answers_a_real_http_get_on_loopback_only(tmp_path):
    start = time.time() - 300
    _journal_with_a_plan(tmp_path, start=start)
    server = serve_metrics(tmp_path, 0)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.url, timeout=5) as response:
            text = response.read().decode()
        assert response.headers["Content-Type"].startswith("text/plain")
        s = samples(text)
        assert value(s, "broker_tasks", state="done") == 1
        assert 290 <= value(s, "broker_run_elapsed_seconds") < 400  # time scale 1: the wall clock
    finally:
        server.close()


def test_a_port_in_use_is_refused_before_any_run_is_recorded(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        run_dir = tmp_path / "run"
        proc = subprocess.run(
            [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", "--deadline", "10m", "--metrics-port",
             str(port), "--inventory", str(INVENTORY), str(REPO / "examples" / "sweep.yaml"), "--run-dir", str(run_dir)],
            cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert not (run_dir / "journal.sqlite").exists()
