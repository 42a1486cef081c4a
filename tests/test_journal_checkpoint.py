"""The journal is checkpointed when its writer closes, even with a reader attached."""

from __future__ import annotations

import shutil
import sqlite3

from broker.core.model import Task
from broker.shells.journal import JOURNAL_FILE, Journal


def test_a_copy_of_the_journal_file_alone_has_the_run_after_a_reader_watched_it(tmp_path):
    """Regression: with a metrics or `status --watch` reader attached, the writer's close was
    not the last, SQLite left the data in the WAL, and journal.sqlite copied alone had no tables."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = Journal.open(run_dir)
    reader = None
    try:
        writer.create_run("r-1", goal_kind="budget", goal_value=5.0, budget_usd=5.0, at_s=0.0)
        writer.add_tasks([Task(id=f"t{i}", command="true") for i in range(3)])
        reader = Journal.open(run_dir, readonly=True)
        assert reader.run().id == "r-1"  # the reader has read, and stays open
    finally:
        writer.close()
    try:
        copy = tmp_path / "copy"
        copy.mkdir()
        shutil.copy(run_dir / JOURNAL_FILE, copy / JOURNAL_FILE)  # the file alone, no -wal beside it
        db = sqlite3.connect(copy / JOURNAL_FILE)
        try:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert {"run", "tasks"} <= tables
            assert db.execute("SELECT id FROM run").fetchone() == ("r-1",)
            assert db.execute("SELECT count(*) FROM tasks").fetchone() == (3,)
        finally:
            db.close()
    finally:
        reader.close()
