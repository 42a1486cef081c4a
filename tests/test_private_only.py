"""Private-only runs need nothing of AWS (issue 18, item 1).

A live run on an inventory of private nodes only (no ``aws`` section) runs, is left
(``--on-stop leave``), resumes and is brought ``down`` with no AWS credentials, no AWS
configuration and no route out of the machine: everything runs inside ``unshare -n`` (a
network namespace holding only its own loopback), with a private node served by a real
sshd inside it. Before the fix the run died with ``NoRegionError`` and ``down`` printed
"1 FAILED (NoCredentialsError)" and exited 1.

Also: ``types`` listed but a budget that cannot pay a billing unit asks nothing of AWS;
``types`` listed without the fields renting takes runs on the private nodes with a warning,
and a plan that wants an instance is told what is missing without a request leaving.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_dryrun import REPO

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _no_aws_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), AWS_CONFIG_FILE=str(home / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(home / "no-aws-credentials"), AWS_EC2_METADATA_DISABLED="true")
    return env


def _require_unshare() -> None:
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode == 0:
        return
    reason = f"`unshare -n` does not work here: {probe.stderr.strip()}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the no-network test, but {reason}", pytrace=False)
    pytest.skip(reason)


def _done(run_dir: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return 0
    try:
        return db.execute("SELECT count(*) FROM tasks WHERE state = 'done'").fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        db.close()


def _agent_processes(*roots: Path) -> list[int]:
    """Live agents (``agent.py`` with a state dir under one of ``roots`` on its command line)
    and tasks (``BROKER_AGENT_DIR`` under one of them in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        under = [os.fsencode(str(r)) for r in roots]
        task = any(v.startswith(b"BROKER_AGENT_DIR=") and any(u in v for u in under) for v in environ)
        agent = b"agent.py" in cmdline and any(u in cmdline for u in under)
        if state != "Z" and (task or agent):
            found.append(int(entry.name))
    return found


def drive(base: Path) -> dict:
    """Inside ``unshare -n``: bring loopback up, start an sshd, run / leave / resume / down."""
    from tests.sshd import running_sshd

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    home = base / "home"
    home.mkdir()
    env = _no_aws_env(home)
    out: dict = {}
    with running_sshd(base / "sshd") as server:
        # Relative paths everywhere: `broker down` from another directory must still find them.
        key, known = (os.path.relpath(p, base) for p in (server.client_key_path, server.known_hosts_path))
        (base / "inventory.yaml").write_text(
            "private:\n"
            f"  - {{name: lab, host: 127.0.0.1, port: {server.port}, user: {server.user}, "
            f"key: {key}, known_hosts: {known}, slots: 2}}\n"
            "  - {name: me, local: true, slots: 1}\n")
        (base / "bag.yaml").write_text('command: "sleep 0.4; echo {i}"\nsweep: {i: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n'
                                       "timeout: 30s\nretries: 0\n")
        run_dir = base / "run"
        argv = [sys.executable, "-m", "broker", "run", "--yes", "--inventory", "inventory.yaml", "bag.yaml",
                "--run-dir", "run", "--on-stop", "leave"]
        first = subprocess.Popen(argv, env=env, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while _done(run_dir) < 3 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)
        stdout, stderr = first.communicate(timeout=120)
        out["first"] = {"rc": first.returncode, "stdout": stdout, "stderr": stderr, "done": _done(run_dir)}
        again = subprocess.run(argv, env=env, cwd=base, capture_output=True, text=True, timeout=300)
        out["resume"] = {"rc": again.returncode, "stdout": again.stdout, "stderr": again.stderr}
        elsewhere = base / "elsewhere"
        elsewhere.mkdir()
        down = subprocess.run([sys.executable, "-m", "broker", "down", str(run_dir)], env=env, cwd=elsewhere,
                              capture_output=True, text=True, timeout=300)
        out["down"] = {"rc": down.returncode, "stdout": down.stdout, "stderr": down.stderr}
        out["left"] = _agent_processes(run_dir, server.directory / "home")
        out["remote_state"] = sorted(str(p) for p in (server.directory / "home" / ".broker" / "runs").glob("*/*"))
        out["events"] = (run_dir / "events.jsonl").read_text()
        db = sqlite3.connect(run_dir / "journal.sqlite")
        out["tasks"] = db.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall()
        out["ok_attempts"] = db.execute("SELECT count(*) FROM attempts WHERE outcome = 'ok'").fetchone()[0]
        db.close()
    return out


def test_a_private_only_run_resumes_and_goes_down_with_no_aws_and_no_network(tmp_path):
    from tests.sshd_fixtures import require_sshd

    require_sshd()
    _require_unshare()
    done = subprocess.run(["unshare", "-n", sys.executable, __file__, str(tmp_path)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    first, resume, down = out["first"], out["resume"], out["down"]
    assert first["rc"] == 1, first["stderr"][-3000:]  # left unfinished
    assert 3 <= first["done"] < 12, first  # left part way through
    assert "EC2 is not used: the inventory lists no EC2 type" in first["stderr"]
    assert "left the run's instances and agents running" in first["stdout"]
    assert resume["rc"] == 0, resume["stderr"][-3000:]
    assert "resuming run" in resume["stdout"]
    assert out["tasks"] == [["done", 12]] and out["ok_attempts"] >= 12
    assert down["rc"] == 0, down["stdout"] + down["stderr"]
    assert "0 instance(s) terminated" in down["stdout"] and "FAILED" not in down["stdout"]
    for text in (first["stderr"], resume["stderr"], down["stdout"] + down["stderr"], out["events"]):
        for word in ("NoRegionError", "NoCredentialsError", "botocore", "EndpointConnectionError", "aws.describe"):
            assert word not in text
    assert out["left"] == []  # no agent or task process of the run anywhere
    assert out["remote_state"] == []  # the node's state went once its results were safe


def _local_only_run(tmp_path: Path, inventory_text: str, *goal: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(inventory_text)
    bag = tmp_path / "bag.yaml"
    bag.write_text('command: "echo {i}"\nsweep: {i: [1, 2, 3, 4]}\ntimeout: 30s\nretries: 0\n')
    return subprocess.run(["unshare", "-n", sys.executable, "-m", "broker", "run", "--yes", "--json-report",
                           "--inventory", str(inventory), str(bag), "--run-dir", str(tmp_path / "run"), *goal],
                          env=_no_aws_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=300)


_TYPES = "  types:\n    - {name: c5.large, slots: 2, speed: 1, price: 0.085, limit: 2}\n"


def test_a_budget_that_cannot_pay_a_billing_unit_asks_nothing_of_aws(tmp_path):
    _require_unshare()
    done = _local_only_run(tmp_path, "private:\n  - {name: me, local: true, slots: 2}\naws:\n  region: us-east-1\n"
                           + _TYPES, "--budget", "0.01")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EC2 is not used: a budget of $0.01 cannot pay the first billing unit of any EC2 type" in done.stderr
    assert json.loads(done.stdout)["tasks"]["done"] == 4
    assert "botocore" not in done.stderr and "NoCredentialsError" not in done.stderr


def test_types_without_what_renting_takes_run_on_the_private_nodes_with_a_warning(tmp_path):
    _require_unshare()
    done = _local_only_run(tmp_path, "private:\n  - {name: me, local: true, slots: 2}\naws:\n" + _TYPES,
                           "--deadline", "1h")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("warning: EC2 is not available: aws.region, aws.ami, aws.key_name, aws.security_group, aws.key "
            "missing in") in done.stderr
    assert json.loads(done.stdout)["tasks"]["done"] == 4


def test_types_without_what_renting_takes_and_no_private_node_are_refused(tmp_path):
    done = _local_only_run(tmp_path, "aws:\n" + _TYPES, "--deadline", "1h")
    assert done.returncode == 2
    assert "a live run that rents EC2 instances needs aws.ami" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_launch_without_ec2_configured_sends_nothing_and_says_what_is_missing():
    from broker.shells.aws.absent import NOT_CONFIGURED, NoEc2Fleet
    from broker.shells.aws.records import LaunchErrorKind

    fleet = NoEc2Fleet("run-1", "aws.ami missing in inv.yaml, so this run cannot rent EC2 instances")
    outcome = fleet.launch("c5.large", 2, client_token="run-1-1")
    assert outcome.instances == () and outcome.failure.kind is LaunchErrorKind.LIMIT  # avoided, re-planned
    assert outcome.failure.code == NOT_CONFIGURED and "aws.ami missing" in outcome.failure.message
    assert fleet.describe().instances == () and fleet.reconcile([]).failure is None
    assert fleet.terminate(["i-1"]).refused == ("i-1",)


if __name__ == "__main__":  # the part that runs inside `unshare -n`
    print(json.dumps(drive(Path(sys.argv[1]))))
