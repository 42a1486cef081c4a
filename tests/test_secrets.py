"""Secrets never reach a log: a dry run handed AWS credentials, an SSH key with a passphrase,
and a bag whose env carries a token and that passphrase, some of whose tasks even print the
token to stderr. Neither ``events.jsonl``, nor stderr, nor stdout, nor any table of the
journal may contain a secret value (nor the key's material).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from broker.shells.logging import configure_logging, register_secret

ROOT = Path(__file__).resolve().parent.parent

AWS_KEY_ID = "AKIAPROBESECRET7QX2"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPROBESECRET"
AWS_SESSION = "FwoGZXIvYXdzEPROBESESSIONTOKEN0123456789"
BAG_TOKEN = "tok-live-4f9a8c1e2b7d6e5f"
PASSPHRASE = "correct horse battery staple 9"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dump_journal(path: Path) -> str:
    """Every value of every row of every table, as text."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for table in tables for row in db.execute(f'SELECT * FROM "{table}"'))
    finally:
        db.close()


def test_a_dry_run_logs_and_journals_no_secret(tmp_path: Path) -> None:
    key = tmp_path / "id_lab"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True,
                   capture_output=True)  # fmt: skip
    key_material = "".join(key.read_text().splitlines()[1:-1])
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "private:\n"
        "  - {name: local, local: true, slots: 2}\n"
        f"  - {{name: lab, host: 127.0.0.1, port: {_closed_port()}, key: {key}, slots: 1}}\n"
        "aws:\n  region: us-east-1\n  types:\n"
        "    - {name: c5.xlarge, slots: 2, speed: 1, price: 0.17, limit: 2, boot: 2s}\n"
    )
    bag = tmp_path / "bag.yaml"
    bag.write_text(
        "command: 'echo \"task {i} using $API_TOKEN\" >&2; echo \"pass $SSH_KEY_PASSPHRASE\"; exit {code}'\n"
        "sweep: {i: [1, 2, 3, 4, 5, 6], code: [0, 3]}\n"
        "timeout: 30s\nretries: 0\n"
        f"env:\n  API_TOKEN: {BAG_TOKEN}\n  SSH_KEY_PASSPHRASE: '{PASSPHRASE}'\n  OMP_NUM_THREADS: '1'\n"
    )
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_SESSION_TOKEN": AWS_SESSION,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # the dry run must not need it; nothing may leave
        "HOME": str(tmp_path),  # an empty ~/.ssh/known_hosts
    }
    done = subprocess.run(
        [sys.executable, "-m", "broker", "--log-level", "debug", "run", "--dry-run", "--yes", "--inventory",
         str(inventory), str(bag), "--deadline", "10m", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    events_text = (run_dir / "events.jsonl").read_text()
    events = [json.loads(line) for line in events_text.splitlines()]
    names = {e["event"] for e in events}
    # The run really happened, and went down the paths that could leak.
    assert {"run.start", "task.done", "task.failed", "node.lost", "run.done"} <= names, sorted(names)
    failed = [e for e in events if e["event"] == "task.failed"]
    assert failed and all("task " in e["stderr_tail"] and "using ***" in e["stderr_tail"] for e in failed)
    assert any("passphrase-protected" in e.get("reason", "") for e in events if e["event"] == "node.lost")
    journal = _dump_journal(run_dir / "journal.sqlite")
    assert "task.failed" in journal and "using ***" in journal
    for where, text in (("events.jsonl", events_text), ("stderr", done.stderr), ("stdout", done.stdout),
                        ("journal", journal)):  # fmt: skip
        for secret in (AWS_KEY_ID, AWS_SECRET, AWS_SESSION, BAG_TOKEN, PASSPHRASE, key_material):
            assert secret not in text, f"a secret ({secret[:6]}...) is in {where}"


def test_values_of_secret_names_and_registered_values_are_masked_anywhere(capsys, monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_probe0123456789abcdef")
    monkeypatch.setenv("HOME_DIR_HINT", "not-a-secret-value")
    stream = _Stream()
    configure_logging(stream=stream, json=True)
    register_secret("hunter2-but-longer")
    register_secret("ab")  # too short to mask without mangling ordinary text: ignored
    log = structlog.get_logger()
    log.info("probe", api_token="t0", password="p", nested={"private_key": "k", "list": ["x hunter2-but-longer y"]},
             message="env says ghp_probe0123456789abcdef", home="not-a-secret-value", about="ab")  # fmt: skip
    (line,) = stream.lines
    event = json.loads(line)
    assert event["api_token"] == "***" and event["password"] == "***"
    assert event["nested"] == {"private_key": "***", "list": ["x *** y"]}
    assert event["message"] == "env says ***"
    assert event["home"] == "not-a-secret-value" and event["about"] == "ab"
    structlog.reset_defaults()


class _Stream:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [line for line in text.splitlines() if line]

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "DB_PASSWORD", "MY_API_KEY"])
def test_secret_looking_environment_variables_are_registered(monkeypatch, name) -> None:
    value = f"value-of-{name.lower()}-0123"
    monkeypatch.setenv(name, value)
    stream = _Stream()
    configure_logging(stream=stream, json=True)
    structlog.get_logger().info("probe", text=f"[{value}]")
    assert json.loads(stream.lines[0])["text"] == "[***]"
    structlog.reset_defaults()
