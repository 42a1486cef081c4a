"""Host keys for :mod:`broker.shells.ssh`: known_hosts files, the policy for a key no file
holds (refuse it, or trust it on first use when the target opts in), and the keys cloud-init
prints on an instance's console."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import paramiko
import structlog

from broker.shells.ssh_errors import HostKeyUnknown, SshError

if TYPE_CHECKING:
    from broker.shells.ssh import SshTarget

log = structlog.get_logger()


def load_known_hosts(client: paramiko.SSHClient, target: SshTarget) -> None:
    if target.known_hosts_path is None:
        client.load_system_host_keys()
        return
    path = Path(target.known_hosts_path).expanduser()
    if path.exists():
        client.load_host_keys(str(path))


class UnknownHostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse a host key absent from known_hosts, or record it if the target trusts on first use."""

    def __init__(self, target: SshTarget) -> None:
        self._target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        target = self._target
        if not target.trust_on_first_use:
            raise HostKeyUnknown(unknown_host_key_message(target, key.get_name(), key.fingerprint))
        assert target.known_hosts_path is not None  # enforced by SshTarget
        path = Path(target.known_hosts_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        # One write on an O_APPEND descriptor: concurrent connects cannot interleave lines.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("ascii"))
        finally:
            os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "ssh.host_key_trusted",
            host=target.host,
            port=target.port,
            key_type=key.get_name(),
            fingerprint=key.fingerprint,
            known_hosts=str(path),
        )


def unknown_host_key_message(target: SshTarget, key_type: str, fingerprint: str) -> str:
    """What to do about a host key that no known_hosts file holds: only steps the user can
    take (check the fingerprint, add the key; for an inventory node, name a file that has it)."""
    where = target.known_hosts_path or "~/.ssh/known_hosts"
    scan = f"ssh-keyscan{'' if target.port == 22 else f' -p {target.port}'} {target.host}"
    text = (f"host key for {target.address} is not in known_hosts ({where}): it offered {key_type} {fingerprint}. "
            f"Check that fingerprint with the machine itself (ssh-keygen -lf on its host key), then add "
            f"the key: `{scan} >> {where}` (or log in once with ssh and accept it)")
    if target.label is not None and target.label.startswith("private node "):
        name = target.label[len("private node "):]
        text += f"; or give private node {name} a known_hosts: file in the inventory that holds it"
    return text


_CONSOLE_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
_CONSOLE_END = "-----END SSH HOST KEY KEYS-----"
_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


def host_keys_from_console(text: str) -> list[tuple[str, str]]:
    """The host public keys cloud-init printed on a machine's console, as ``(type, base64)``.

    cloud-init writes them between ``-----BEGIN SSH HOST KEY KEYS-----`` and ``-----END
    SSH HOST KEY KEYS-----``; the last complete block counts (a reboot prints another).
    Lines may carry a prefix (``ec2: ``, a kernel timestamp). ``[]`` if there is no block yet.
    """
    blocks: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        if _CONSOLE_BEGIN in line:
            current = []
        elif _CONSOLE_END in line:
            if current is not None:
                blocks.append(current)
            current = None
        elif current is not None:
            words = line.split()
            for i, word in enumerate(words[:-1]):
                if word in _KEY_TYPES:
                    current.append((word, words[i + 1]))
                    break
    return blocks[-1] if blocks else []


def known_hosts_entry_name(host: str, port: int) -> str:
    """How OpenSSH (and paramiko) name a host in known_hosts: ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def write_known_hosts(path: str | os.PathLike[str], host: str, port: int, keys: Sequence[tuple[str, str]]) -> None:
    """Write ``keys`` as the only known keys of ``host:port`` in a fresh file at ``path`` (mode 600)."""
    name = known_hosts_entry_name(host, port)
    for key_type, blob in keys:  # refuse garbage before it becomes a trusted entry
        try:
            paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True))
        except Exception as exc:  # noqa: BLE001 - any parse failure means "not a key"
            raise SshError(f"console output of {host} holds an unreadable {key_type} host key "
                           f"({type(exc).__name__})") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{name} {key_type} {blob}\n" for key_type, blob in keys)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
