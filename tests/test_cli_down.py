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


# -- the systemd unit's ExecStopPost: `broker down --unless-left` ---------------------------------
def _journal_run(run_dir, *, state="running", instance_state=None, events=(), dry_run=False):
    """A journal as a live run leaves it: one instance (when ``instance_state``), the given
    events at run times 0, 1, 2, ... and the run ``state``."""
    from broker.core.billing import Billing
    from broker.shells.journal import Journal

    with Journal.open(run_dir) as journal:
        journal.create_run("r-down", goal_kind="budget", goal_value=1.0, options={"dry_run": dry_run}, at_s=0.0)
        if instance_state is not None:
            seq = journal.intend("launch", {"type": "c5.large", "count": 1, "client_token": "r-down-1"}, "plan",
                                 at_s=0.0)
            journal.record_launch("i-0123", "c5.large", launched_at_s=0.0, price_per_hour=0.1,
                                  billing=Billing.custom(3600, 60), client_token="r-down-1-1", action_seq=seq)
            journal.complete(seq, {"instances": ["i-0123"]}, at_s=0.0)
            journal.record_instance_state("i-0123", instance_state, at_s=1.0)
        for k, name in enumerate(events):
            journal.record_event(name, {}, at_s=float(k))
        if state != "running":
            journal.finish_run(state, at_s=10.0)


def _no_aws_env(monkeypatch):
    """No credentials and no way to find any: a call to EC2 would fail (exit 1)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_down_unless_left_leaves_a_run_left_on_purpose_alone(tmp_path, monkeypatch):
    _no_aws_env(monkeypatch)
    _journal_run(tmp_path, instance_state="running", events=("run.start", "run.stop", "run.left"))
    done = broker("down", "--unless-left", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running on purpose" in done.stdout
    from tests.test_dryrun import query

    assert query(tmp_path, "SELECT state FROM run") == [("running",)]
    assert query(tmp_path, "SELECT state FROM instances") == [("running",)]


def test_down_unless_left_brings_down_a_left_run_that_was_resumed_since(tmp_path, monkeypatch):
    """A leave followed by a resume is no longer left: the unit's ExecStopPost after the
    resumed daemon died must release it (here: EC2 cannot be asked, so it says so, exit 1)."""
    _no_aws_env(monkeypatch)
    _journal_run(tmp_path, instance_state="running", events=("run.start", "run.left", "run.resume"))
    done = broker("down", "--unless-left", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "left running on purpose" not in done.stdout and "could not terminate i-0123" in done.stdout


def test_down_on_a_run_that_ended_cleanly_is_a_quick_no_op_without_ec2(tmp_path, monkeypatch):
    """Every instance terminated, nothing open: no EC2 call (there are no credentials, so one
    would fail), exit 0, journal untouched."""
    _no_aws_env(monkeypatch)
    _journal_run(tmp_path, state="finished", instance_state="terminated", events=("run.start", "run.done"))
    for flags in ((), ("--unless-left",)):
        done = broker("down", *flags, str(tmp_path))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "0 instance(s) terminated" in done.stdout and "nothing of it was left running" in done.stdout
    from tests.test_dryrun import query

    assert query(tmp_path, "SELECT count(*) FROM events WHERE name = 'run.down'") == [(0,)]


def test_down_on_an_ended_run_with_an_unconfirmed_instance_still_asks_ec2(tmp_path, monkeypatch):
    """The run ended (exit 1) with an instance EC2 never confirmed terminated: `down` (the
    unit's ExecStopPost) must try again, not call it clean."""
    _no_aws_env(monkeypatch)
    _journal_run(tmp_path, state="stopped", instance_state="terminating", events=("run.start", "run.done"))
    done = broker("down", "--unless-left", str(tmp_path))
    assert done.returncode == 1 and "could not terminate i-0123" in done.stdout, done.stdout + done.stderr
