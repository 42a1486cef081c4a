"""``broker estimate``: replay a rule over a CSV of runtimes."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import structlog

from broker.cli import UsageError
from broker.cli import estimate as estimate_cli
from broker.config.errors import ConfigError


def _run(argv):
    parser = argparse.ArgumentParser()
    estimate_cli.register(parser.add_subparsers())
    args = parser.parse_args(["estimate", *argv])
    with structlog.testing.capture_logs() as logs:
        code = args.func(args)
    return code, logs


@pytest.fixture
def runtimes_csv(tmp_path):
    values = np.random.default_rng(0).normal(900, 150, 5000).clip(1)
    path = tmp_path / "runtimes.csv"
    path.write_text("task,runtime_s\n" + "".join(f"t{i},{v:.3f}\n" for i, v in enumerate(values)))
    return path, values


def test_json_is_one_object_with_the_contract_keys(runtimes_csv, capsys):
    path, values = runtimes_csv
    code, logs = _run(["--runtimes", str(path), "--rule", "ebstop", "--eps", "0.1", "--delta", "0.05", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out)  # the whole of stdout is one JSON object
    assert set(result) == {"rule", "samples", "mean_ref_s", "true_mean_ref_s", "eps", "delta", "exact"}
    assert result["exact"] is False
    assert result["true_mean_ref_s"] == pytest.approx(np.round(values, 3).mean())
    assert abs(result["mean_ref_s"] / result["true_mean_ref_s"] - 1) <= 0.1
    assert [e["event"] for e in logs] == ["sample.done"]


def test_seed_changes_the_draw_and_timeout_caps(runtimes_csv, capsys):
    path, values = runtimes_csv
    results = []
    for seed in ("1", "2"):
        _run(["--runtimes", str(path), "--rule", "ebstop", "--eps", "0.2", "--delta", "0.1",
              "--seed", seed, "--timeout", "15m", "--json"])
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["mean_ref_s"] != results[1]["mean_ref_s"]
    assert results[0]["true_mean_ref_s"] == pytest.approx(np.minimum(np.round(values, 3), 900).mean())


def test_human_summary_names_the_guarantee(runtimes_csv, capsys):
    path, _ = runtimes_csv
    code, _ = _run(["--runtimes", str(path), "--rule", "bats", "--eps", "0.1", "--delta", "0.05"])
    out = capsys.readouterr().out
    assert code == 0 and "rule bats" in out and "no guarantee" in out


def test_a_list_used_up_by_the_rule_gives_its_exact_mean(tmp_path, capsys):
    """Regression: a rule still wanting samples after the whole list exited 1, though the
    list's mean was then known exactly."""
    path = tmp_path / "few.csv"
    path.write_text("runtime_s\n" + "10\n" * 25 + "30\n" * 25)
    code, _ = _run(["--runtimes", str(path), "--rule", "aa", "--eps", "0.1", "--delta", "0.05", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["exact"] is True and document["samples"] == 50
    assert document["mean_ref_s"] == pytest.approx(20.0) == document["true_mean_ref_s"]
    code, _ = _run(["--runtimes", str(path), "--rule", "aa", "--eps", "0.1", "--delta", "0.05"])
    out = capsys.readouterr().out
    assert code == 0 and "every one was used, so the mean is exact" in out


def test_bad_rows_are_all_reported_with_their_lines(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("runtime_s\n12\nabc\n-3\n")
    with pytest.raises(ConfigError) as info:
        _run(["--runtimes", str(path), "--rule", "aa", "--eps", "0.1", "--delta", "0.05"])
    assert [(p.line, p.field) for p in info.value.problems] == [(3, "runtime_s"), (4, "runtime_s")]
    missing = tmp_path / "other.csv"
    missing.write_text("seconds\n12\n")
    with pytest.raises(ConfigError, match="no 'runtime_s' column"):
        _run(["--runtimes", str(missing), "--rule", "aa", "--eps", "0.1", "--delta", "0.05"])


@pytest.mark.parametrize("flags", [["--eps", "1.5", "--delta", "0.1"], ["--eps", "0.1", "--delta", "0.1", "--timeout", "soon"]])
def test_bad_flags_are_usage_errors(runtimes_csv, flags):
    path, _ = runtimes_csv
    with pytest.raises(UsageError):
        _run(["--runtimes", str(path), "--rule", "aa", *flags])
