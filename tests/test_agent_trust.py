"""Trust on a node: what a task leaves running is reaped, secrets are masked, files are private.

Real agent daemons over local pipes (the ``agent_dir`` fixture of test_agent.py stops each
one and fails the test if a process carrying its marker survives). The daemons the tasks
start here detach as a daemon does (``setsid`` and a double fork, some also with their
environment cleared so no marker gives them away) and write their pid to a file, which is
how the tests find them.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from broker.shells.local_transport import local_agent_pid, stop_local_agent
from tests.test_agent import agent_dir, connect, results_until, wait_until  # noqa: F401 - agent_dir: fixture
from workers.protocol import Result, Run, Started

# A daemon: a new session, a middle process that forks it and exits, the grandchild sleeping.
# Its pid and its session id (the middle process's pid) go to PIDFILE. With CLEAR, it also
# starts with an empty environment.
DAEMON = ("{clear}setsid sh -c 'sleep 1000 </dev/null >/dev/null 2>&1 & echo \"$! $$\" > {pidfile}' "
          "</dev/null >/dev/null 2>&1")


def daemon_command(pidfile: Path, clear: bool = False, then: str = "") -> str:
    command = DAEMON.format(clear="env -i PATH=/usr/bin:/bin " if clear else "", pidfile=pidfile)
    return f"{command}; while [ ! -s {pidfile} ]; do sleep 0.01; done{then}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def daemon_pid(pidfile: Path) -> int:
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 5.0)
    return int(pidfile.read_text().split()[0])


def daemon_session(pidfile: Path) -> int:
    return int(pidfile.read_text().split()[1])


@pytest.fixture
def pids():
    """Pids the test saw; any still alive at the end is killed (and the test fails)."""
    seen: list[int] = []
    yield seen
    left = [pid for pid in seen if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"daemons outlived the test: {left}"


# -- reaping --------------------------------------------------------------------------------
@pytest.mark.parametrize("clear", [False, True], ids=["marked", "environment-cleared"])
def test_a_daemon_a_task_started_is_killed_once_the_task_has_ended(agent_dir, tmp_path, pids, clear):
    client = connect(agent_dir, slots=2)
    pidfile = tmp_path / "daemon.pid"
    client.submit([Run("starter", 1, daemon_command(pidfile, clear))])
    results, _ = results_until(client, 1)
    assert results[("starter", 1)].exit_code == 0
    pids.append(daemon_pid(pidfile))
    assert daemon_session(pidfile) != os.getsid(local_agent_pid(agent_dir))  # it really left the task's session
    # The agent keeps running (no stop): the daemon is found at its next scan and killed.
    assert wait_until(lambda: not alive(pids[0]), 10.0), "the daemon outlived its task"
    assert local_agent_pid(agent_dir) is not None
    client.close()


def test_a_daemon_of_a_task_still_running_is_left_alone_until_that_task_ends(agent_dir, tmp_path, pids):
    client = connect(agent_dir, slots=2)
    pidfile = tmp_path / "daemon.pid"
    client.submit([Run("server", 1, daemon_command(pidfile, then="; sleep 3"))])
    pids.append(daemon_pid(pidfile))
    time.sleep(2.0)  # while the task runs, its daemon is its own business
    assert alive(pids[0])
    results_until(client, 1, timeout_s=10.0)
    assert wait_until(lambda: not alive(pids[0]), 10.0)
    client.close()


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_daemon_of_a_timed_out_or_cancelled_task_is_killed(agent_dir, tmp_path, pids, how):
    client = connect(agent_dir, slots=1)
    pidfile = tmp_path / "daemon.pid"
    client.submit([Run("stuck", 1, daemon_command(pidfile, then="; sleep 100"),
                       timeout_s=1.0 if how == "timeout" else None)])
    pids.append(daemon_pid(pidfile))
    if how == "cancel":
        client.cancel([("stuck", 1)])
    results, _ = results_until(client, 1, timeout_s=15.0)
    assert results[("stuck", 1)].timed_out == (how == "timeout")
    assert results[("stuck", 1)].cancelled == (how == "cancel")
    assert wait_until(lambda: not alive(pids[0]), 10.0)
    client.close()


def test_when_the_agent_stops_nothing_its_tasks_started_remains(agent_dir, tmp_path, pids):
    client = connect(agent_dir, slots=2)
    marked, cleared = tmp_path / "a.pid", tmp_path / "b.pid"
    client.submit([Run("a", 1, daemon_command(marked, then="; sleep 100")),
                   Run("b", 1, daemon_command(cleared, clear=True, then="; sleep 100"))])
    pids.extend([daemon_pid(marked), daemon_pid(cleared)])
    agent = local_agent_pid(agent_dir)
    stop_local_agent(agent_dir, timeout_s=10.0)  # SIGTERM: the agent cancels, kills what is left, exits
    assert not alive(pids[0]) and not alive(pids[1])  # gone before the agent said it stopped
    assert wait_until(lambda: not alive(agent), 5.0)
    client.close()


def test_broker_down_kills_the_daemons_of_an_agent_that_was_killed(agent_dir, tmp_path, pids):
    """SIGKILL leaves the agent no chance: its tasks' daemons are re-parented elsewhere. Stopping
    the node's agent (what `broker down` does) still finds them by the state dir they carry."""
    client = connect(agent_dir, slots=1)
    pidfile = tmp_path / "daemon.pid"
    client.submit([Run("a", 1, daemon_command(pidfile, then="; sleep 100"))])
    pids.append(daemon_pid(pidfile))
    os.kill(local_agent_pid(agent_dir), signal.SIGKILL)
    assert wait_until(lambda: local_agent_pid(agent_dir) is None, 5.0)
    assert alive(pids[0])
    stop_local_agent(agent_dir)
    assert wait_until(lambda: not alive(pids[0]), 5.0)
    client.close()


def test_a_scan_reads_the_whole_process_table_only_when_something_new_was_re_parented(tmp_path, monkeypatch):
    """Where the kernel lists a process's children (/proc/PID/task/PID/children), a scan after
    a task ended costs one read unless a process the agent does not know is among them."""
    import workers.agent as agent_module

    agent = agent_module.Agent(str(tmp_path / "state"), 1, "node", reap_orphans=True)
    tables = []
    monkeypatch.setattr(agent_module, "_process_table", lambda: tables.append(1) or {})
    monkeypatch.setattr(agent_module, "_children_of", lambda pid: set())
    agent._ended_since_scan.add(("t", 1))
    agent._scan_orphans()
    assert tables == [] and not agent._ended_since_scan
    monkeypatch.setattr(agent_module, "_children_of", lambda pid: {999_999_999})  # a stranger among them
    agent._scan_orphans()
    assert tables == [1]


# -- secrets --------------------------------------------------------------------------------
TOKEN = "tok-live-4f9a8c1e2b7d6e5f"


def test_secrets_are_masked_in_the_agents_journal_log_and_results_not_in_task_output(agent_dir, tmp_path):
    client = connect(agent_dir)
    env = {"API_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    client.submit([
        Run("leaky", 1, 'echo "out $API_TOKEN"; echo "err $API_TOKEN" >&2; exit 3', env=env),
        Run("lost", 1, "true", env=env, cwd=str(tmp_path / "no-such-dir-$API_TOKEN")),
    ])
    results, _ = results_until(client, 2)
    leaky, lost = results[("leaky", 1)], results[("lost", 1)]
    assert (leaky.stdout_tail, leaky.stderr_tail) == ("out ***\n", "err ***\n")
    assert lost.error is not None and "no-such-dir-***" in lost.error and TOKEN not in lost.error
    # The task's output is the user's own: exactly what it wrote, in files named by task only.
    assert Path(leaky.stdout_path).read_text() == f"out {TOKEN}\n"
    assert Path(leaky.stderr_path).read_text() == f"err {TOKEN}\n"
    assert sorted(p.name for p in (agent_dir / "out").iterdir()) == ["leaky.1.stderr", "leaky.1.stdout"]
    client.close()
    stop_local_agent(agent_dir)  # the journal and the log are complete once it has stopped
    for name in ("journal", "agent.log"):
        text = (agent_dir / name).read_bytes()
        assert TOKEN.encode() not in text, f"the token is in {name}"
    assert b"out ***" in (agent_dir / "journal").read_bytes()  # the results are in it, masked


# -- permissions ----------------------------------------------------------------------------
def assert_private_tree(root: Path) -> list[Path]:
    """Every directory under ``root`` (and root) is 0700, every other entry 0600 (a socket
    0700 or less); returns what was checked."""
    checked = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, f"{path} is {mode:04o}"
        elif stat.S_ISSOCK(path.lstat().st_mode):
            assert mode & 0o077 == 0, f"{path} is {mode:04o}"
        else:
            assert mode == 0o600, f"{path} is {mode:04o}"
        checked.append(path)
    return checked


def test_the_agents_files_are_private_whatever_the_umask_and_tasks_keep_theirs(agent_dir, tmp_path, monkeypatch):
    """The agent is started under umask 022 (and a second time under 0: no mask at all); its
    state dir was made 0755 beforehand, as an older broker did. Tasks get the umask the
    broker hands on in BROKER_TASK_UMASK."""
    work = tmp_path / "work"
    work.mkdir()
    agent_dir.mkdir(mode=0o755)
    os.chmod(agent_dir, 0o755)
    monkeypatch.setenv("BROKER_TASK_UMASK", "0022")
    for umask in (0o022, 0o000):
        previous = os.umask(umask)
        try:
            client = connect(agent_dir)
        finally:
            os.umask(previous)
        client.submit([Run(f"t{umask}", 1, f"echo out; echo err >&2; touch {work}/made-{umask}")])
        results_until(client, 1)
        client.close()
        stop_local_agent(agent_dir)
        checked = assert_private_tree(agent_dir)
        assert {p.name for p in checked} >= {"agent", "out", "journal", "agent.log", "agent.lock",
                                             f"t{umask}.1.stdout", f"t{umask}.1.stderr"}
        assert stat.S_IMODE((work / f"made-{umask}").stat().st_mode) == 0o644  # the user's umask, not ours


@pytest.mark.sshd
def test_the_agents_files_are_private_on_a_node_reached_over_ssh(sshd, tmp_path):
    """Shipped by SFTP and started over the real sshd on 127.0.0.1 (its login umask: 022)."""
    from broker.shells.nodes import open_remote_agent_stream
    from broker.shells.agent_client import AgentClient
    from tests.test_ssh_agent import session_for

    root = tmp_path / "remote" / ".broker"
    previous = os.umask(0o022)
    try:
        session = session_for(sshd)
        client = AgentClient(open_remote_agent_stream(session, "run-1", "node-a", 1, str(root)), "node-a")
    finally:
        os.umask(previous)
    try:
        client.submit([Run("t", 1, "echo out; echo err >&2")])
        results_until(client, 1)
    finally:
        client.close()
        session.close()
        stop_local_agent(root / "runs" / "run-1" / "node-a")
    checked = assert_private_tree(root)
    assert {p.name for p in checked} >= {".broker", "agent", "agent.py", "protocol.py", "runs", "run-1", "node-a",
                                         "out", "journal", "agent.log", "t.1.stdout", "t.1.stderr"}
