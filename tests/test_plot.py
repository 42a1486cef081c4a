"""Plots are real PNG images: ``broker plan --plot`` (the front and the chosen point) and
``broker report --plot`` (adds the delivered point and utilization per type); without
matplotlib both refuse with the extra to install."""

from __future__ import annotations

import json
import re
import sqlite3
import struct
import sys
from pathlib import Path

import pytest

from broker.cli import main
from broker.cli.report import _first_front, build
from broker.shells.journal import Journal

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def journal_plan_made_s(run_dir: Path) -> float:
    """Run time at which the first plan was recorded."""
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        made = db.execute("SELECT created_at FROM plans ORDER BY seq LIMIT 1").fetchone()[0]
        options = json.loads(db.execute("SELECT options FROM run").fetchone()[0])
    finally:
        db.close()
    return made - options["epoch_anchor_s"]


def test_plan_plot_is_a_png_of_the_expected_size(tmp_path, capsys):
    png = tmp_path / "front.png"
    rc = main(["plan", "--inventory", str(REPO / "examples" / "thesis-catalogue.yaml"), "--tasks", "2000",
               "--mean-runtime", "17m", "--deadline", "2d", "--plot", str(png)])
    assert rc == 0, capsys.readouterr().err
    assert png_size(png) == (770, 495)
    assert png.stat().st_size > 10_000  # axes, a line, markers and a legend, not an empty canvas


def test_report_plot_is_a_png_with_the_front_re_solved(observed_dry_run, tmp_path, capsys):
    png = tmp_path / "report.png"
    assert main(["report", str(observed_dry_run.run_dir), "--plot", str(png)]) == 0
    assert png_size(png) == (1210, 495)
    assert png.stat().st_size > 15_000
    with Journal.open(observed_dry_run.run_dir, readonly=True) as journal:
        report = build(journal, observed_dry_run.run_dir)
    view, note = _first_front(report, observed_dry_run.run_dir)
    assert note is None and len(view.front) >= 2
    # Shifted to the run's start: every point ends after the first plan was made (after sampling).
    made_s = journal_plan_made_s(observed_dry_run.run_dir)
    assert made_s > 0
    assert all(r.makespan_s > made_s and r.cost_usd >= 0 for r in view.rows())
    missing = dict(report, inventory_path=str(tmp_path / "gone.yaml"))
    assert _first_front(missing, observed_dry_run.run_dir) == (None, f"front not drawn: inventory {tmp_path / 'gone.yaml'} not found")


@pytest.mark.parametrize("command", ["plan", "report"])
def test_without_matplotlib_the_plot_is_refused_with_the_extra_to_install(command, observed_dry_run, tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    png = tmp_path / "x.png"
    if command == "plan":
        argv = ["plan", "--inventory", str(REPO / "examples" / "thesis-catalogue.yaml"), "--tasks", "100",
                "--mean-runtime", "5m", "--theta", "1", "--plot", str(png)]
    else:
        argv = ["report", str(observed_dry_run.run_dir), "--plot", str(png)]
    assert main(argv) == 2
    assert "--plot needs matplotlib: pip install 'hybrid-broker[plot]'" in capsys.readouterr().err
    assert not png.exists()


def test_report_plot_puts_proposed_with_its_interval_and_delivered_on_the_first_plans_front(observed_dry_run):
    """The promise sits on the front it came from (the steps pass through it, so it cannot seem
    to beat the front), with its interval as error bars when the promise has one; the deadline
    line is where the deadline is, from the run's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from broker.cli.report import draw_report

    with Journal.open(observed_dry_run.run_dir, readonly=True) as journal:
        report = build(journal, observed_dry_run.run_dir)
    promise = report["promise"]
    report["promise"] = dict(promise, makespan_s_range=[0.9 * promise["makespan_s"], 1.2 * promise["makespan_s"]],
                             cost_usd_range=[0.8 * promise["cost_usd"], 1.1 * promise["cost_usd"]], confidence=0.9)
    fig, (ax, bars) = plt.subplots(1, 2)
    draw_report(ax, bars, report, observed_dry_run.run_dir)
    per = 60.0  # the run lasts minutes
    (errorbar,) = ax.containers[:1]
    assert errorbar.has_xerr and errorbar.has_yerr
    x, y = errorbar.lines[0].get_data()
    assert list(x) == pytest.approx([promise["makespan_s"] / per]) and list(y) == pytest.approx([promise["cost_usd"]])
    steps = ax.lines[0]
    points = list(zip(steps.get_xdata(), steps.get_ydata()))
    assert any(px == pytest.approx(promise["makespan_s"] / per) and py == pytest.approx(promise["cost_usd"])
               for px, py in points), "the proposed plan is not a point of the drawn front"
    deadline = [line for line in ax.lines if line.get_label().startswith("deadline")]
    assert list(deadline[0].get_xdata()) == pytest.approx([5.0, 5.0])  # the fixture's 5m, from the run's start
    assert any(line.get_label() == "delivered" for line in ax.lines)
    plt.close(fig)


def test_report_plot_draws_the_interval_of_the_promise_the_run_made(observed_dry_run, capsys):
    """Regression: a run's report drew the proposed point without error bars, and printed no
    `promised` line: a run's promise (its median and interval) sits in the plan's forecast,
    and the plot read only flat ranges, which no run's plan.solved event has."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from broker.cli.report import draw_report

    with Journal.open(observed_dry_run.run_dir, readonly=True) as journal:
        report = build(journal, observed_dry_run.run_dir)
    made = [f["promise"] for f in observed_dry_run.events("plan.solved") if f.get("promise")]
    assert made, "the run made no promise with an interval"
    interval = report["first_promise"]
    assert interval["makespan_s_range"] == made[0]["makespan_s_range"]
    assert interval["cost_usd_range"] == made[0]["cost_usd_range"]
    fig, (ax, bars) = plt.subplots(1, 2)
    draw_report(ax, bars, report, observed_dry_run.run_dir)
    per = 60.0  # the run lasts minutes
    bars_drawn = [c for c in ax.containers if getattr(c, "has_xerr", False)]
    assert bars_drawn, "no error bars on the report's front"
    # The bars span the promise's interval, on the front's axes (minutes from the run's start).
    spans = []
    for container in bars_drawn:
        for segments in container.lines[2]:
            for seg in segments.get_segments():
                spans.append((min(seg[:, 0]), max(seg[:, 0]), min(seg[:, 1]), max(seg[:, 1])))
    low, high = interval["makespan_s_range"]
    assert any(lo == pytest.approx(low / per) and hi == pytest.approx(high / per) for lo, hi, _, _ in spans), spans
    c_low, c_high = interval["cost_usd_range"]
    assert any(lo == pytest.approx(c_low) and hi == pytest.approx(c_high) for _, _, lo, hi in spans), spans
    plt.close(fig)
    assert main(["report", str(observed_dry_run.run_dir)]) == 0
    # in the words `broker status` and the run's console use for it
    first = next(f for f in observed_dry_run.events("plan.solved") if f.get("promise"))
    assert re.search(r"\(90%: \S+-\S+ \w+\), \$[\d.]+ \(90%: \$[\d.]+-\$[\d.]+\)", first["promise_text"])
    assert f"\n  promised  {first['promise_text']} (" in capsys.readouterr().out


def test_a_promise_that_does_not_hold_the_plans_point_is_drawn_at_its_median():
    """Error bars hung on a point outside their interval would misstate it: the promise is then
    its own marker (its median, with the interval), and the proposed point has no bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from broker.cli.report import _draw_proposed

    fig, ax = plt.subplots()
    interval = {"makespan_s": 600.0, "makespan_s_range": [540.0, 700.0], "cost_usd": 1.0,
                "cost_usd_range": [0.9, 1.2], "confidence": 0.9, "made_at_s": 300.0, "of_first_plan": False}
    _draw_proposed(ax, {"makespan_s": 480.0, "cost_usd": 1.0}, interval, 60.0)
    median, proposed = ax.containers
    assert median.has_xerr and median.has_yerr and not proposed.has_xerr and not proposed.has_yerr
    assert list(median.lines[0].get_xdata()) == [10.0] and list(proposed.lines[0].get_xdata()) == [8.0]
    assert "median" in median.get_label() and "first made 5m00s in" in proposed.get_label()
    plt.close(fig)
