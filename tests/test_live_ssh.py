"""Reaching a machine that is still booting: backoff, which failures are waited out, host keys
read from a console."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.shells.ssh import (
    AuthenticationFailed,
    HostKeyUnknown,
    HostUnreachable,
    SshError,
    SshTarget,
    connect_when_up,
    host_keys_from_console,
    write_known_hosts,
)
from tests.sshd import TestSshd

ED = "AAAAC3NzaC1lZDI1NTE5AAAAIEaZ0+9dxwMzw2bm4nn54Xm6mLBsiCBrB0sxM7HpLoSm"


def test_console_keys_come_from_the_last_complete_block_whatever_the_line_prefix() -> None:
    console = (
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        "ssh-rsa AAAAold root@old\n"
        "-----END SSH HOST KEY KEYS-----\n"
        "[   5.1] reboot\n"
        "ec2: -----BEGIN SSH HOST KEY KEYS-----\n"
        f"ec2: ssh-ed25519 {ED} root@ip-10-0-0-9\n"
        "ec2: ecdsa-sha2-nistp256 AAAAE2Vj root@ip-10-0-0-9\n"
        "ec2: not a key line\n"
        "ec2: -----END SSH HOST KEY KEYS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        "ssh-ed25519 AAAAcut-off-mid-block\n"
    )
    assert host_keys_from_console(console) == [("ssh-ed25519", ED), ("ecdsa-sha2-nistp256", "AAAAE2Vj")]
    assert host_keys_from_console("booting...\n") == []


def test_known_hosts_from_console_names_the_port_and_refuses_garbage(tmp_path: Path) -> None:
    path = tmp_path / "kh" / "i-1"
    write_known_hosts(path, "10.0.0.9", 22, [("ssh-ed25519", ED)])
    assert path.read_text() == f"10.0.0.9 ssh-ed25519 {ED}\n"
    assert path.stat().st_mode & 0o777 == 0o600
    write_known_hosts(path, "10.0.0.9", 2222, [("ssh-ed25519", ED)])
    assert path.read_text() == f"[10.0.0.9]:2222 ssh-ed25519 {ED}\n"  # rewritten, not appended
    with pytest.raises(SshError, match="unreadable ssh-ed25519 host key"):
        write_known_hosts(path, "10.0.0.9", 22, [("ssh-ed25519", "AAAAnot-a-key")])


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_closed_port_is_retried_with_doubling_pauses_until_the_timeout(sshd: TestSshd) -> None:
    fake = FakeTime()
    target = SshTarget(host="127.0.0.2", port=sshd.port, user=sshd.user, key_path=str(sshd.client_key_path),
                       known_hosts_path=str(sshd.known_hosts_path))
    with pytest.raises(HostUnreachable, match=r"127\.0\.0\.2.*gave up after 7 attempts in 40 s"):
        connect_when_up(target, 40.0, clock=fake.clock, sleep=fake.sleep)
    assert fake.slept == [1.0, 2.0, 4.0, 8.0, 15.0, 10.0]


def test_a_login_refused_while_cloud_init_installs_the_key_is_waited_out(sshd: TestSshd) -> None:
    authorized = sshd.directory / "authorized_keys"
    key_line = authorized.read_text()
    authorized.write_text("")  # the instance's sshd is up, but its authorized_keys not yet written
    fake = FakeTime()

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if len(fake.slept) == 2:
            authorized.write_text(key_line)

    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, key_path=str(sshd.client_key_path),
                       known_hosts_path=str(sshd.known_hosts_path))
    with connect_when_up(target, 60.0, clock=fake.clock, sleep=sleep) as session:
        assert session.run("echo up").stdout == "up\n"
    assert fake.slept == [1.0, 2.0]
    authorized.write_text("")
    with pytest.raises(AuthenticationFailed, match="gave up after"):
        connect_when_up(target, 5.0, clock=fake.clock, sleep=fake.sleep)


def test_an_unknown_host_key_is_not_waited_out(sshd: TestSshd, tmp_path: Path) -> None:
    fake = FakeTime()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, key_path=str(sshd.client_key_path),
                       known_hosts_path=str(empty))
    with pytest.raises(HostKeyUnknown):
        connect_when_up(target, 60.0, clock=fake.clock, sleep=fake.sleep)
    assert fake.slept == []


def test_fetch_brings_back_a_file_or_a_whole_directory_over_sftp(sshd: TestSshd, tmp_path: Path) -> None:
    from broker.shells.nodes import fetch_over_ssh
    from broker.shells.ssh import connect

    work = tmp_path / "node work"  # a space: the path must survive the remote shell
    (work / "res" / "deep").mkdir(parents=True)
    (work / "res" / "a.csv").write_text("1,2\n")
    (work / "res" / "deep" / "b.bin").write_bytes(bytes(range(256)) * 40)
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, key_path=str(sshd.client_key_path),
                       known_hosts_path=str(sshd.known_hosts_path))
    with connect(target) as session:
        files = fetch_over_ssh(session, "n", str(tmp_path / "$SUB"), "res", tmp_path / "got", {"SUB": "node work"})
        assert sorted(p.relative_to(tmp_path / "got").as_posix() for p in files) == ["res/a.csv", "res/deep/b.bin"]
        assert (tmp_path / "got" / "res" / "deep" / "b.bin").read_bytes() == bytes(range(256)) * 40
        one = fetch_over_ssh(session, "n", None, str(work / "res" / "a.csv"), tmp_path / "one", {})
        assert [p.read_text() for p in one] == ["1,2\n"]
        with pytest.raises(FileNotFoundError, match=r"res/missing does not exist"):
            fetch_over_ssh(session, "n", str(work), "res/missing", tmp_path / "none", {})
        with pytest.raises(FileNotFoundError, match="cannot enter the working directory"):
            fetch_over_ssh(session, "n", str(tmp_path / "nowhere"), "res", tmp_path / "none", {})
