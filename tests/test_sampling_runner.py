"""The live sampling phase on a real local agent: short ``sleep`` tasks with known durations.

Every test runs its own agent under ``tmp_path``; the ``run_dir`` fixture fails the test if
that agent, or any task it started, is still alive afterwards.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from broker.core.estimate import make_rule
from broker.core.model import Bag, PrivateNode, Task
from broker.shells.local_transport import local_agent_pid
from broker.shells.sampling_runner import (
    SampleProgress,
    SamplingFailed,
    SamplingInterrupted,
    attached_nodes,
    local_agent_dir,
    sample_bag,
)
from tests.processes import agent_task_processes

SEED = 20240611


def agent_processes(root: Path) -> list[int]:
    """Live processes started by an agent under ``root``."""
    return agent_task_processes(root.rglob("agents/*"))


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    yield path
    alive_agents = [str(d) for d in tmp_path.rglob("agents/*") if local_agent_pid(d) is not None]
    leaked = agent_processes(tmp_path)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not alive_agents, f"agents still running after the test: {alive_agents}"
    assert not leaked, f"task processes outlived the test: {leaked}"


def node(slots: int, speed: float = 1.0) -> PrivateNode:
    return PrivateNode(name="lab", slots=slots, speed=speed, local=True)


def logged_bag(durations_s: list[float], log: Path, timeout_s: float, setup: str | None = None) -> Bag:
    """Task i sleeps ``durations_s[i]`` then appends its id to ``log`` (so runs can be counted)."""
    tasks = tuple(
        Task(id=f"t{i:04d}", command=f'sleep {d} && echo "$BROKER_TASK" >> {log}') for i, d in enumerate(durations_s)
    )
    return Bag(tasks=tasks, timeout_s=timeout_s, setup=setup)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def run(bag: Bag, run_dir: Path, rule_name: str, eps: float, delta: float, slots: int, speed: float = 1.0,
        **options):
    rule = make_rule(rule_name, eps, delta, bag.timeout_s, n_tasks=len(bag))
    with attached_nodes([node(slots, speed)], run_dir, run_id="test") as (nodes, inbox):
        return sample_bag(bag, nodes, inbox, rule, np.random.default_rng(SEED), **options)


def test_bats_estimate_is_the_mean_of_the_first_draws_at_reference_speed(run_dir, tmp_path):
    sleeps = [0.05, 0.1, 0.15, 0.2] * 10  # true mean 0.125 wall s; the node's speed 2 doubles it
    bag = logged_bag(sleeps, tmp_path / "ran.log", timeout_s=1.0)
    outcome = run(bag, run_dir, "bats", eps=0.5, delta=0.1, slots=6, speed=2.0)

    estimate = outcome.estimate
    assert estimate.rule == "bats" and estimate.samples == 30 and estimate.capped == 0
    order = np.random.default_rng(SEED).permutation(len(bag))
    used = [t for t in outcome.tasks.values() if t.used]
    assert [t.task_id for t in used] == [bag.tasks[i].id for i in order[:30]]
    assert estimate.mean_ref_s == pytest.approx(np.mean([t.runtime_ref_s for t in used]), rel=1e-9)
    assert all(t.runtime_ref_s == pytest.approx(2.0 * t.runtime_s) for t in used)
    # Each runtime is measured around the whole task (its sleep, plus a process start-up that
    # a loaded machine can make as long as it likes: no upper bound is a fact of the code).
    sleep_of = {task.id: d for task, d in zip(bag.tasks, sleeps)}
    assert all(t.runtime_s >= sleep_of[t.task_id] for t in used)
    assert estimate.mean_ref_s >= 2.0 * np.mean([sleep_of[t.task_id] for t in used])
    assert sorted(lines(tmp_path / "ran.log")) == sorted(outcome.tasks)


def test_ebstop_reads_results_in_draw_order_keeps_the_extra_ones_and_runs_no_task_twice(run_dir, tmp_path):
    n_tasks, slots = 300, 8
    order = np.random.default_rng(SEED).permutation(n_tasks)
    # The k-th draw sleeps less than the draws before it in its window of `slots`: tasks
    # started together finish in the reverse of the order they were drawn.
    sleeps = [0.0] * n_tasks
    for k, index in enumerate(order):
        sleeps[index] = round(0.2 - 0.0125 * (k % slots), 4)
    log = tmp_path / "ran.log"
    bag = logged_bag(sleeps, log, timeout_s=0.25)
    rule = make_rule("ebstop", 0.5, 0.1, bag.timeout_s, n_tasks=len(bag))
    reports: list[tuple[SampleProgress, bool]] = []  # after each batch of results: progress, rule satisfied

    def watch(progress: SampleProgress) -> None:
        reports.append((progress, not rule.wants_more()))

    with capture_logs() as events, attached_nodes([node(slots)], run_dir, run_id="test") as (nodes, inbox):
        outcome = sample_bag(bag, nodes, inbox, rule, np.random.default_rng(SEED), drain_means=None,
                             on_progress=watch)

    estimate = outcome.estimate
    ran = lines(log)
    assert len(ran) == len(set(ran)), "a task ran twice"
    assert set(ran) == set(outcome.tasks), "every task that ran is reported, extra ones included"
    assert ran != [t.task_id for t in outcome.tasks.values()], "completion order should differ from draw order"

    in_draw_order = list(outcome.tasks.values())
    assert [t.draw for t in in_draw_order] == list(range(1, len(in_draw_order) + 1))
    assert [t.task_id for t in in_draw_order] == [bag.tasks[i].id for i in order[: len(in_draw_order)]]
    used = [t for t in in_draw_order if t.used]
    extra = [t for t in in_draw_order if not t.used]
    assert used == in_draw_order[: estimate.samples]
    # The batch of results that satisfied the rule found every slot busy (ebstop draws ahead);
    # the draws still running then were waited for (drain_means=None) and kept, not lost.
    # (How many were still running depends on how many results the loaded machine delivered
    # in that batch; that every one of them is kept does not.)
    stop = next(i for i, (_, satisfied) in enumerate(reports) if satisfied)
    before = reports[stop - 1][0].completed if stop else 0
    at_stop = reports[stop][0]
    assert at_stop.running + (at_stop.completed - before) == slots
    assert len(in_draw_order) == at_stop.completed + at_stop.running
    assert len(extra) == len(in_draw_order) - estimate.samples
    assert not outcome.cancelled

    replay = make_rule("ebstop", 0.5, 0.1, bag.timeout_s, n_tasks=len(bag))
    replay.feed_many(np.array(outcome.used_ref_s) / bag.timeout_s)
    assert not replay.wants_more()
    assert replay.estimate().mean_ref_s == pytest.approx(estimate.mean_ref_s, rel=1e-12)
    observed = float(np.mean(outcome.used_ref_s))
    assert abs(estimate.mean_ref_s - observed) <= 0.5 * observed

    done = [e for e in events if e["event"] == "sample.done"]
    assert len(done) == 1 and done[0]["samples"] == estimate.samples and done[0]["extra"] == len(extra)


def test_draws_still_running_when_the_rule_stops_are_cancelled_without_a_drain(run_dir, tmp_path):
    n_tasks, slots, quick = 200, 8, 5
    order = np.random.default_rng(SEED).permutation(n_tasks)
    # The first `quick` draws sleep 0.05 s: at speed 1000 that is 50 reference seconds, past
    # R_max, so each is Z = 1 however loaded the machine is, and ebstop stops after exactly
    # these five. Every later draw sleeps past the test: certainly still running at the stop.
    sleeps = [60.0] * n_tasks
    for index in order[:quick]:
        sleeps[index] = 0.05
    log = tmp_path / "ran.log"
    bag = logged_bag(sleeps, log, timeout_s=30.0)
    outcome = run(bag, run_dir, "ebstop", eps=0.5, delta=0.1, slots=slots, speed=1000.0, drain_means=0.0)

    first = [bag.tasks[i].id for i in order[:quick]]
    assert outcome.estimate.samples == quick and outcome.estimate.capped == quick
    assert list(outcome.tasks) == first and all(t.used for t in outcome.tasks.values())
    assert len(outcome.cancelled) >= slots - quick, "ebstop draws ahead: the other slots were busy when it stopped"
    drawn_later = [bag.tasks[i].id for i in order[quick : quick + len(outcome.cancelled)]]
    assert sorted(outcome.cancelled) == sorted(drawn_later)
    assert sorted(lines(log)) == sorted(first), "a cancelled draw ran to its end"


def test_timeouts_count_as_capped_samples(run_dir, tmp_path):
    bag = logged_bag([0.02, 5.0] * 16, tmp_path / "ran.log", timeout_s=0.3)
    with capture_logs() as events:
        outcome = run(bag, run_dir, "bats", eps=0.5, delta=0.1, slots=8)
    used = [t for t in outcome.tasks.values() if t.used]
    timed_out = [t for t in used if t.timed_out]
    assert timed_out and outcome.estimate.capped == len(timed_out)
    assert all(t.runtime_ref_s >= bag.timeout_s and not t.ok for t in timed_out)
    assert outcome.done_task_ids == {t.task_id for t in outcome.tasks.values() if not t.timed_out}
    capped = np.minimum([t.runtime_ref_s for t in used], bag.timeout_s)
    assert outcome.estimate.mean_ref_s == pytest.approx(float(np.mean(capped)))
    assert len([e for e in events if e["event"] == "sample.timeout"]) >= len(timed_out)


def test_failing_tasks_stop_sampling_naming_the_task_and_its_stderr(run_dir):
    failing = tuple(
        Task(id=f"t{i:02d}", command="echo 'cannot open input.dat' >&2; exit 3") for i in range(20)
    )
    bag = Bag(tasks=failing, timeout_s=10.0, retries=2)
    with pytest.raises(SamplingFailed) as info:
        run(bag, run_dir, "ebstop", eps=0.3, delta=0.1, slots=2)
    message = str(info.value)
    assert "3 sampled tasks failed" in message
    assert "exit code 3" in message and "cannot open input.dat" in message
    assert any(f"task t{i:02d}" in message for i in range(20))
    assert len(info.value.failures) == 3 and not info.value.tasks


def test_setup_runs_once_before_any_task_and_its_failure_stops_sampling(run_dir, tmp_path):
    log = tmp_path / "ran.log"
    bag = logged_bag([0.01] * 40, log, timeout_s=1.0, setup=f"echo SETUP >> {log}")
    outcome = run(bag, run_dir, "bats", eps=0.5, delta=0.1, slots=4)
    ran = lines(log)
    assert ran[0] == "SETUP" and ran.count("SETUP") == 1 and len(ran) == 1 + len(outcome.tasks)

    broken = Bag(tasks=bag.tasks, timeout_s=1.0, setup="echo 'no such package' >&2; exit 7")
    with pytest.raises(SamplingFailed) as info:
        run(broken, run_dir / "again", "bats", eps=0.5, delta=0.1, slots=4)
    assert "setup command failed" in str(info.value) and "no such package" in str(info.value)
    assert lines(log).count("SETUP") == 1 and len(lines(log)) == len(ran), "no task ran after a failed setup"


def test_an_interrupt_keeps_the_finished_draws_and_stops_the_agent(run_dir, tmp_path):
    bag = logged_bag([0.05] * 40 + [5.0] * 40, tmp_path / "ran.log", timeout_s=10.0)

    def interrupt_after_three(progress):
        if progress.completed >= 3:
            raise KeyboardInterrupt

    with pytest.raises(SamplingInterrupted) as info:
        run(bag, run_dir, "ebstop", eps=0.3, delta=0.1, slots=4, on_progress=interrupt_after_three)
    assert len(info.value.tasks) >= 3
    assert local_agent_pid(local_agent_dir(run_dir, "lab")) is None


def test_a_bag_smaller_than_the_sample_runs_whole_and_gives_its_exact_mean(run_dir, tmp_path):
    """Regression: a rule that used up the bag raised SamplingExhausted (exit 1 in `broker plan
    --sample`), though every runtime of the bag was then known."""
    bag = logged_bag([0.01] * 5 + [0.2] * 5, tmp_path / "ran.log", timeout_s=1.0)  # bats wants at least 30
    outcome = run(bag, run_dir, "bats", eps=0.5, delta=0.1, slots=4)
    assert sorted(outcome.tasks) == sorted(lines(tmp_path / "ran.log")) and len(outcome.tasks) == 10
    assert all(t.used for t in outcome.tasks.values())
    estimate = outcome.estimate
    assert estimate.exact and estimate.samples == 10 and "exact" in estimate.guarantee
    truth = np.mean([min(t.runtime_ref_s, 1.0) for t in outcome.tasks.values()])
    assert estimate.mean_ref_s == pytest.approx(truth)
