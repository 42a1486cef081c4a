"""The worker agent: runs one node's share of the bag and outlives its connection to the master.

Python 3.8+, stdlib only. Ship it with ``protocol.py`` in the same directory (it imports
that module from there when run as a script). Three ways to run it::

    python3 agent.py attach --state-dir D --slots N        # what the master execs
    python3 agent.py serve  --state-dir D --slots N        # the daemon, in the foreground
    python3 agent.py serve  --stdio --state-dir D --slots N
    python3 agent.py stop   --state-dir D [--keep-s K]       # what `broker down` runs over SSH

``attach`` connects to the daemon serving ``D`` (starting it in a new session first if none
is running, so closing an SSH channel cannot kill it) and then copies its own stdin to the
daemon and the daemon's replies to its stdout: the master speaks the protocol through it.
``serve --stdio`` speaks on its own stdin/stdout instead and dies with the pipe (tasks are
cancelled when the master goes away).

The state directory ``D`` holds::

    agent.sock   the daemon's Unix socket, bound and reached by its relative name from
                 inside D, so a long D never meets the 108-byte socket path limit
    agent.lock   flock(2) held by the live agent: one agent per state dir
    agent.pid    that agent's pid (trust it only while agent.lock is locked)
    agent.log    the daemon's stderr
    journal      append-only Started / Result / Ack lines in the protocol's encoding
    out/<task>.<attempt>.stdout, .stderr    full outputs (an empty stream leaves no file)
    spare/<n>    empty output files kept for the next tasks (see Spare files)

Every file the agent creates there is 0600 and every directory 0700, whatever the umask
(created with those modes and set again with chmod); the directories above D it creates are
0700 too. Tasks run with the umask the agent started with, or the one ``BROKER_TASK_UMASK``
(octal) names: a broker that runs under umask 077 hands its user's umask on that way.

Scheduling. The agent, its bridge and so its tasks run under Linux's ``SCHED_BATCH`` policy
(same CPU share as their nice value gives them; only a waking or new batch process does not
preempt the one running): a bag's tasks are batch work, and where the master or a person's
interactive programs share the machine, thousands of short task starts and exits a second no
longer preempt them on every wake-up (measured: a 16-agent no-op run on the master's own
2-core machine went 5% faster, the bare agent loop not at all). ``BROKER_TASK_SCHED=normal``
keeps the default policy.

Secrets. The values of the Run's ``env`` entries whose names look like credentials
(``protocol.looks_secret``, the broker's own rule) are masked (``***``) in what the agent
writes or sends: the journal, ``agent.log`` and the Results' tails and errors. Output files
are named after the task id and attempt only and hold exactly what the task wrote (the
task's output is the user's own): no header, nothing of its environment.

Reaping. The agent makes itself the child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``,
Linux): whatever a task starts and leaves behind, even a daemon that left the task's session
(``setsid``) and double-forked, is re-parented to the agent instead of to init. Each such
process is attributed to a task when it is first seen (by the ``BROKER_TASK`` /
``BROKER_ATTEMPT`` / ``BROKER_AGENT_DIR`` it inherited, else to every task running or just
ended then) and killed, with everything under it, once its tasks have ended, timed out or
been cancelled: the agent looks after tasks end, at most once a second; when it stops, all
of them are killed. A new agent on a state directory first kills
whatever still carries that directory in its environment (the tasks of an agent that died);
:func:`kill_leftovers` does the same for ``broker down``. Without /proc or the prctl (not
Linux) only the task's process group is killed, as before.

Tasks. Each runs as ``/bin/sh -c COMMAND`` in its own process group, stdin from /dev/null,
stdout and stderr straight into its two files (the agent is not in the data path, and a
task never gets SIGPIPE because the agent died). Environment: the agent's, then the Run's
``env``, then ``BROKER_TASK``, ``BROKER_ATTEMPT`` and ``BROKER_AGENT_DIR``. Working
directory: the Run's ``cwd`` (a leading ``~`` and ``$VAR``/``${VAR}`` expanded from that
environment; an unset variable fails the task), else ``$HOME`` (as an SSH command would). A task ends when its
shell exits; anything it left in its process group is killed then. On timeout or cancel the
group gets SIGTERM, and SIGKILL ``grace_s`` later if the shell still runs. The runtime is
measured here, with the monotonic clock. Progress: a line ``BROKER_PROGRESS <fraction>`` on
stdout, noticed within ``progress_poll_s`` (its ``elapsed_s`` is accurate to that).

Output cap. Each stream's file keeps at most ``max_output_bytes`` (``--max-output-bytes``,
else ``$BROKER_AGENT_MAX_OUTPUT_BYTES``, else 100 MiB; 0 means no cap). The sizes are
checked at every progress poll: past the cap, the disk blocks beyond it are freed there (a
hole punched, the file's size kept), so between two polls a file can hold more than the cap
by what the task writes in one poll interval. When the task ends a truncated file is cut to
the cap and gets a last line saying so, the Result's tail (still the last bytes the task
wrote) ends with the same note, and ``agent.log`` records it. The count of bytes written is
the file's size, which the punched holes leave as the task's writes made it: exact for a
task that writes its stream in order. Where the file system cannot punch holes the file is
cut back to the cap instead, and the count then misses what the task wrote during a cut.

Spare files. Creating two files for every task and deleting the empty ones costs most of a
short task on ext4: each new inode is looked for past every inode deleted in the last half
minute (``recently_deleted``), so at a thousand tasks a second the file system is what a
no-op task waits for. An empty output file is therefore kept in ``spare/`` and renamed to
the next task's output name, instead of unlinked and created again; it is kept only when
nothing else holds it open (a write lease, ``F_SETLEASE``, can be taken: the task's process
opens the file itself, so a leftover of the task that still has it shows), else it is
unlinked as before. A renamed file is what a new one would be: empty, 0600, the task's own.
The agent empties ``spare/`` when it starts and when it stops.

Spot. With ``--spot-metadata URL`` (``http://169.254.169.254`` on EC2) the agent runs on a
spot instance: a thread polls the instance metadata every ``--spot-poll-s`` (default 5 s)
over IMDSv2 for the two-minute interruption notice (``imds.py``) and, once it is there,
reports it to the master as an ``Interruption`` message (again after the Hello of every
later connection). The agent itself goes on as before: what to stop or re-queue is the
master's decision.

Lease. With ``--lease-s L`` the daemon holds a lease on its node: after ``L`` seconds with
no master connected (the broker crashed and nobody resumed, or the node was cut off for
longer than any reconnect) it cancels its tasks and exits, so no agent or task is left
running for ever. The results it holds stay in its journal for a master that comes back.

Clean-up. With ``--keep-s K`` a state directory whose results are safe (the master sent
``Shutdown`` and had acknowledged every result) is marked ``finished`` when the agent exits;
``K = 0`` removes it there and then (with its run's directory once empty), otherwise the
next agent started on the node, or ``stop``, removes every finished state directory of
``<root>/runs/*/`` older than ``K``. ``python3 agent.py stop --state-dir D [--keep-s K]``
(what ``broker down`` runs on each node) stops the agent serving ``D`` and what its tasks
left (:func:`stop_agent`), and applies ``K`` to ``D`` as if it had finished; it says what it
did in a line, then as JSON.

Results are journaled before they are sent and replayed on every new connection until the
master acknowledges them, so neither a dropped connection nor an agent restart loses one.
A Run for a (task, attempt) the agent already knows is answered, never run twice: with
``Started`` again if it runs, its ``Result`` if it finished, a Result with an error if the
master already acknowledged it. Runs beyond ``slots`` wait in a queue, in arrival order.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import fcntl
import heapq
import itertools
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple
from urllib.parse import quote

try:
    from . import imds
    from . import protocol as wire  # imported as part of the workers package
except ImportError:
    import imds  # type: ignore[no-redef]
    import protocol as wire  # type: ignore[no-redef]  # run as a script next to protocol.py

AGENT_VERSION = "1"
AGENT_FILE = os.path.abspath(__file__)
SHELL = "/bin/sh"
SOCKET_NAME = "agent.sock"
LOCK_NAME = "agent.lock"
PID_NAME = "agent.pid"
LOG_NAME = "agent.log"
JOURNAL_NAME = "journal"
OUT_DIR = "out"
SPARE_DIR = "spare"
FINISHED_NAME = "finished"  # written when the state's results are safe (see Clean-up)

TAIL_BYTES = 4096
PROGRESS_TOKEN = b"BROKER_PROGRESS"
PROGRESS_LINE_MAX_BYTES = 256  # longer stdout lines cannot be progress lines: skipped unread
PROGRESS_READ_MAX_BYTES = 1 << 20  # per task and poll, so a chatty task cannot stall the loop
PEER_BACKLOG_MAX_BYTES = 16 << 20  # a master that stops reading is dropped (it gets a replay)
JOURNAL_COMPACT_MIN_BYTES = 4 << 20
DAEMON_START_TIMEOUT_S = 10.0
MAX_OUTPUT_ENV = "BROKER_AGENT_MAX_OUTPUT_BYTES"
DEFAULT_MAX_OUTPUT_BYTES = 100 << 20
EXIT_FLUSH_TIMEOUT_S = 5.0
TASK_UMASK_ENV = "BROKER_TASK_UMASK"
TASK_SCHED_ENV = "BROKER_TASK_SCHED"  # "normal": no SCHED_BATCH (see Scheduling)
ORPHAN_SCAN_S = 1.0  # how often, while tasks run, newly adopted processes are attributed to them
_PR_SET_CHILD_SUBREAPER = 36
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02  # linux/falloc.h

Key = Tuple[str, int]


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    sys.stderr.write(f"{stamp} agent[{os.getpid()}] {message}\n")
    sys.stderr.flush()


_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def expand_path(path: str, env: Dict[str, str]) -> Tuple[str, List[str]]:
    """``path`` with a leading ``~`` or ``~user`` and ``$VAR`` / ``${VAR}`` expanded from the
    task's environment ``env`` (as the node's shell would), and the names left unset."""
    if path == "~" or path.startswith("~/"):
        path = (env.get("HOME") or os.path.expanduser("~")) + path[1:]
    elif path.startswith("~"):
        path = os.path.expanduser(path)
    unset: List[str] = []

    def value(match: "re.Match[str]") -> str:
        name = match.group(1) or match.group(2)
        if name in env:
            return env[name]
        if name not in unset:
            unset.append(name)
        return match.group(0)

    return _VARIABLE.sub(value, path), unset


def output_stem(task: str, attempt: int) -> str:
    """File name stem for a task's outputs: the id percent-encoded, so no id can escape out/."""
    safe = quote(task, safe="-_.")
    if safe.startswith("."):
        safe = "%2E" + safe[1:]
    return f"{safe}.{attempt}"


def private_open(path: str, flags: int) -> int:
    """``os.open`` creating the file 0600 (set again, so no umask can widen or narrow it)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def private_makedirs(path: str) -> None:
    """``mkdir -p`` with each directory it creates 0700, and ``path`` itself made 0700."""
    missing: List[str] = []
    current = path
    while not os.path.isdir(current) and os.path.dirname(current) != current:
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        os.chmod(directory, 0o700)
    os.chmod(path, 0o700)


# --------------------------------------------------------------------------- processes


def _process_table() -> Dict[int, int]:
    """pid -> parent pid of every live (not zombie) process, from /proc; {} without it."""
    table: Dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            table[int(name)] = int(fields[1])
    return table


def _children_of(pid: int) -> Optional[Set[int]]:
    """The direct children of ``pid`` (a single-threaded process) from
    ``/proc/PID/task/PID/children``, cheap to read; None where the kernel lacks that file."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return {int(p) for p in f.read().split()}
    except (OSError, ValueError):
        return None


def _marks(pid: int) -> Optional[Tuple[str, str, str]]:
    """(BROKER_TASK, BROKER_ATTEMPT, BROKER_AGENT_DIR) in a process's environment, if all there."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None
    found: Dict[bytes, str] = {}
    for entry in environ:
        name, _, value = entry.partition(b"=")
        if name in (b"BROKER_TASK", b"BROKER_ATTEMPT", b"BROKER_AGENT_DIR"):
            found[name] = os.fsdecode(value)
    if len(found) < 3:
        return None
    return found[b"BROKER_TASK"], found[b"BROKER_ATTEMPT"], found[b"BROKER_AGENT_DIR"]


def _subtree(roots: List[int], table: Dict[int, int]) -> List[int]:
    """``roots`` and every descendant of them in ``table``."""
    children: Dict[int, List[int]] = {}
    for pid, parent in table.items():
        children.setdefault(parent, []).append(pid)
    found: List[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _kill_all(pids: List[int]) -> int:
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def kill_leftovers(state_dir: str) -> int:
    """SIGKILL every process (and its descendants) that carries ``state_dir`` as its
    ``BROKER_AGENT_DIR``: the tasks of an agent that is gone. Returns how many were signalled.
    Used by a new agent on that directory and by ``broker down`` after stopping the agent."""
    state_dir = os.path.abspath(os.path.expanduser(state_dir))
    own = {os.getpid(), os.getppid()}
    signalled: set = set()
    # Again until a pass finds no new one: a task's shell killed while it forked leaves a child
    # that no earlier table held (a `sleep 100` outlived `broker down` in CI, once).
    for _ in range(_LEFTOVER_PASSES):
        table = _process_table()
        roots = [pid for pid in table if pid not in own and (_marks(pid) or ("", "", ""))[2] == state_dir]
        new = [pid for pid in _subtree(roots, table) if pid not in own and pid not in signalled]
        if not new:
            break
        signalled.update(pid for pid in new if _kill_all([pid]))
        time.sleep(0.02)
    return len(signalled)


_LEFTOVER_PASSES = 10


def agent_pid(state_dir: str) -> Optional[int]:
    """The pid of the agent serving ``state_dir``, or None if none is alive. The pid file is
    believed only while the state dir's lock is held, so a stale one never names a stranger."""
    try:
        fd = os.open(os.path.join(state_dir, LOCK_NAME), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            with open(os.path.join(state_dir, PID_NAME)) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def stop_agent(state_dir: str, timeout_s: float = 10.0) -> Tuple[bool, int]:
    """Stop the agent serving ``state_dir`` (SIGTERM: it cancels its tasks and kills what they
    left; SIGKILL after ``timeout_s``), then kill whatever still carries the state dir
    (:func:`kill_leftovers`). Returns whether an agent ran, and how many leftovers were killed."""
    state_dir = os.path.abspath(os.path.expanduser(state_dir))
    pid = agent_pid(state_dir)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while agent_pid(state_dir) is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            if agent_pid(state_dir) is not None:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pid is not None, kill_leftovers(state_dir)


def cmd_stop(args: argparse.Namespace) -> int:
    """``agent.py stop --state-dir D [--keep-s K]``: what ``broker down`` runs on a node it
    reaches by SSH. Stops the agent and what its tasks left, then (``--keep-s``) treats the
    state as finished: removed at once (0) or swept once ``K`` has passed. One line saying
    what it did, then the same as JSON (``stop_remote_agent`` reads the JSON)."""
    import json

    state_dir = os.path.abspath(os.path.expanduser(args.state_dir))
    exists = os.path.isdir(state_dir)
    ran, killed = stop_agent(state_dir, args.timeout_s) if exists else (False, 0)
    report: Dict[str, object] = {"state_dir": state_dir, "stopped": ran, "tasks_killed": killed, "removed": False}
    if args.keep_s is not None:
        if exists:
            mark_finished(state_dir)
            if args.keep_s <= 0:
                remove_state(state_dir)
            report["removed"] = not os.path.exists(state_dir)
        report["swept"] = len(sweep_finished(state_dir, args.keep_s))
    print(f"agent {'stopped' if ran else 'not running'}; {killed} leftover process(es) killed")
    print(json.dumps(report), flush=True)
    return 0


def _become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux >= 3.4); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------- journal


class Journal:
    """Append-only record of what the master must not lose: Started, Result and Ack lines.

    Loading it gives the results not yet acknowledged (replayed to the next master), the
    acknowledged keys (a Run for one is not run again) and the tasks that were running when
    the previous agent stopped. Lines gathered in one loop turn go out in one write(2):
    durable if the agent dies, not if the machine does (nothing on it survives that). It is
    rewritten with only its live content once it has grown to four times that.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._pending: List[bytes] = []
        self._fd = -1
        self._size = 0
        self._live_size = 0

    def load(self) -> Tuple[Dict[Key, wire.Started], Dict[Key, wire.Result], Set[Key]]:
        started: Dict[Key, wire.Started] = {}
        results: Dict[Key, wire.Result] = {}
        acked: Set[Key] = set()
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        for number, line in enumerate(data.splitlines(), 1):
            try:
                message = wire.decode(line)
            except wire.RemoteProtocolError as exc:  # a torn last line after a crash
                log(f"journal line {number} skipped: {exc}")
                continue
            key = wire.key_of(message)
            if isinstance(message, wire.Started):
                started[key] = message
            elif isinstance(message, wire.Result):
                started.pop(key, None)
                results[key] = message
            elif isinstance(message, wire.Ack):
                started.pop(key, None)
                results.pop(key, None)
                acked.add(key)
        return started, results, acked

    def rewrite(self, messages: List[wire.Message]) -> None:
        """Replace the journal by ``messages`` (atomically: a crash leaves old or new)."""
        data = b"".join(wire.encode(m) for m in messages)
        temporary = self.path + ".new"
        fd = private_open(temporary, os.O_WRONLY | os.O_TRUNC)
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = private_open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = self._live_size = len(data)

    def append(self, message: wire.Message) -> None:
        self._pending.append(wire.encode(message))

    def flush(self) -> None:
        if not self._pending:
            return
        data = memoryview(b"".join(self._pending))
        self._pending.clear()
        while data:
            written = os.write(self._fd, data)
            self._size += written
            data = data[written:]

    @property
    def oversized(self) -> bool:
        return self._size > max(JOURNAL_COMPACT_MIN_BYTES, 4 * self._live_size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --------------------------------------------------------------------------- tasks


class _Spares:
    """Empty output files kept for reuse (see Spare files in the module docstring).

    ``take(path)`` renames a kept file to ``path`` (or creates it) and returns our descriptor
    of it; ``give_back(fd, path)`` keeps an empty file that no one else holds open, else
    unlinks it. At most ``limit`` files are kept.
    """

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self._free: List[Tuple[str, int]] = []  # (path in spare/, our O_RDWR descriptor)
        self._names = itertools.count()
        private_makedirs(directory)
        self.clear()

    def take(self, path: str) -> int:
        while self._free:
            spare, fd = self._free.pop()
            try:
                os.rename(spare, path)
                return fd
            except OSError:
                os.close(fd)  # gone or not movable: a new file below
                _unlink_quietly(spare)
        return private_open(path, os.O_RDWR | os.O_TRUNC)

    def give_back(self, fd: int, path: str) -> None:
        """``fd`` is our descriptor of the empty file at ``path``; closed or kept here."""
        if len(self._free) < self.limit and _alone(fd):
            spare = os.path.join(self.directory, str(next(self._names)))
            try:
                os.rename(path, spare)
                self._free.append((spare, fd))
                return
            except OSError:
                pass
        os.close(fd)
        _unlink_quietly(path)

    def clear(self) -> None:
        for _, fd in self._free:
            os.close(fd)
        self._free.clear()
        for name in os.listdir(self.directory):
            _unlink_quietly(os.path.join(self.directory, name))


def _alone(fd: int) -> bool:
    """Whether no other open file description refers to ``fd``'s file: a write lease can be
    taken only then (and is let go at once). False where the file system (or the system: not
    Linux) has no leases."""
    setlease = getattr(fcntl, "F_SETLEASE", None)
    if setlease is None:
        return False
    try:
        fcntl.fcntl(fd, setlease, fcntl.F_WRLCK)
    except OSError:
        return False
    fcntl.fcntl(fd, setlease, fcntl.F_UNLCK)
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Task:
    """A started attempt: its process group, output files and the state of its ending."""

    __slots__ = (
        "run", "key", "pid", "started_at", "out_fd", "err_fd", "out_path", "err_path",
        "timed_out", "cancelled", "progress_offset", "progress_carry", "capped",
    )  # fmt: skip

    def __init__(self, run: wire.Run, pid: int, started_at: float, out_fd: int, err_fd: int,
                 out_path: str, err_path: str) -> None:  # fmt: skip
        self.run = run
        self.key: Key = (run.task, run.attempt)
        self.pid = pid
        self.started_at = started_at
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.out_path = out_path
        self.err_path = err_path
        self.timed_out = False
        self.cancelled = False
        self.progress_offset = 0
        self.progress_carry: Optional[bytes] = b""  # None: inside an over-long line
        self.capped: Dict[int, _Cut] = {}  # by fd, once a stream has been cut back to the cap


class _Cut:
    """A stream cut back to the cap: the most bytes it held, its last bytes at the last cut, the size then."""

    __slots__ = ("written", "tail", "cut_at")

    def __init__(self) -> None:
        self.written = 0
        self.tail = b""
        self.cut_at = 0


_fallocate: Optional[Callable[..., int]] = None  # libc's, loaded on the first cut


def _punch_hole(fd: int, start: int, end: int) -> bool:
    """Free the disk blocks of bytes ``[start, end)`` of ``fd`` and keep its size; False if
    the system cannot. Unlike a truncation this cannot lose track of bytes the task writes
    while it happens: they only move the file's size on."""
    global _fallocate
    if _fallocate is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            function = getattr(libc, "fallocate64", None) or libc.fallocate
        except (OSError, AttributeError):
            return False
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        function.restype = ctypes.c_int
        _fallocate = function
    return _fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, start, end - start) == 0


def _recent_bytes(fd: int, size: int, cut: Optional[_Cut], cap: int) -> bytes:
    """The last TAIL_BYTES the task wrote to a stream whose file is ``size`` bytes long.

    After a cut the file is the kept head, a hole up to where the writer's offset was, then
    what it wrote since; the bytes before the cut come from the tail saved then.
    """
    if cut is None:
        return os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES))
    start = cut.cut_at if size >= cut.cut_at else cap
    new = os.pread(fd, max(0, min(TAIL_BYTES, size - start)), max(start, size - TAIL_BYTES))
    return (cut.tail + new)[-TAIL_BYTES:]


def _as_text(tail: bytes, cut_mid_stream: bool) -> str:
    if cut_mid_stream:  # do not begin inside a UTF-8 sequence
        skip = 0
        while skip < 3 and skip < len(tail) and tail[skip] & 0xC0 == 0x80:
            skip += 1
        tail = tail[skip:]
    return tail.decode("utf-8", "replace")


def _truncation_note(stream: str, cap: int, written: int) -> str:
    return (
        f"[broker agent: {stream} truncated: the task wrote {written:,} bytes, the file keeps the "
        f"first {cap:,} (--max-output-bytes / {MAX_OUTPUT_ENV}); the tail above is the last output]"
    )



def _read_tail(fd: int, path: str) -> Tuple[str, Optional[str]]:
    """The last TAIL_BYTES of an output file as text, and its path (None, file removed, if empty)."""
    size = os.fstat(fd).st_size
    if size == 0:
        os.close(fd)
        os.unlink(path)
        return "", None
    start = max(0, size - TAIL_BYTES)
    tail = os.pread(fd, TAIL_BYTES, start)
    os.close(fd)
    if start:  # do not begin inside a UTF-8 sequence
        skip = 0
        while skip < 3 and skip < len(tail) and tail[skip] & 0xC0 == 0x80:
            skip += 1
        tail = tail[skip:]
    return tail.decode("utf-8", "replace"), path


def _progress_fraction(line: bytes) -> Optional[float]:
    """The fraction of a ``BROKER_PROGRESS f`` line (0 <= f <= 1), else None."""
    parts = line.split()
    if len(parts) != 2 or parts[0] != PROGRESS_TOKEN:
        return None
    try:
        fraction = float(parts[1])
    except ValueError:
        return None
    return fraction if 0.0 <= fraction <= 1.0 else None


def _progress_fractions(task: _Task, chunk: bytes) -> List[float]:
    """Fractions announced by the lines ``chunk`` completes; keeps the unfinished line for later.

    ``task.progress_carry`` holds the start of the current line, or None while inside a line
    too long to be a progress line (its bytes are skipped up to the next newline).
    """
    *complete, rest = chunk.split(b"\n")
    fractions = []
    for i, line in enumerate(complete):
        if i == 0:
            carry, task.progress_carry = task.progress_carry, b""
            if carry is None:
                continue
            line = carry + line
        fraction = _progress_fraction(line)
        if fraction is not None:
            fractions.append(fraction)
    carry = rest if complete else (None if task.progress_carry is None else task.progress_carry + rest)
    task.progress_carry = carry if carry is not None and len(carry) <= PROGRESS_LINE_MAX_BYTES else None
    return fractions


# --------------------------------------------------------------------------- connection


class _Peer:
    """The master currently attached: its protocol state and the bytes waiting to go out."""

    def __init__(self, rfd: int, wfd: int, sock: Optional[socket.socket]) -> None:
        self.rfd = rfd
        self.wfd = wfd
        self.sock = sock
        self.conn = wire.Connection("agent")
        self.out = bytearray()
        self.greeted = False  # our Hello went out: results may follow
        self.watching_write = False
        for fd in {rfd, wfd}:
            os.set_blocking(fd, False)

    def send(self, message: wire.Message) -> None:
        self.out += self.conn.send(message)

    def write_some(self) -> None:
        """Write what the pipe takes now; raises OSError if the master is gone."""
        while self.out:
            try:
                written = os.write(self.wfd, self.out)
            except BlockingIOError:
                return
            del self.out[:written]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        else:
            for fd in {self.rfd, self.wfd}:
                try:
                    os.close(fd)
                except OSError:
                    pass


# --------------------------------------------------------------------------- the agent


class Agent:
    """The event loop: one master connection, up to ``slots`` tasks, timers, the journal.

    Single-threaded: a selector waits on the master's stream, the listening socket and a
    self-pipe that turns SIGCHLD/SIGTERM into readable bytes; timeouts and kills sit in a
    heap. Children are reaped with ``waitid(WNOWAIT)`` first so that the task's process
    group can be killed while its id is still reserved, and only then collected.
    """

    def __init__(self, state_dir: str, slots: int, node: str, grace_s: float = 5.0,
                 idle_exit_s: float = 0.0, progress_poll_s: float = 0.25,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, reap_orphans: bool = False,
                 lease_s: float = 0.0, keep_s: Optional[float] = None,
                 spot_metadata: Optional[str] = None, spot_poll_s: float = imds.DEFAULT_POLL_S) -> None:  # fmt: skip
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if max_output_bytes < 0:
            raise ValueError("max_output_bytes must be >= 0 (0: no cap)")
        self.max_output_bytes = max_output_bytes
        self.state_dir = state_dir
        self.slots = slots
        self.node = node
        self.grace_s = grace_s
        self.idle_exit_s = idle_exit_s
        self.progress_poll_s = progress_poll_s
        self.lease_s = lease_s  # 0: no lease
        self.keep_s = keep_s  # None: state kept for good
        self._master_shutdown = False  # a master's Shutdown ended this agent
        self.spot_metadata = spot_metadata  # None: not on spot, no notice to watch for
        self.spot_poll_s = spot_poll_s
        self._interruption: Optional[wire.Interruption] = None  # the spot notice, once read
        self._notice_r = self._notice_w = -1
        self.out_dir = os.path.join(state_dir, OUT_DIR)
        private_makedirs(self.out_dir)
        self._spares = _Spares(os.path.join(state_dir, SPARE_DIR), limit=2 * slots + 8)
        self.reap_orphans = reap_orphans  # we are the subreaper: adopted leftovers are ours to kill
        self._adopted: Dict[int, Set[Key]] = {}  # re-parented to us: pid -> the tasks it may belong to
        self._next_orphan_scan = 0.0
        self._ended_since_scan: Set[Key] = set()  # tasks ended since the last scan (it is due)
        self._secrets: Set[str] = set()  # secret values of the Runs seen: masked in what we write
        self._home = os.environ.get("HOME") or state_dir
        self._base_env = dict(os.environ)
        self._queued: Dict[Key, wire.Run] = {}
        self._running: Dict[Key, _Task] = {}
        self._by_pid: Dict[int, _Task] = {}
        self._timers: List[Tuple[float, int, _Task, str]] = []
        self._timer_seq = itertools.count()
        self._next_progress_at = 0.0
        self._peer: Optional[_Peer] = None
        self._listener: Optional[socket.socket] = None
        self._stdio = False
        self._shutdown: Optional[str] = None  # None, "drain" or "cancel"
        self._idle_since = time.monotonic()
        self._sel = selectors.DefaultSelector()
        self._journal = Journal(os.path.join(state_dir, JOURNAL_NAME))
        started, self._results, self._acked = self._journal.load()
        for key, record in started.items():
            self._results[key] = self._orphan_result(record)
        self._compact()

    # ----------------------------------------------------------------- entry points

    def serve_socket(self) -> None:
        """Serve masters connecting to ``agent.sock`` (cwd must be the state dir)."""
        if os.path.exists(SOCKET_NAME):
            os.unlink(SOCKET_NAME)  # stale: we hold the lock, so no live agent owns it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)  # whoever can connect can run commands as us
        try:
            listener.bind(SOCKET_NAME)
        finally:
            os.umask(old_umask)
        listener.listen(8)
        listener.setblocking(False)
        self._listener = listener
        self._sel.register(listener, selectors.EVENT_READ, self._on_accept)
        log(f"serving {self.state_dir} with {self.slots} slots, pid {os.getpid()}")
        self._run_loop(hangup_ends=False)

    def serve_stdio(self) -> None:
        """Serve one master on stdin/stdout; losing it cancels the tasks and ends the agent."""
        self._stdio = True
        self._attach(_Peer(sys.stdin.fileno(), sys.stdout.fileno(), None))
        self._run_loop(hangup_ends=True)

    # ----------------------------------------------------------------- loop

    def _run_loop(self, hangup_ends: bool) -> None:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        ending = {signal.SIGTERM, signal.SIGINT} | ({signal.SIGHUP} if hangup_ends else set())
        for signum in ending | {signal.SIGCHLD}:
            signal.signal(signum, lambda *_: None)  # the wakeup fd carries the signal number
        if not hangup_ends:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

        def on_signal(_mask: int) -> None:
            try:
                numbers = os.read(wake_r, 512)
            except BlockingIOError:
                return
            if any(n in ending for n in numbers):
                log("signal received: cancelling tasks and stopping")
                self._begin_shutdown(drain=False)
            self._reap()

        self._sel.register(wake_r, selectors.EVENT_READ, on_signal)
        self._watch_spot()
        try:
            while True:
                for selected, mask in self._sel.select(self._wait_s()):
                    selected.data(mask)
                self._fire_timers(time.monotonic())
                self._check_lease(time.monotonic())
                self._start_queued()
                self._journal.flush()
                if self._journal.oversized:
                    self._compact()
                self._flush_peer()
                if self._finished():
                    break
        finally:
            self._close()

    # ----------------------------------------------------------------- spot notice

    def _watch_spot(self) -> None:
        """With ``spot_metadata``, a thread polls it for the two-minute notice (``imds``);
        the notice wakes the loop through a pipe and goes to the master as ``Interruption``,
        now and after the Hello of every later connection."""
        if not self.spot_metadata:
            return
        self._notice_r, self._notice_w = os.pipe()
        os.set_blocking(self._notice_r, False)
        self._sel.register(self._notice_r, selectors.EVENT_READ, self._on_notice)
        notice_w = self._notice_w

        def noticed(action: str, when: str, in_s: float) -> None:
            self._interruption = wire.Interruption(action=action, time=when, in_s=in_s)
            os.write(notice_w, b"!")

        imds.SpotWatcher(self.spot_metadata, noticed, self.spot_poll_s, log).start()
        log(f"watching {self.spot_metadata} for the spot interruption notice every {self.spot_poll_s:g} s")

    def _on_notice(self, _mask: int) -> None:
        try:
            os.read(self._notice_r, 64)
        except BlockingIOError:
            return
        if self._interruption is not None:
            self._send(self._interruption_now())

    def _interruption_now(self) -> wire.Interruption:
        """The notice with its time left recomputed for this moment."""
        notice = self._interruption
        assert notice is not None
        return dataclasses.replace(notice, in_s=imds.seconds_until(notice.time) if notice.time else 0.0)

    def _wait_s(self) -> Optional[float]:
        now = time.monotonic()
        deadlines = []
        if self._timers:
            deadlines.append(self._timers[0][0])
        if self._running:
            deadlines.append(self._next_progress_at)
        if self._idle_exit_pending():
            deadlines.append(self._idle_since + self.idle_exit_s)
        if self.reap_orphans and self._ended_since_scan:
            deadlines.append(self._next_orphan_scan)
        if self._lease_pending():
            deadlines.append(self._idle_since + self.lease_s)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _finished(self) -> bool:
        if self._running or self._queued:
            return False
        if self._shutdown is not None:
            return True
        if self._idle_exit_pending() and time.monotonic() >= self._idle_since + self.idle_exit_s:
            log(f"no master for {self.idle_exit_s:g} s and nothing to do: exiting")
            return True
        return False

    def _idle_exit_pending(self) -> bool:
        return self.idle_exit_s > 0 and self._peer is None and not self._running and not self._queued

    # ----------------------------------------------------------------- lease and clean-up

    def _lease_pending(self) -> bool:
        return self.lease_s > 0 and self._peer is None and self._shutdown is None

    def _check_lease(self, now: float) -> None:
        """No master for ``lease_s``: cancel the tasks and stop (the results stay journaled)."""
        if self._lease_pending() and now >= self._idle_since + self.lease_s:
            log(f"no master for {self.lease_s:g} s (the lease): cancelling "
                f"{len(self._running) + len(self._queued)} task(s) and stopping")
            self._begin_shutdown(drain=False)

    def _results_safe(self) -> bool:
        """A master ended this agent and had acknowledged every result."""
        return self._master_shutdown and not self._results and not self._running and not self._queued

    def _after_exit(self) -> None:
        """Mark the state finished when its results are safe, and apply ``keep_s``."""
        if self.keep_s is None or not self._results_safe():
            return
        mark_finished(self.state_dir)
        if self.keep_s <= 0:
            remove_state(self.state_dir)
            log(f"results safe: removed {self.state_dir}")

    def _close(self) -> None:
        self._kill_orphans_at_exit()
        self._spares.clear()
        self._journal.flush()
        self._journal.close()
        peer = self._peer
        if peer is not None:
            deadline = time.monotonic() + EXIT_FLUSH_TIMEOUT_S
            try:
                peer.write_some()
                while peer.out and time.monotonic() < deadline:
                    select.select([], [peer.wfd], [], deadline - time.monotonic())
                    peer.write_some()
            except OSError:
                pass
            peer.close()
        if self._listener is not None:
            self._listener.close()
            for name in (SOCKET_NAME, PID_NAME):
                try:
                    os.unlink(os.path.join(self.state_dir, name))
                except FileNotFoundError:
                    pass
        log("stopped")
        self._after_exit()

    # ----------------------------------------------------------------- the master

    def _on_accept(self, _mask: int) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._peer is not None:
            log("a new master connection replaces the previous one")
            self._detach()
        self._attach(_Peer(sock.fileno(), sock.fileno(), sock))

    def _attach(self, peer: _Peer) -> None:
        self._peer = peer
        self._sel.register(peer.rfd, selectors.EVENT_READ, self._on_peer_io)

    def _detach(self) -> None:
        peer, self._peer = self._peer, None
        if peer is None:
            return
        self._sel.unregister(peer.rfd)
        if peer.watching_write and peer.wfd != peer.rfd:
            self._sel.unregister(peer.wfd)
        peer.close()
        self._idle_since = time.monotonic()
        if self._stdio:
            log("the master closed the pipe: cancelling tasks and stopping")
            self._begin_shutdown(drain=False)

    def _on_peer_io(self, mask: int) -> None:
        peer = self._peer
        if peer is None:
            return
        if mask & selectors.EVENT_WRITE:
            self._flush_peer()
        if mask & selectors.EVENT_READ and self._peer is peer:
            try:
                data = os.read(peer.rfd, 1 << 18)
            except BlockingIOError:
                return
            except OSError as exc:
                log(f"master connection failed: {exc}")
                self._detach()
                return
            peer.conn.receive_data(data)
            self._handle_messages(peer)

    def _handle_messages(self, peer: _Peer) -> None:
        while self._peer is peer:
            try:
                message = peer.conn.next_event()
            except wire.RemoteProtocolError as exc:
                log(f"master broke the protocol: {exc}")
                if not peer.greeted:  # tell it which protocol we speak before hanging up
                    peer.send(self._hello())
                    try:
                        peer.write_some()
                    except OSError:
                        pass
                self._detach()
                return
            if message is wire.NEED_DATA:
                return
            if isinstance(message, wire.ConnectionClosed):
                self._detach()
                return
            self._handle(peer, message)

    def _handle(self, peer: _Peer, message: wire.Message) -> None:
        if isinstance(message, wire.Hello):
            peer.send(self._hello())
            peer.greeted = True
            for result in self._results.values():
                peer.send(result)
            if self._interruption is not None:
                peer.send(self._interruption_now())
        elif isinstance(message, wire.Run):
            self._accept_run(peer, message)
        elif isinstance(message, wire.Ack):
            key = wire.key_of(message)
            if self._results.pop(key, None) is not None:
                self._journal.append(message)
                self._acked.add(key)
        elif isinstance(message, wire.Cancel):
            self._cancel(wire.key_of(message))
        elif isinstance(message, wire.Ping):
            peer.send(wire.Pong(message.seq))
        elif isinstance(message, wire.Shutdown):
            log(f"shutdown requested ({'drain' if message.drain else 'cancel'})")
            self._master_shutdown = True
            self._begin_shutdown(message.drain)

    def _hello(self) -> wire.Hello:
        return wire.Hello(
            role="agent",
            node=self.node,
            slots=self.slots,
            agent_version=AGENT_VERSION,
            running=tuple(self._running) + tuple(self._queued),
            pending_results=len(self._results),
        )

    def _send(self, message: wire.Message) -> None:
        peer = self._peer
        if peer is not None and peer.greeted:
            peer.send(message)

    def _flush_peer(self) -> None:
        peer = self._peer
        if peer is None:
            return
        try:
            peer.write_some()
        except OSError as exc:
            log(f"master connection lost while writing: {exc}")
            self._detach()
            return
        if len(peer.out) > PEER_BACKLOG_MAX_BYTES:
            log("the master stopped reading: dropping it (results wait in the journal)")
            self._detach()
            return
        want_write = bool(peer.out)
        if want_write == peer.watching_write:
            return
        if peer.wfd == peer.rfd:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._sel.modify(peer.rfd, events, self._on_peer_io)
        elif want_write:
            self._sel.register(peer.wfd, selectors.EVENT_WRITE, self._on_peer_io)
        else:
            self._sel.unregister(peer.wfd)
        peer.watching_write = want_write

    # ----------------------------------------------------------------- task lifecycle

    def _accept_run(self, peer: _Peer, run: wire.Run) -> None:
        self._secrets.update(wire.secret_values(run.env))
        key = wire.key_of(run)
        task = self._running.get(key)
        if task is not None:
            peer.send(wire.Started(run.task, run.attempt, task.pid))
        elif key in self._queued:
            pass  # accepted already; its Started comes when a slot frees
        elif key in self._results:
            peer.send(self._results[key])
        elif key in self._acked:
            peer.send(self._refusal(run, "this attempt already ran and its result was acknowledged"))
        elif self._shutdown is not None:
            self._record(self._refusal(run, "the agent is shutting down"))
        else:
            self._queued[key] = run

    @staticmethod
    def _refusal(run: wire.Run, why: str) -> wire.Result:
        return wire.Result(run.task, run.attempt, exit_code=None, runtime_s=0.0, error=f"not run: {why}")

    def _start_queued(self) -> None:
        while self._queued and len(self._running) < self.slots:
            key = next(iter(self._queued))
            self._start(self._queued.pop(key))

    def _start(self, run: wire.Run) -> None:
        stem = os.path.join(self.out_dir, output_stem(run.task, run.attempt))
        out_path, err_path = stem + ".stdout", stem + ".stderr"
        env = dict(self._base_env)
        env.update(run.env)
        env.update(BROKER_TASK=run.task, BROKER_ATTEMPT=str(run.attempt), BROKER_AGENT_DIR=self.state_dir)
        cwd = self._home
        if run.cwd:
            cwd, unset = expand_path(run.cwd, env)
            if unset:
                why = (f"cannot enter the working directory {run.cwd}: "
                       f"{', '.join('$' + name for name in unset)} not set on node {self.node}")
                self._record(wire.Result(run.task, run.attempt, None, 0.0, error=why))
                return
        try:
            os.chdir(cwd)  # posix_spawn has no chdir, so the agent (one thread) moves; its own paths are absolute
        except OSError as exc:
            shown = cwd if cwd == run.cwd else f"{run.cwd} ({cwd})"
            why = f"cannot enter the working directory {shown}: {exc.strerror}"
            self._record(wire.Result(run.task, run.attempt, None, 0.0, error=why))
            return
        fds: List[int] = []
        try:
            fds.append(self._spares.take(out_path))
            fds.append(self._spares.take(err_path))
            started_at = time.monotonic()
            pid = os.posix_spawn(
                SHELL,
                [SHELL, "-c", run.command],
                env,
                file_actions=[  # the task opens its files itself: see _Spares.give_back
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, out_path, os.O_RDWR, 0),
                    (os.POSIX_SPAWN_OPEN, 2, err_path, os.O_RDWR, 0),
                ],
                setpgroup=0,
                setsigdef=(signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ),
            )
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            for path in (out_path, err_path):
                if os.path.exists(path):
                    os.unlink(path)
            self._record(wire.Result(run.task, run.attempt, None, 0.0, error=f"could not start: {exc}"))
            return
        task = _Task(run, pid, started_at, fds[0], fds[1], out_path, err_path)
        self._running[task.key] = task
        self._by_pid[pid] = task
        if run.timeout_s is not None:
            self._add_timer(started_at + run.timeout_s, task, "timeout")
        if len(self._running) == 1:
            self._next_progress_at = started_at + self.progress_poll_s
        started = wire.Started(run.task, run.attempt, pid)
        self._journal.append(started)
        self._send(started)

    def _reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            task = self._by_pid.pop(info.si_pid, None)
            self._adopted.pop(info.si_pid, None)
            if task is not None:
                self._signal_group(task, signal.SIGKILL)  # leftovers, while the group id is still ours
            os.waitpid(info.si_pid, 0)
            if task is not None:
                exit_code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                self._finish(task, exit_code)
                if self.reap_orphans:
                    self._ended_since_scan.add(task.key)  # what it left is found at the next scan

    def _finish(self, task: _Task, exit_code: int) -> None:
        runtime_s = time.monotonic() - task.started_at
        del self._running[task.key]
        stdout_tail, stdout_path = self._close_output(task, task.out_fd, task.out_path, "stdout")
        stderr_tail, stderr_path = self._close_output(task, task.err_fd, task.err_path, "stderr")
        self._record(
            wire.Result(
                task.run.task,
                task.run.attempt,
                exit_code,
                runtime_s,
                timed_out=task.timed_out,
                cancelled=task.cancelled,
                stdout_tail=stdout_tail,
                stderr_tail=stderr_tail,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
            )
        )

    def _close_output(self, task: _Task, fd: int, path: str, stream: str) -> Tuple[str, Optional[str]]:
        """The stream's tail and file path, the file cut to the cap with a last line saying so."""
        cap = self.max_output_bytes
        cut = task.capped.get(fd)
        size = os.fstat(fd).st_size
        if size == 0 and cut is None:
            self._spares.give_back(fd, path)
            return "", None
        if cut is None and not (cap and size > cap):
            return _read_tail(fd, path)
        recent = _recent_bytes(fd, size, cut, cap)
        written = max(size, cut.written if cut else 0)
        note = _truncation_note(stream, cap, written)
        os.ftruncate(fd, cap)
        os.pwrite(fd, ("\n" + note + "\n").encode(), cap)
        os.close(fd)
        log(f"task {task.run.task!r} attempt {task.run.attempt}: {note}")
        return _as_text(recent, True) + "\n" + note, path

    def _cap_outputs(self, task: _Task) -> None:
        """Cut a stream file that grew past the cap back to it, remembering its last bytes."""
        cap = self.max_output_bytes
        if not cap:
            return
        for fd in (task.out_fd, task.err_fd):
            size = os.fstat(fd).st_size
            if size <= cap:
                continue
            cut = task.capped.get(fd)
            recent = _recent_bytes(fd, size, cut, cap)
            if cut is None:
                cut = task.capped[fd] = _Cut()
            cut.tail, cut.written, cut.cut_at = recent, max(cut.written, size), size
            if not _punch_hole(fd, cap, size):
                os.ftruncate(fd, cap)  # bytes written between the fstat and here are not counted
            if fd == task.out_fd and task.progress_offset > cap:
                task.progress_offset, task.progress_carry = size, None  # resume after the hole

    def _record(self, result: wire.Result) -> None:
        if self._secrets:
            secrets = sorted(self._secrets, key=len, reverse=True)
            result = dataclasses.replace(
                result, stdout_tail=wire.mask_text(result.stdout_tail, secrets),
                stderr_tail=wire.mask_text(result.stderr_tail, secrets),
                error=None if result.error is None else wire.mask_text(result.error, secrets))
        self._results[wire.key_of(result)] = result
        self._journal.append(result)
        self._send(result)

    def _cancel(self, key: Key) -> None:
        run = self._queued.pop(key, None)
        if run is not None:
            self._record(wire.Result(run.task, run.attempt, None, 0.0, cancelled=True))
        elif key in self._running:
            self._terminate(self._running[key], "cancelled")

    def _terminate(self, task: _Task, reason: str) -> None:
        """SIGTERM the task's group now, SIGKILL it ``grace_s`` later. The first reason sticks."""
        if task.timed_out or task.cancelled:
            return
        if reason == "timeout":
            task.timed_out = True
        else:
            task.cancelled = True
        self._signal_group(task, signal.SIGTERM)
        self._add_timer(time.monotonic() + self.grace_s, task, "kill")

    @staticmethod
    def _signal_group(task: _Task, signum: int) -> None:
        try:
            os.killpg(task.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _begin_shutdown(self, drain: bool) -> None:
        if self._shutdown == "cancel":
            return
        self._shutdown = "drain" if drain else "cancel"
        if drain:
            return
        for run in list(self._queued.values()):
            self._record(wire.Result(run.task, run.attempt, None, 0.0, cancelled=True))
        self._queued.clear()
        for task in list(self._running.values()):
            self._terminate(task, "cancelled")

    # ----------------------------------------------------------------- timers

    def _add_timer(self, when: float, task: _Task, action: str) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), task, action))

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, task, action = heapq.heappop(self._timers)
            if self._running.get(task.key) is not task:
                continue  # it ended meanwhile
            if action == "timeout":
                self._terminate(task, "timeout")
            else:
                self._signal_group(task, signal.SIGKILL)
        if self._running and now >= self._next_progress_at:
            self._poll_progress(now)
            self._next_progress_at = now + self.progress_poll_s
        if self.reap_orphans and self._ended_since_scan and now >= self._next_orphan_scan:
            self._scan_orphans()  # after tasks ended, at most once a second: a scan may read all of /proc
            self._next_orphan_scan = now + ORPHAN_SCAN_S

    def _poll_progress(self, now: float) -> None:
        for task in self._running.values():
            size = os.fstat(task.out_fd).st_size
            if size <= task.progress_offset:
                continue
            chunk = os.pread(task.out_fd, min(size - task.progress_offset, PROGRESS_READ_MAX_BYTES), task.progress_offset)
            task.progress_offset += len(chunk)
            for fraction in _progress_fractions(task, chunk):
                self._send(wire.Progress(task.run.task, task.run.attempt, fraction, now - task.started_at))
        for task in self._running.values():
            self._cap_outputs(task)

    # ----------------------------------------------------------------- leftovers

    def _scan_orphans(self) -> None:
        """Attribute the processes newly re-parented to us (the subreaper) to tasks, and kill,
        with all under them, those whose tasks have all ended."""
        if not self.reap_orphans:
            return
        me = os.getpid()
        running = set(self._running)
        ended, self._ended_since_scan = self._ended_since_scan, set()
        children = _children_of(me)
        if children is not None and children <= set(self._by_pid) | set(self._adopted) and all(
                owners & running for owners in self._adopted.values()):
            return  # nothing new re-parented to us, nothing due: the whole table is not needed
        table = _process_table()
        for pid, parent in table.items():
            if parent != me or pid in self._by_pid or pid in self._adopted:
                continue
            marks = _marks(pid)
            if marks is not None and marks[2] == self.state_dir and marks[1].isdigit():
                self._adopted[pid] = {(marks[0], int(marks[1]))}
            else:  # it cleared its environment: any task running when it was found may own it
                self._adopted[pid] = running | ended
        for pid in [p for p in self._adopted if p not in table]:
            del self._adopted[pid]
        done = [pid for pid, owners in self._adopted.items() if not owners & running]
        if done:
            killed = _kill_all(_subtree(done, table))
            log(f"killed {killed} process(es) that tasks no longer running had left behind "
                f"(re-parented to the agent: {sorted(done)})")

    def _kill_orphans_at_exit(self, timeout_s: float = 5.0) -> None:
        """Nothing a task started outlives the agent: kill and reap every process left."""
        if not self.reap_orphans:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._scan_orphans()  # no task runs now: everything adopted is killed
            table = _process_table()
            if not any(parent == os.getpid() for parent in table.values()):
                return
            pause_until = time.monotonic() + 0.2
            while time.monotonic() < pause_until:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    time.sleep(0.01)
                else:
                    self._adopted.pop(pid, None)
        log(f"processes still left after {timeout_s:g} s: {sorted(self._adopted)}")

    # ----------------------------------------------------------------- journal upkeep

    def _compact(self) -> None:
        live: List[wire.Message] = [wire.Ack(task, attempt) for task, attempt in self._acked]
        live += [wire.Started(t.run.task, t.run.attempt, t.pid) for t in self._running.values()]
        live += list(self._results.values())
        self._journal.rewrite(live)

    def _orphan_result(self, started: wire.Started) -> wire.Result:
        """A task the previous agent started and never saw end: report it, kill it if still there."""
        note = "its outcome is unknown"
        if self._still_ours(started):
            try:
                os.killpg(started.pid, signal.SIGKILL)
                note = "it was still running and has been killed"
            except (ProcessLookupError, PermissionError):
                pass
        log(f"task {started.task!r} attempt {started.attempt} outlived the previous agent: {note}")
        return wire.Result(
            started.task, started.attempt, None, 0.0,
            error=f"the agent stopped while this attempt ran (pid {started.pid}); {note}",
        )  # fmt: skip

    def _still_ours(self, started: wire.Started) -> bool:
        """Whether pid still runs this attempt (its environment carries our markers; Linux only)."""
        try:
            with open(f"/proc/{started.pid}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
        except OSError:
            return False
        marks = {
            os.fsencode(f"BROKER_TASK={started.task}"),
            os.fsencode(f"BROKER_ATTEMPT={started.attempt}"),
            os.fsencode(f"BROKER_AGENT_DIR={self.state_dir}"),
        }
        return marks <= environ


# --------------------------------------------------------------------------- commands


def _lock_state_dir(state_dir: str) -> Optional[int]:
    """Hold the state dir's lock for this process's life; None if another agent holds it."""
    fd = private_open(os.path.join(state_dir, LOCK_NAME), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _prepare_state_dir(path: str) -> str:
    state_dir = os.path.abspath(os.path.expanduser(path))
    private_makedirs(state_dir)
    return state_dir


def _task_umask() -> None:
    """Run tasks (and so this process) with the umask ``BROKER_TASK_UMASK`` names, if valid."""
    text = os.environ.get(TASK_UMASK_ENV, "")
    try:
        value = int(text, 8)
    except ValueError:
        return
    if 0 <= value <= 0o777:
        os.umask(value)


def _batch_scheduling() -> None:
    """``SCHED_BATCH`` for this process and what it starts (see Scheduling), unless
    ``BROKER_TASK_SCHED=normal``; where the system has no such policy nothing changes."""
    if os.environ.get(TASK_SCHED_ENV, "batch") == "normal" or not hasattr(os, "SCHED_BATCH"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        pass


def cmd_serve(args: argparse.Namespace) -> int:
    _batch_scheduling()
    state_dir = _prepare_state_dir(args.state_dir)
    if _lock_state_dir(state_dir) is None:
        if args.stdio:
            log(f"another agent is serving {state_dir}")
            return 1
        return 0  # lost a start-up race to another daemon: the attach reaches that one
    os.chdir(state_dir)
    with open(private_open(PID_NAME, os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(f"{os.getpid()}\n")
    _task_umask()
    subreaper = _become_subreaper()
    agent = Agent(state_dir, args.slots, args.node, args.grace_s, args.idle_exit_s, args.progress_poll_s,
                  args.max_output_bytes, reap_orphans=subreaper, lease_s=args.lease_s,
                  keep_s=args.keep_s, spot_metadata=args.spot_metadata or None,
                  spot_poll_s=args.spot_poll_s)  # fmt: skip
    leftovers = kill_leftovers(state_dir)
    if leftovers:
        log(f"killed {leftovers} process(es) an earlier agent of {state_dir} had left running")
    if not subreaper:
        log("not a child subreaper (not Linux?): only each task's process group is killed when it ends")
    if args.stdio:
        agent.serve_stdio()
    else:
        agent.serve_socket()
    return 0


class AgentStartError(RuntimeError):
    """The agent daemon could not be reached or started (its log's tail is in the message)."""


def _connect(state_dir: str) -> Optional[socket.socket]:
    """A connection to the daemon serving ``state_dir``, or None if none listens there. A
    path past the socket address's 108 bytes is reached through the directory's descriptor."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path, dir_fd = os.path.join(state_dir, SOCKET_NAME), -1
    try:
        if len(os.fsencode(path)) > 100:
            dir_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
            path = f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
    return sock


def _start_daemon(args: argparse.Namespace, state_dir: str) -> subprocess.Popen:
    """The daemon in a session of its own, cut from our stdio, so it survives our channel."""
    # -S: the agent is stdlib-only, and site's .pth files cost a start-up as much again
    argv = [sys.executable, "-B", "-S", AGENT_FILE, "serve", "--state-dir", state_dir] + _common_argv(args)
    with open(private_open(os.path.join(state_dir, LOG_NAME), os.O_WRONLY | os.O_APPEND), "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            cwd=state_dir,
            start_new_session=True,
            close_fds=True,
        )


def _connect_or_start(args: argparse.Namespace, state_dir: str) -> socket.socket:
    sock = _connect(state_dir)
    if sock is not None:
        return sock
    daemon = _start_daemon(args, state_dir)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while time.monotonic() < deadline:
        sock = _connect(state_dir)
        if sock is not None:
            return sock
        code = daemon.poll()
        if code not in (None, 0):
            with open(os.path.join(state_dir, LOG_NAME), "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            raise AgentStartError(f"the agent daemon failed (exit {code}); {state_dir}/{LOG_NAME} ends:\n{tail}")
        time.sleep(0.01)
    raise AgentStartError(f"the agent daemon did not open {state_dir}/{SOCKET_NAME} within {DAEMON_START_TIMEOUT_S:g} s")


def open_connection(args: argparse.Namespace) -> socket.socket:
    """What ``attach`` does before it bridges: the state dir made (0700), finished runs' state
    swept (``--keep-s``), and a connection to the daemon serving it, started if none is.
    ``args``: ``attach``'s (:func:`build_parser`). The master calls it in its own process for
    an agent on its own machine, and speaks on the socket with no bridge process between
    (``broker/shells/local_transport.py``); raises :class:`AgentStartError`."""
    try:
        resolve_output_cap(args)
    except ValueError as exc:
        raise AgentStartError(str(exc)) from None
    state_dir = _prepare_state_dir(args.state_dir)
    if args.keep_s is not None:
        sweep_finished(state_dir, args.keep_s)
    return _connect_or_start(args, state_dir)


def cmd_attach(args: argparse.Namespace) -> int:
    """Bridge stdin/stdout to the daemon; return when the daemon ends the connection."""
    _batch_scheduling()
    try:
        sock = open_connection(args)
    except AgentStartError as exc:
        raise SystemExit(str(exc)) from None

    def pump_stdin() -> None:
        try:
            while True:
                data = os.read(0, 1 << 16)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sock.shutdown(socket.SHUT_WR)  # the master is gone: the daemon detaches it
            except OSError:
                pass

    threading.Thread(target=pump_stdin, daemon=True).start()
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return 0
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
    except OSError:
        return 0


def _common_argv(args: argparse.Namespace) -> List[str]:
    return [
        "--slots", str(args.slots), "--node", args.node, "--grace-s", repr(args.grace_s),
        "--idle-exit-s", repr(args.idle_exit_s), "--progress-poll-s", repr(args.progress_poll_s),
        "--max-output-bytes", str(args.max_output_bytes),
    ] + _lease_argv(args) + _spot_argv(args)  # fmt: skip


def _spot_argv(args: argparse.Namespace) -> List[str]:
    if not args.spot_metadata:
        return []
    return ["--spot-metadata", args.spot_metadata, "--spot-poll-s", repr(args.spot_poll_s)]


# --------------------------------------------------------------------------- lease, stop, clean-up


def _add_lease_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease-s", type=_seconds, default=0.0,
                   help="with no master for this long, cancel the tasks and exit (0: never)")
    p.add_argument("--keep-s", type=_seconds, default=None,
                   help="keep a finished run's state this long once its results are safe, then remove it "
                   "(0: at once; default: for good)")


def _lease_argv(args: argparse.Namespace) -> List[str]:
    argv = ["--lease-s", repr(args.lease_s)]
    return argv + (["--keep-s", repr(args.keep_s)] if args.keep_s is not None else [])


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return value


def mark_finished(state_dir: str) -> None:
    """Record that ``state_dir``'s results are safe (its mtime dates it for ``keep``)."""
    with open(os.path.join(state_dir, FINISHED_NAME), "w") as f:
        f.write(f"{time.time():.0f}\n")


def remove_state(state_dir: str) -> None:
    """Remove ``state_dir``, and its run's directory (the parent) if that is left empty."""
    import shutil

    shutil.rmtree(state_dir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(state_dir))
    except OSError:
        pass  # other nodes' state (several nodes on one host), or already gone


def _held(state_dir: str) -> bool:
    """Whether a live agent holds ``state_dir``'s lock."""
    try:
        fd = os.open(os.path.join(state_dir, LOCK_NAME), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def sweep_finished(state_dir: str, keep_s: float, now: Optional[float] = None) -> List[str]:
    """Remove the finished state directories of every run on this node (``<root>/runs/*/*``,
    ``state_dir`` being one of them) older than ``keep_s``; returns those removed."""
    now = time.time() if now is None else now
    runs = os.path.dirname(os.path.dirname(os.path.abspath(state_dir)))
    removed: List[str] = []
    try:
        run_dirs = [os.path.join(runs, name) for name in os.listdir(runs)]
    except OSError:
        return removed
    for run_dir in run_dirs:
        try:
            nodes = [os.path.join(run_dir, name) for name in os.listdir(run_dir)]
        except OSError:
            continue
        for node_dir in nodes:
            try:
                finished_at = os.stat(os.path.join(node_dir, FINISHED_NAME)).st_mtime
            except OSError:
                continue  # not finished (its results may not be safe): kept
            if now - finished_at >= keep_s and not _held(node_dir):
                remove_state(node_dir)
                removed.append(node_dir)
    return removed


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent.py", description="The broker's worker agent.")
    sub = parser.add_subparsers(dest="command", required=True)
    stop = sub.add_parser("stop", help="stop the agent of a state dir and kill what its tasks left")
    stop.set_defaults(func=cmd_stop)
    stop.add_argument("--state-dir", required=True, help="the agent's directory")
    stop.add_argument("--timeout-s", type=float, default=10.0, help="SIGTERM to SIGKILL delay")
    stop.add_argument("--keep-s", type=_seconds, default=None,
                      help="then treat the state as finished: remove it (0) or leave it this long (default: keep)")
    commands: Dict[str, Callable[[argparse.Namespace], int]] = {"serve": cmd_serve, "attach": cmd_attach}
    for name, func in commands.items():
        p = sub.add_parser(name)
        p.set_defaults(func=func)
        p.add_argument("--state-dir", required=True, help="the agent's directory (created if missing)")
        p.add_argument("--slots", type=_positive_int, required=True, help="tasks run at once")
        p.add_argument("--node", default=socket.gethostname(), help="name reported in the Hello")
        p.add_argument("--grace-s", type=float, default=5.0, help="SIGTERM to SIGKILL delay")
        p.add_argument("--idle-exit-s", type=float, default=0.0, help="exit after this long with no master and no task (0: never)")
        p.add_argument("--progress-poll-s", type=float, default=0.25, help="how often stdout is scanned for progress lines")
        p.add_argument("--max-output-bytes", type=_byte_count, default=None,
                       help=f"keep at most this much of each task's stdout and of its stderr (0: no cap; "
                       f"default ${MAX_OUTPUT_ENV}, else {DEFAULT_MAX_OUTPUT_BYTES})")  # fmt: skip
        p.add_argument("--spot-metadata", metavar="URL", default=None,
                       help=f"this node is a spot instance: poll the instance metadata at URL ({imds.EC2_METADATA_URL} "
                       f"on EC2) for the two-minute interruption notice and report it (default: not on spot)")
        p.add_argument("--spot-poll-s", type=_positive_seconds, default=imds.DEFAULT_POLL_S,
                       help="how often the spot notice is polled for")
        if name == "serve":
            p.add_argument("--stdio", action="store_true", help="speak on stdin/stdout and die with the pipe")
        _add_lease_options(p)
    return parser


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _byte_count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (0: no cap)")
    return value


def resolve_output_cap(args: argparse.Namespace) -> None:
    """``--max-output-bytes`` when not given: ``$BROKER_MAX_OUTPUT_BYTES``, else the default;
    ValueError if the environment's value is not a byte count."""
    if getattr(args, "max_output_bytes", 0) is None:  # serve and attach; stop has none
        from_env = os.environ.get(MAX_OUTPUT_ENV)
        try:
            args.max_output_bytes = DEFAULT_MAX_OUTPUT_BYTES if from_env is None else _byte_count(from_env)
        except (ValueError, argparse.ArgumentTypeError):
            raise ValueError(f"{MAX_OUTPUT_ENV}={from_env!r}: expected a number of bytes >= 0 (0: no cap)") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        resolve_output_cap(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
