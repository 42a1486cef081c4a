"""``broker down`` input errors (its clean-up is tested end to end in test_dryrun.py)."""

from __future__ import annotations

from tests.test_dryrun import broker


def test_down_on_a_directory_without_a_journal_says_so(tmp_path):
    done = broker("down", str(tmp_path))
    assert done.returncode == 2
    assert f"no journal in {tmp_path}" in done.stderr


def test_down_without_run_dir_and_no_runs_names_the_problem(tmp_path):
    import subprocess
    import sys

    from tests.test_dryrun import REPO

    done = subprocess.run([sys.executable, "-m", "broker", "down"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 2
    assert "pass RUN_DIR" in done.stderr
