"""``broker simulate``: the JSON object issue 4 specifies, CSV traces, every policy, goals,
exit status and usage errors."""

from __future__ import annotations

import json

import pytest

from broker.cli import main
from tests.test_plan_cli import INVENTORY  # a private node and two EC2 types

EC2_ONLY = """
aws:
  billing: hourly
  types:
    - {name: small, slots: 1, speed: 1, price: 0.08, limit: 3}
"""
KEYS = {"policy", "makespan_s", "cost_usd", "planned", "budget_usd", "deadline_s", "tasks", "samples",
        "instances", "sim_wall_s", "goal", "promise"}


@pytest.fixture()
def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return str(path)


def simulate_json(capsys, *args) -> tuple[int, dict, str]:
    rc = main(["simulate", *args, "--json"])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out), captured.err  # json.loads fails on anything but one document


def test_json_is_one_object_with_the_documented_keys(inventory, capsys):
    rc, obj, _ = simulate_json(capsys, "--inventory", inventory, "--workload", "short", "--tasks", "60",
                               "--deadline", "2h", "--seed", "3")
    assert rc == 0
    assert KEYS <= set(obj) and set(obj) - KEYS == set()
    assert set(obj["planned"]) == {"makespan_s", "cost_usd"}
    assert {"total", "done", "left"} <= set(obj["tasks"])
    assert set(obj["instances"]) == {"launched", "max_concurrent"}
    assert obj["policy"] == "broker"
    assert obj["tasks"]["total"] == obj["tasks"]["done"] == 60 and obj["tasks"]["left"] == 0
    assert obj["deadline_s"] == 7200.0 and obj["budget_usd"] is None  # null where no goal was given
    assert obj["planned"]["makespan_s"] <= 7200.0 and obj["makespan_s"] <= 7200.0
    assert obj["cost_usd"] > 0 and obj["sim_wall_s"] >= 0
    assert obj["instances"]["max_concurrent"] <= obj["instances"]["launched"] <= 5
    p = obj["promise"]  # the first promise, next to what was delivered
    assert set(p) == {"confidence", "makespan_s", "makespan_s_range", "cost_usd", "cost_usd_range"}
    assert p["confidence"] == 0.9
    assert p["makespan_s_range"][0] <= p["makespan_s"] <= p["makespan_s_range"][1]
    assert p["cost_usd_range"][0] <= p["cost_usd"] <= p["cost_usd_range"][1]


def test_the_same_seed_gives_the_same_object(inventory, capsys):
    args = ("--inventory", inventory, "--workload", "mixture", "--tasks", "80", "--budget", "1.5", "--seed", "7")
    _, a, _ = simulate_json(capsys, *args)
    _, b, _ = simulate_json(capsys, *args)
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b
    assert a["budget_usd"] == 1.5 and a["deadline_s"] is None
    assert a["cost_usd"] <= 1.5 + 1e-9


@pytest.mark.parametrize("policy", ["broker", "list", "rr", "bats", "firstfit", "1vm4all", "autoscale-idle", "adaptive",
                                    "batch", "static", "panda"])
def test_every_policy_finishes_a_small_bag(inventory, capsys, policy):
    extra = ["--eta", "2"] if policy == "list" else []
    rc, obj, _ = simulate_json(capsys, "--inventory", inventory, "--workload", "short", "--tasks", "40",
                               "--policy", policy, *extra, "--seed", "1")
    assert rc == 0
    assert obj["policy"] == policy
    assert obj["tasks"]["done"] == 40 and obj["makespan_s"] > 0
    if policy != "broker":
        assert obj["planned"] == {"makespan_s": None, "cost_usd": None}


def test_a_runtime_trace_with_estimates(inventory, tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    rows = [(60.0 * (1 + k % 5), 60.0 * (1 + k % 5) * 1.1) for k in range(30)]
    trace.write_text("runtime_s,estimate_s\n" + "".join(f"{r},{e}\n" for r, e in rows))
    rc, obj, _ = simulate_json(capsys, "--inventory", inventory, "--runtimes", str(trace), "--point", "1")
    assert rc == 0
    assert obj["tasks"]["total"] == obj["tasks"]["done"] == 30
    # the whole trace's work done, at least, within the time the fastest machines need for it
    assert obj["makespan_s"] >= sum(r for r, _ in rows) / (2 * 2 + 3 * 1 + 2 * 2 * 4)


def test_human_output_names_the_policy_and_the_tasks(inventory, capsys):
    rc = main(["simulate", "--inventory", inventory, "--workload", "short", "--tasks", "20", "--theta", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("policy broker: 20/20 tasks in ")
    assert "planned: " in out and "instances launched " in out


def test_a_budget_that_buys_too_little_leaves_tasks_and_exits_1(tmp_path, capsys):
    path = tmp_path / "ec2.yaml"
    path.write_text(EC2_ONLY)  # no private node: what the budget cannot buy stays undone
    rc, obj, _ = simulate_json(capsys, "--inventory", str(path), "--workload", "long", "--tasks", "200",
                               "--budget", "0.2", "--seed", "2")
    assert rc == 1
    assert obj["tasks"]["left"] > 0 and obj["tasks"]["done"] + obj["tasks"]["left"] == 200
    assert obj["cost_usd"] <= 0.2 + 1e-9


@pytest.mark.parametrize("args, message", [
    (["--workload", "short", "--policy", "list"], "needs --eta"),
    (["--workload", "no-such-workload.yaml"], "no-such-workload.yaml"),
    (["--workload", "short", "--tick", "soon"], "--tick"),
    (["--workload", "short", "--deadline", "0s"], "--deadline"),
])
def test_usage_errors_exit_2_and_say_what_is_wrong(inventory, capsys, args, message):
    rc = main(["simulate", "--inventory", inventory, *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err


def test_a_trace_without_a_runtime_column_is_refused(inventory, tmp_path, capsys):
    trace = tmp_path / "bad.csv"
    trace.write_text("seconds\n12\n")
    rc = main(["simulate", "--inventory", inventory, "--runtimes", str(trace)])
    assert rc == 2
    assert "needs a 'runtime_s' column" in capsys.readouterr().err


def test_progress_goes_to_stderr_as_events_and_leaves_stdout_one_object(inventory, capsys):
    rc, obj, err = simulate_json(capsys, "--inventory", inventory, "--workload", "short", "--tasks", "200",
                                 "--deadline", "3h", "--seed", "4")
    assert rc == 0 and obj["tasks"]["done"] == 200
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    progress = [e for e in events if e["event"] == "sim.progress"]
    assert 3 <= len(progress) <= 9  # one per tenth of the bag crossed before the end
    done = [e["done"] for e in progress]
    assert done == sorted(done) and all(0 < d < 200 for d in done)
    assert len({10 * d // 200 for d in done}) == len(done)  # never twice in one tenth
    assert all(e["total"] == 200 and e["committed_usd"] >= 0 for e in progress)
    virtual = [e["virtual_s"] for e in progress]
    assert virtual == sorted(virtual) and virtual[-1] <= obj["makespan_s"]


class _Terminal:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_on_a_terminal_progress_is_a_live_bar_redrawn_at_most_five_times_a_second():
    from broker.cli.simulate import ProgressView
    from broker.sim.engine import SimProgress

    clock = iter([0.0, 0.1, 0.3, 0.35, 0.6]).__next__
    term = _Terminal()
    view = ProgressView(stream=term, clock=clock)
    drawn = []
    update = view.board.update
    view.board.update = lambda key, **kw: (drawn.append(kw["count"]), update(key, **kw))
    for done in (10, 20, 400, 410, 999):
        view(SimProgress(60.0 * done, done, 1000, done / 100))
    view.close()
    assert drawn == ["10/1,000", "400/1,000", "999/1,000"]  # 0.1 s and 0.35 s skipped
    last = term.text.rsplit("\r", 1)[-1]
    assert "simulating" in last and "999/1,000 16h39m of virtual time, $9.99 committed" in last
    assert "━" in last  # rich's bar
    assert term.text.endswith("\n") or term.text.endswith("\x1b[?25h")


def test_a_missed_deadline_exits_1_and_says_by_how_much(inventory, capsys):
    """Regression: a simulated run that finished every task after its deadline exited 0."""
    rc, obj, _ = simulate_json(capsys, "--inventory", inventory, "--workload", "long", "--tasks", "40",
                               "--deadline", "20m", "--seed", "1")
    assert obj["tasks"]["left"] == 0 and obj["makespan_s"] > 1200.0  # every task done, late
    assert rc == 1
    assert obj["goal"]["met"] is False and obj["goal"]["summary"].startswith("deadline 20m00s missed by ")
    rc = main(["simulate", "--inventory", inventory, "--workload", "long", "--tasks", "40", "--deadline", "20m",
               "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "deadline 20m00s missed by " in out


def test_confidence_sets_the_promise_and_bad_values_are_refused(inventory, capsys):
    rc, obj, _ = simulate_json(capsys, "--inventory", inventory, "--workload", "short", "--tasks", "60",
                               "--deadline", "2h", "--seed", "3", "--confidence", "0.5")
    assert obj["promise"]["confidence"] == 0.5
    rc = main(["simulate", "--inventory", inventory, "--workload", "short", "--deadline", "2h", "--confidence", "1"])
    assert rc == 2
    assert "--confidence: must lie strictly between 0 and 1" in capsys.readouterr().err
