"""A dry run with spot interruptions (issue 21, Must show): every task done exactly once, no
instance left running, the report counts the interruptions, and the fault really fired.

The real ``broker run --dry-run`` runs in a subprocess with
``BROKER_DRY_RUN_FAULTS=spot_interrupt:c5.large:RATE``: moto launches the spot instances,
the fault layer posts each one's two-minute notice on a fake IMDSv2 endpoint on 127.0.0.1,
the instance's local agent reads it there and tells the daemon, and the instance is
terminated in moto two minutes of run time later (broker/shells/spot_faults.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from broker.cli.verdict import late_but_done
from broker.shells.events import problems
from tests.test_daemon_faults import REPO, _env, assert_ec2_matches_the_journal, events
from tests.test_dryrun import query
from tests.test_resume import assert_every_task_done_once, assert_nothing_left, run_dir  # noqa: F401 - fixture

INVENTORY = """\
aws:
  region: us-east-1
  billing: hourly
  types:
    - {name: c5.large, slots: 2, speed: 1.0, price: 0.085, limit: 3, boot: 3s}
    - {name: c5.large, market: spot, slots: 2, speed: 1.0, price: 0.03, limit: 3, boot: 3s,
       interruptions_per_hour: 0.05}
"""
# Tasks of 120-150 s of run time (2-2.5 wall s at scale 60): as long as the notice or longer,
# so one started shortly before a notice cannot end in time and is re-queued.
BAG = """\
command: "python3 -c 'import time; time.sleep({t}); print({k})'"
sweep:
  t: [2.0, 2.5]
  k: [1, 2, 3, 4]
timeout: 60s
retries: 2
"""
TASKS = 8
SCALE = 60.0
# 40 interruptions an hour per spot instance: the first spot instance, which runs the bag's
# first ~10 minutes of run time, gets its notice with probability 1 - e^-6.7 (0.999), so the
# fault fires in all but one run in a thousand. (At 120 an hour the run thrashes: the
# planner, not yet interruption-aware, keeps launching spot for tasks barred from it.)
FAULTS = "spot_interrupt:c5.large:40"


def broker(*args: str, faults: str | None = None, keep_moto: bool = False, timeout_s: float = 300.0):
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s, env=_env(faults, keep_moto))


@pytest.mark.slow
def test_a_dry_run_with_spot_interruptions_finishes_every_task_once_and_reports_them(tmp_path, run_dir):
    inv, bag = tmp_path / "inv.yaml", tmp_path / "bag.yaml"
    inv.write_text(INVENTORY)
    bag.write_text(BAG)
    done = broker("run", "--dry-run", "--yes", "--deadline", "2h", "--tick", "60s", "--time-scale", f"{SCALE:g}",
                  "--inventory", str(inv), str(bag), "--run-dir", str(run_dir), faults=FAULTS, keep_moto=True)
    # the deadline is incidental here: the planner is not interruption-aware yet (h-spotplan)
    assert done.returncode == 0 or late_but_done(done.stdout), done.stdout[-3000:] + done.stderr[-3000:]

    # The fault fired: notices posted and instances terminated, by the injector's own log.
    injected = [e for e in events(run_dir, "fault.injected") if e["kind"] == "spot_interrupt"]
    noticed = [e for e in injected if "notice posted" in e["detail"]]
    taken = [e for e in injected if "terminated by EC2" in e["detail"]]
    assert noticed and taken, injected
    # The agents read the notices from the fake metadata endpoint and the daemon heard them.
    notices = events(run_dir, "instance.interruption_notice")
    assert notices and {e["instance_id"] for e in notices} <= {e["detail"].split()[0] for e in noticed}
    interrupted = events(run_dir, "instance.interrupted")
    assert interrupted and {e["instance_id"] for e in interrupted} <= {e["detail"].split()[0] for e in taken}

    # Every line, the new spot events included, is in the catalogue with its fields.
    assert [(e["event"], p) for e in events(run_dir) for p in problems(e, in_run=True)] == []

    # Every task exactly once; nothing running, nothing left in EC2 or on this machine.
    assert_every_task_done_once(run_dir, TASKS)
    assert_nothing_left(run_dir)
    assert_ec2_matches_the_journal(run_dir)  # every instance moto holds is terminated
    # Interrupted attempts are no failures of their tasks.
    assert query(run_dir, "SELECT sum(failures) FROM tasks") == [(0,)]
    assert not events(run_dir, "task.failed")
    attempts_interrupted = query(run_dir, "SELECT count(*) FROM attempts WHERE outcome = 'interrupted'")[0][0]
    assert attempts_interrupted == len(events(run_dir, "task.interrupted"))

    # The report counts them (JSON and text), as do status and the daemon's own report.
    report = json.loads(broker("report", "--json", str(run_dir)).stdout)
    spot = report["spot"]
    assert spot["interruptions"] == len(interrupted) >= 1
    assert spot["notices"] == len(notices) >= 1
    assert spot["attempts_interrupted"] == attempts_interrupted
    assert spot["spot_instances"] == query(run_dir, "SELECT count(*) FROM instances WHERE type = 'c5.large@spot'")[0][0]
    text = broker("report", str(run_dir)).stdout
    assert f"spot: {len(interrupted)} interruption(s)" in text
    status = json.loads(broker("status", "--json", str(run_dir)).stdout)
    assert status["spot"] == spot
