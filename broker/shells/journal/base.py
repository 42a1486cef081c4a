"""Opening a journal, its transactions, and its time base.

Times. The journal stores seconds on one axis: epoch seconds for a run (its start
``epoch_anchor_s`` plus run time). A caller works in its own seconds: a reader opened
without an anchor (``broker status``, ``report``, metrics, ``down``) in epoch seconds; the
daemon, which opens it with ``anchor_s`` = the run's epoch anchor and ``clock`` = its run
clock, in run seconds both ways (``at_s`` arguments in, every time in a returned record
out), so no epoch conversion is left to it.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from broker.shells.diskfull import is_disk_full

from .schema import _SCHEMA, DROP_STATE_INDEX, INTERRUPTED_COLUMN, JOURNAL_FILE, NODE_HEARD_TABLE, SCHEMA_VERSION, JournalDiskFull, JournalError, JournalNotFound


class JournalBase:
    """The connection, one lock, transactions and batches (see :mod:`.reader`, :mod:`.writer`)."""

    def __init__(self, db: sqlite3.Connection, path: Path, readonly: bool, clock: Callable[[], float],
                 anchor_s: float = 0.0):
        self._db = db
        self.path = path
        self.readonly = readonly
        self._clock = clock
        self.anchor_s = float(anchor_s)
        self._lock = threading.RLock()
        self._in_batch = False  # a transaction is open: a batch's or a group's (calls are savepoints)
        self._batch_open = False  # a batch() block is open (batches do not nest)
        self._group_open = False  # a group() block is open (a turn: one transaction)
        self._after: list[Callable[[], None]] = []  # to run once the open transaction committed
        # Events recorded inside a transaction, inserted in one statement before it commits (or
        # anything reads them): a turn's task.done rows were one INSERT each, half their cost.
        self._events: list[tuple[float, str, str]] = []
        self._has_interrupted = True  # instances.interrupted exists (not in an old journal read read-only)

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def _connect(cls, run_dir: str | Path, readonly: bool, clock: Callable[[], float], anchor_s: float):
        """Open (creating it unless ``readonly``) ``run_dir/journal.sqlite``.

        A read-only journal is opened with SQLite's ``mode=ro`` URI: it can be read while the
        daemon writes, and any write raises. Raises :class:`JournalNotFound` when a read-only
        open finds no journal, :class:`JournalError` when the file is not a journal or was
        written by a newer broker.
        """
        path = Path(run_dir) / JOURNAL_FILE
        if readonly:
            if not path.is_file():
                raise JournalNotFound(f"no journal at {path} (is {run_dir} a run directory?)")
            target, uri = f"file:{path.resolve().as_posix()}?mode=ro", True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(path), False
        try:
            db = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc
        journal = cls(db, path, readonly, clock, anchor_s)
        try:
            journal._prepare()
        except sqlite3.DatabaseError as exc:
            db.close()
            if is_disk_full(exc):
                raise JournalDiskFull(path.parent, f"cannot set up the journal {path} ({exc})") from exc
            raise JournalError(f"{path} is not a readable broker journal: {exc}") from exc
        except JournalError:
            db.close()
            raise
        return journal

    def _prepare(self) -> None:
        db = self._db
        db.execute("PRAGMA busy_timeout = 10000")
        db.execute("PRAGMA foreign_keys = ON")
        # Statement journals (a turn's multi-row statements inside its transaction) in memory, not
        # a file created and unlinked in /var/tmp about once a turn; the WAL is the record.
        db.execute("PRAGMA temp_store = MEMORY")
        if not self.readonly:
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise JournalError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            db.execute("PRAGMA synchronous = NORMAL")  # FULL for the writes that guard money: _durable()
        with self._read() if self.readonly else self._write():
            has_meta = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
            if has_meta is None:
                if self.readonly:
                    raise JournalError(f"{self.path} holds no journal yet (no schema)")
                if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise JournalError(f"{self.path} is an SQLite file but not a broker journal")
                # Statement by statement inside this transaction (executescript would commit
                # first); the schema text holds no ';' except as terminators.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                return
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"{self.path} was written by a newer broker (journal schema v{version}; this "
                    f"broker reads up to v{SCHEMA_VERSION}): upgrade the broker to resume or inspect it"
                )
            if version < SCHEMA_VERSION:
                raise JournalError(
                    f"{self.path} has journal schema v{version}, older than v{SCHEMA_VERSION} and "
                    "not upgradable: start a new run directory"
                )
            columns = {r[1] for r in db.execute("PRAGMA table_info(instances)")}
            if not self.readonly:
                db.execute(NODE_HEARD_TABLE)
                db.execute(DROP_STATE_INDEX)
                if "interrupted" not in columns:
                    db.execute(INTERRUPTED_COLUMN)
                    columns.add("interrupted")
            self._has_interrupted = "interrupted" in columns

    def close(self) -> None:
        with self._lock:
            if not self.readonly:
                # SQLite checkpoints the WAL into the main file when its last connection closes;
                # with a reader attached (metrics, `status --watch`) the writer is not the last,
                # and a copy of journal.sqlite alone had no tables. Checkpoint it here.
                try:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error:
                    pass  # a reader mid-read: the WAL stays, complete, beside the file
            self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------
    @contextmanager
    def _write(self, one_statement: bool = False) -> Iterator[sqlite3.Connection]:
        """One call's writes, all or nothing: a transaction, or a savepoint inside a batch or
        group (none for a call of ``one_statement``: a statement is atomic by itself)."""
        if self.readonly:
            raise JournalError(f"{self.path} was opened read-only")
        with self._lock:
            if one_statement and self._in_batch:
                yield self._db
                return
            begin, commit, rollback = (
                ("SAVEPOINT call", "RELEASE call", "ROLLBACK TO call; RELEASE call")
                if self._in_batch
                else ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
            )
            if self._in_batch:  # what the transaction held before this call is not undone with it
                self._flush_events()
            mark = len(self._events)
            try:
                self._db.execute(begin)
                try:
                    yield self._db
                except BaseException:
                    self._roll_back(rollback, mark)
                    raise
                self._db.execute(commit)
            except sqlite3.Error as exc:
                if not is_disk_full(exc):
                    raise
                self._roll_back(rollback, mark)
                raise self._disk_full(exc) from exc

    def _roll_back(self, rollback: str, mark: int = 0) -> None:
        """Undo the open transaction or savepoint, if SQLite has not already (it may on a full
        disk), and the events it held from ``mark`` on."""
        del self._events[mark:]
        if not self._db.in_transaction:
            return
        try:
            for statement in rollback.split("; "):
                self._db.execute(statement)
        except sqlite3.Error:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def _disk_full(self, exc: BaseException) -> JournalDiskFull:
        return JournalDiskFull(
            self.path.parent,
            f"could not write the journal {self.path} ({exc}); the change was rolled back and "
            "everything committed before it is kept: free some space, then `broker down` or retry",
        )

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for several SELECTs (inside a batch: the batch's own view)."""
        with self._lock:
            if self._in_batch:
                self._flush_events()  # what the transaction holds, readable
                yield self._db
                return
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator["JournalBase"]:
        """Group many calls into one transaction, hence one commit: for bursts of results.

        Each call inside stays all or nothing (a savepoint), and a call that raises leaves
        the others intact if the caller catches the error. The block as a whole is all or
        nothing: an exception out of it rolls everything back, and nothing is durable until
        it ends, so never carry out an action whose intent was written inside a batch
        before the batch has ended (:meth:`after_commit`). Inside a :meth:`group` a batch is
        a savepoint of the group's transaction: durable when the group commits. Other
        threads wait for the batch; batches do not nest.
        """
        if self.readonly:
            raise JournalError(f"{self.path} was opened read-only")
        with self._lock:
            if self._batch_open:
                raise JournalError("journal batches do not nest")
            self._batch_open = True
            try:
                if self._group_open:
                    with self._savepoint("batch"):
                        yield self
                else:
                    with self._transaction():
                        yield self
            finally:
                self._batch_open = False

    @contextmanager
    def group(self) -> Iterator["JournalBase"]:
        """Group commit: every write of the block (a turn of the daemon's loop: its results,
        events and starts, batches included) in one transaction, committed once at the end
        with ``synchronous=NORMAL`` (in WAL mode: safe against a killed process; a power
        loss may roll back the last groups, never tear one).

        A write that guards money (:meth:`_durable`: an intent, before its EC2 call) commits
        the group so far and itself with ``synchronous=FULL`` (fsynced) before it returns,
        then the group goes on in a new transaction. What must wait until the writes are
        durable (acknowledging results to an agent, sending it the attempts just started) is
        passed to :meth:`after_commit` and runs after the commit. An exception out of the
        block rolls back what was not committed yet, and those callbacks are dropped.
        """
        if self.readonly:
            raise JournalError(f"{self.path} was opened read-only")
        with self._lock:
            if self._in_batch:
                raise JournalError("a journal group opens outside any batch or group")
            self._group_open = True
            try:
                with self._transaction():
                    yield self
            finally:
                self._group_open = False

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once what was written so far is committed: now outside a batch or
        group, else when it ends (never if it rolls back)."""
        with self._lock:
            if self._in_batch:
                self._after.append(action)
                return
        action()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT around the block, then the after-commit actions."""
        self._db.execute("BEGIN IMMEDIATE")
        self._in_batch = True
        try:
            yield
        except BaseException:
            self._roll_back("ROLLBACK")
            self._after.clear()
            raise
        else:
            try:
                self._flush_events()
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._after.clear()
                if not is_disk_full(exc):
                    raise
                self._roll_back("ROLLBACK")
                raise self._disk_full(exc) from exc
        finally:
            self._in_batch = False
        self._run_after()

    def _run_after(self) -> None:
        """Every action, in order; one that raises does not keep the others (the acks to one
        agent, the attempts sent to another) from running; the first error is raised after."""
        actions, self._after = self._after, []
        error: BaseException | None = None
        for action in actions:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - raised below, once the rest ran
                error = error or exc
        if error is not None:
            raise error

    @contextmanager
    def _savepoint(self, name: str) -> Iterator[None]:
        self._flush_events()  # held before the savepoint: inserted outside it, kept if it rolls back
        self._db.execute(f"SAVEPOINT {name}")
        mark = len(self._events)
        try:
            yield
        except BaseException:
            self._roll_back(f"ROLLBACK TO {name}; RELEASE {name}", mark)
            raise
        self._db.execute(f"RELEASE {name}")

    def _flush_events(self) -> None:
        """Insert the events held (:meth:`record_event` inside a transaction), in their order."""
        if self._events:
            rows, self._events = self._events, []
            self._db.executemany("INSERT INTO events (at, name, fields) VALUES (?, ?, ?)", rows)

    @contextmanager
    def _durable(self) -> Iterator[sqlite3.Connection]:
        """One call's writes, committed and fsynced (``synchronous=FULL``) before it returns,
        with everything written before it: for the records that guard money (an intent
        before its EC2 call, the run's creation and end). Inside a group, the group so far
        is committed first and goes on afterwards; inside a batch the call is part of the
        batch, durable when it ends (see :meth:`batch`)."""
        with self._lock:
            if self._batch_open or self.readonly:
                with self._write() as db:
                    yield db
                return
            reopen = self._group_open
            if reopen:  # the group so far: its own commit (the fsync below covers it: one WAL)
                self._commit_group_so_far()
            self._db.execute("PRAGMA synchronous = FULL")
            try:
                with self._write() as db:
                    yield db
            finally:
                self._db.execute("PRAGMA synchronous = NORMAL")
                if reopen:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._in_batch = True

    def _commit_group_so_far(self) -> None:
        try:
            self._flush_events()
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if not is_disk_full(exc):
                raise
            self._roll_back("ROLLBACK")
            self._after.clear()
            raise self._disk_full(exc) from exc
        finally:
            self._in_batch = self._db.in_transaction

    # -- time ----------------------------------------------------------------------------
    def _now(self, at_s: float | None) -> float:
        """The stored time of ``at_s`` (the caller's seconds; None: the clock's now)."""
        return self.anchor_s + (self._clock() if at_s is None else float(at_s))

    def _out(self, stored_s: float | None) -> float | None:
        """A stored time in the caller's seconds."""
        return None if stored_s is None else stored_s - self.anchor_s
