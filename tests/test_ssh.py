"""The SSH shell against a real OpenSSH server on 127.0.0.1: trust, errors, commands, files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from broker.core.model import PrivateNode
from broker.shells.ssh import (
    AuthenticationFailed,
    SshError,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    KeyFileRejected,
    RemoteCommandTimeout,
    SshTarget,
    connect,
)
import tests.sshd
from tests.sshd import TestSshd, connects_to
from tests.sshd_fixtures import require_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("structlog_defaults")]


def target_for(server: TestSshd, **overrides: object) -> SshTarget:
    fields: dict[str, object] = dict(
        host=server.host,
        port=server.port,
        user=server.user,
        key_path=str(server.client_key_path),
        known_hosts_path=str(server.known_hosts_path),
        connect_timeout_s=5.0,
    )
    fields.update(overrides)
    return SshTarget(**fields)  # type: ignore[arg-type]


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, capture_output=True
    )
    return path


def fingerprint_of(public_key_file: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key_file)], check=True, capture_output=True, text=True)
    return out.stdout.split()[1]


# --------------------------------------------------------------------------- trust


def test_connects_when_host_key_is_in_known_hosts_and_logs_the_connection(sshd: TestSshd) -> None:
    with capture_logs() as events:
        session = connect(target_for(sshd))
        result = session.run("printf out; printf err >&2; exit 3", timeout_s=10)
        session.close()
    assert result == (3, "out", "err")
    connected = [e for e in events if e["event"] == "ssh.connect"]
    assert len(connected) == 1
    assert connected[0]["host"] == "127.0.0.1" and connected[0]["port"] == sshd.port
    assert connected[0]["user"] == sshd.user and connected[0]["ms"] > 0
    assert [e["event"] for e in events].count("ssh.disconnect") == 1


def test_unknown_host_key_is_refused_with_a_message_saying_what_to_do(sshd: TestSshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with capture_logs() as events, pytest.raises(HostKeyUnknown) as refused:
        connect(target_for(sshd, known_hosts_path=str(empty)))
    message = str(refused.value)
    assert f"host key for 127.0.0.1:{sshd.port} is not in known_hosts ({empty})" in message
    assert f"`ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}`" in message
    assert "trust_on_first_use" not in message  # what a user can do, not a parameter they cannot set
    assert fingerprint_of(sshd.directory / "ssh_host_ed25519_key.pub") in message
    assert empty.read_text() == ""
    assert [e["event"] for e in events] == ["ssh.error"]
    assert events[0]["error"] == "HostKeyUnknown"


def test_trust_on_first_use_records_the_key_and_logs_only_its_fingerprint(sshd: TestSshd, tmp_path: Path) -> None:
    known_hosts = tmp_path / "run" / "known_hosts"  # the run's file, not there yet
    with capture_logs() as events:
        connect(target_for(sshd, known_hosts_path=str(known_hosts), trust_on_first_use=True)).close()
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_public_key}\n"
    trusted = [e for e in events if e["event"] == "ssh.host_key_trusted"]
    assert len(trusted) == 1
    assert trusted[0]["fingerprint"] == fingerprint_of(sshd.directory / "ssh_host_ed25519_key.pub")
    assert trusted[0]["key_type"] == "ssh-ed25519"
    key_material = sshd.host_public_key.split()[1]
    assert all(key_material not in repr(e) for e in events)
    # From now on the recorded key is simply verified: no second trust event, no second line.
    with capture_logs() as again:
        connect(target_for(sshd, known_hosts_path=str(known_hosts))).close()
    assert "ssh.host_key_trusted" not in [e["event"] for e in again]
    assert len(known_hosts.read_text().splitlines()) == 1


def test_a_changed_host_key_is_refused_even_with_trust_on_first_use(sshd: TestSshd, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "known_hosts"
    pinned = " ".join(impostor.with_suffix(".pub").read_text().split()[:2])
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {pinned}\n")
    with pytest.raises(HostKeyChanged) as refused:
        connect(target_for(sshd, known_hosts_path=str(known_hosts), trust_on_first_use=True))
    assert "does not match known_hosts" in str(refused.value)
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {pinned}\n"


def test_trust_on_first_use_without_a_known_hosts_file_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="known_hosts_path"):
        SshTarget(host="h", user="u", key_path="k", trust_on_first_use=True)


# --------------------------------------------------------------------------- errors


def test_a_key_the_server_does_not_know_is_refused_clearly(sshd: TestSshd, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    with pytest.raises(AuthenticationFailed) as refused:
        connect(target_for(sshd, key_path=str(stranger)))
    message = str(refused.value)
    assert f"127.0.0.1:{sshd.port} refused key {stranger}" in message
    assert "authorized_keys" in message


def test_a_private_key_readable_by_others_is_refused_before_connecting(sshd: TestSshd) -> None:
    sshd.client_key_path.chmod(0o644)
    with connects_to(sshd.host, sshd.port) as attempts, pytest.raises(KeyFileRejected) as refused:
        connect(target_for(sshd))
    message = str(refused.value)
    assert "permissions 0644" in message and "too open" in message
    assert f"chmod 600 {sshd.client_key_path}" in message
    assert sshd.client_key_path.read_text().splitlines()[1] not in message  # no key material
    assert attempts == []
    sshd.client_key_path.chmod(0o600)  # the same connect, allowed, is seen connecting
    with connects_to(sshd.host, sshd.port) as attempts:
        connect(target_for(sshd)).close()
    assert attempts == [(sshd.host, sshd.port)]


def test_missing_and_garbage_key_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KeyFileRejected, match="does not exist"):
        connect(SshTarget(host="127.0.0.1", port=1, user="u", key_path=str(missing)))
    garbage = tmp_path / "garbage"
    garbage.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----\n")
    garbage.chmod(0o600)
    with pytest.raises(KeyFileRejected, match="not a private key"):
        connect(SshTarget(host="127.0.0.1", port=1, user="u", key_path=str(garbage)))


def test_a_closed_port_is_reported_as_unreachable(sshd: TestSshd) -> None:
    port = sshd.port
    sshd.stop()
    with pytest.raises(HostUnreachable, match=f"cannot reach 127.0.0.1:{port}: connection refused"):
        connect(target_for(sshd))


def test_target_from_an_inventory_node() -> None:
    node = PrivateNode(name="lab-a", slots=4, host="10.0.0.5", user="alice", key="~/.ssh/id_ed25519", port=2222)
    target = SshTarget.for_node(node, known_hosts_path="/run/kh", trust_on_first_use=True)
    assert (target.host, target.port, target.user, target.key_path) == ("10.0.0.5", 2222, "alice", "~/.ssh/id_ed25519")
    assert target.trust_on_first_use and target.known_hosts_path == "/run/kh"
    with pytest.raises(ValueError, match="no host"):
        SshTarget.for_node(PrivateNode(name="here", slots=1, local=True))


# --------------------------------------------------------------------------- commands and files


def test_run_returns_large_outputs_whole(sshd: TestSshd) -> None:
    with connect(target_for(sshd)) as session:
        result = session.run("head -c 3000000 /dev/zero | tr '\\0' a; head -c 200000 /dev/zero | tr '\\0' b >&2", 30)
    assert result.exit_code == 0
    assert result.stdout == "a" * 3_000_000 and result.stderr == "b" * 200_000


def test_run_times_out_and_kills_the_command(sshd: TestSshd, tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    with connect(target_for(sshd)) as session:
        with pytest.raises(RemoteCommandTimeout, match="did not finish within 0.3 s"):
            session.run(f"sleep 1 && touch {marker}", timeout_s=0.3)
        assert session.run("echo alive", 5).stdout == "alive\n"  # the session survives
    subprocess.run(["sleep", "1.5"])
    assert not marker.exists()


def test_put_creates_directories_sets_the_mode_and_replaces_atomically(sshd: TestSshd, tmp_path: Path) -> None:
    local = tmp_path / "local.bin"
    payload = os.urandom(300_000)
    local.write_bytes(payload)
    remote = tmp_path / "remote" / "a" / "b" / "file.bin"
    with connect(target_for(sshd)) as session:
        assert session.put(local, str(remote), mode=0o600) == str(remote)
        assert remote.read_bytes() == payload and (remote.stat().st_mode & 0o777) == 0o600
        local.write_bytes(b"second version")
        session.put(local, str(remote), mode=0o640)
    assert remote.read_bytes() == b"second version" and (remote.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in remote.parent.iterdir()) == ["file.bin"]  # no staging leftovers


def test_deploy_agent_ships_the_files_side_by_side(sshd: TestSshd, tmp_path: Path) -> None:
    sources = []
    for name, text in [("agent.py", "print('agent')\n"), ("protocol.py", "VERSION = 1\n")]:
        (tmp_path / name).write_text(text)
        sources.append(tmp_path / name)
    remote_dir = tmp_path / "node" / ".broker" / "agent"
    with connect(target_for(sshd)) as session:
        deployed = session.deploy_agent(str(remote_dir), sources)
        assert deployed == str(remote_dir)
        assert session.run(f"python3 {deployed}/agent.py", 10).stdout == "agent\n"
    assert (remote_dir / "protocol.py").read_text() == "VERSION = 1\n"


def test_failed_uploads_name_the_file_and_the_reason(sshd: TestSshd, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    local = tmp_path / "payload"
    local.write_text("x")
    with connect(target_for(sshd)) as session:
        with pytest.raises(SshError, match=f"cannot upload {tmp_path / 'missing'} to 127.0.0.1:{sshd.port}:"):
            session.put(tmp_path / "missing", str(tmp_path / "dest"))
        with pytest.raises(SshError, match=f"cannot upload {local} to 127.0.0.1:{sshd.port}:{blocker}/sub/x"):
            session.put(local, str(blocker / "sub" / "x"))
        session.put(local, str(tmp_path / "ok"))  # the session is still usable
    assert (tmp_path / "ok").read_text() == "x"


def test_a_missing_sshd_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tests.sshd, "SSHD_BINARY", str(tmp_path / "no-sshd-here"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the SSH integration tests.*apt-get install"):
        require_sshd()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no-sshd-here not found"):
        require_sshd()
