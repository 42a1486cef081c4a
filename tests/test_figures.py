"""One set of figures everywhere: the plan table's chosen row, the plan line, the launch
question, the report's "proposed" column and the metrics show the same makespan and cost for
the run's first plan (all from the run's start, durations human except in JSON)."""

from __future__ import annotations

import re

from broker.cli import main
from broker.core.units import format_duration


def _money(text: str) -> float:
    return float(text.replace(",", ""))


def test_table_plan_line_question_report_and_metrics_agree(observed_dry_run, capsys):
    out = observed_dry_run.stdout
    chosen = [line for line in out.splitlines() if line.startswith("*  ")]
    assert len(chosen) == 1, out
    cells = chosen[0].split()
    row_makespan, row_cost = cells[2], _money(cells[3].lstrip("$"))
    plan = re.search(r"^plan: makespan (\S+) from the run start \(run time\), cost \$([\d,.]+)", out, re.M)
    assert plan, out
    assert plan.group(1) == row_makespan and _money(plan.group(2)) == row_cost
    question = re.search(r"^Launch \d+ instances? \(.*\); the plan costs ~\$([\d,.]+) in all\?", out, re.M)
    assert question and _money(question.group(1)) == row_cost, out
    first = observed_dry_run.events("plan.solved")[0]
    assert format_duration(first["makespan_s"]) == row_makespan and round(first["cost_usd"], 2) == row_cost
    assert main(["report", str(observed_dry_run.run_dir)]) == 0
    report = capsys.readouterr().out
    proposed = re.search(r"^\s+makespan\s+(\S+)\s+\S+", report, re.M).group(1)
    cost = re.search(r"^\s+cost\s+\$([\d,.]+)", report, re.M).group(1)
    assert proposed == row_makespan and _money(cost) == row_cost
    promised = {}
    for line in observed_dry_run.scrapes[-1].splitlines():
        for name in ("broker_promised_makespan_seconds", "broker_promised_cost_usd"):
            if line.startswith(name + " "):
                promised[name] = float(line.split()[1])
    assert format_duration(promised["broker_promised_makespan_seconds"]) == row_makespan
    assert round(promised["broker_promised_cost_usd"], 2) == row_cost


def test_status_shows_the_promise_now_with_its_interval_and_the_first_as_the_others(observed_dry_run, capsys):
    """`broker status` (human) shows the promise standing now, point and interval, and the first
    one with the figures of the plan table's chosen row (issue 19, items 3-4)."""
    out = observed_dry_run.stdout
    cells = [line for line in out.splitlines() if line.startswith("*  ")][0].split()
    row_makespan, row_cost = cells[2], _money(cells[3].lstrip("$"))
    assert main(["status", str(observed_dry_run.run_dir)]) == 0
    status = capsys.readouterr().out
    first = re.search(r"^\s+first: makespan (\S+), cost \$([\d,.]+)", status, re.M)
    assert first, status
    assert first.group(1).rstrip(",") == row_makespan and _money(first.group(2)) == row_cost
    last = observed_dry_run.events("plan.solved")[-1]
    promise = re.search(r"^promise (.*), by plan #(\d+)", status, re.M)
    if last.get("promise_text"):
        assert promise and promise.group(1) == last["promise_text"], status
        assert re.search(r"\(90%: \S+-\S+ \w+\), \$[\d,.]+ \(90%: \$[\d,.]+-\$[\d,.]+\)", promise.group(1)), status
    else:
        assert promise is None and "promise no interval yet" in status
