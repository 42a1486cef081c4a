"""One real dry run, observed while it runs and shared by the tests that read what it left.

``observed_dry_run`` runs ``broker run --dry-run --metrics-port 0`` once per test session on
a bag of 39 short tasks and one that always fails (so retries, a final failure, sampling, a
launch, releases and terminations all happen), scrapes its Prometheus endpoint over real
HTTP on 127.0.0.1 every 50 ms while it runs, and hands the run directory, the output and
the scrapes to the event-catalogue, metrics and report tests (one ~10 s run instead of three).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_dryrun import agent_pids

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "inventory.yaml"
TASKS = 39
DEADLINE = "5m"  # short enough that the plan rents an instance, long enough for one


@dataclass
class ObservedRun:
    run_dir: Path
    returncode: int
    stdout: str
    stderr: str
    port: int
    scrapes: list[str] = field(default_factory=list)  # metric texts, in scrape order

    def events(self, name: str | None = None) -> list[dict]:
        lines = (self.run_dir / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if name is None or e["event"] == name]


def _metrics_port(run_dir: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                e = json.loads(line)
                if e["event"] == "metrics.serving":
                    return int(e["port"])
        assert proc.poll() is None, f"broker run ended before serving metrics:\n{proc.stderr.read()[-3000:]}"
        time.sleep(0.02)
    raise AssertionError("no metrics.serving event within 60 s")


def _run_state(run_dir: Path) -> str:
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT state FROM run").fetchone()[0]
    finally:
        db.close()


@pytest.fixture(scope="session")
def observed_dry_run(tmp_path_factory) -> ObservedRun:
    base = tmp_path_factory.mktemp("observed")
    commands = ["sleep 0.25"] * TASKS + ["sh -c 'echo boom >&2; exit 3'"]
    (base / "tasks.txt").write_text("\n".join(commands) + "\n")
    (base / "bag.yaml").write_text("name: mixed\ntasks_file: tasks.txt\ntimeout: 30s\nretries: 1\n")
    run_dir = base / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", "--deadline", DEADLINE, "--metrics-port", "0",
         "--inventory", str(INVENTORY), str(base / "bag.yaml"), "--run-dir", str(run_dir)],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    scrapes: list[str] = []
    try:
        port = _metrics_port(run_dir, proc)
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    assert response.status == 200
                    scrapes.append(response.read().decode())
            except urllib.error.HTTPError:
                raise  # the endpoint answered with an error: a failure whenever it happens
            except (urllib.error.URLError, ConnectionError):
                # The endpoint closes once the run has ended (the process then prints its report).
                assert _run_state(run_dir) != "running", "the metrics endpoint went away mid-run"
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    deadline = time.monotonic() + 5.0
    while agent_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = agent_pids(run_dir)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"agent processes outlived the run: {leaked}"
    return ObservedRun(run_dir, proc.returncode, out, err, port, scrapes)
