"""Fetching a task's declared outputs from where it ran: this machine (a local agent) or a
node reached over SSH (SFTP), with paths expanded as the agent expands them."""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
from pathlib import Path
from typing import Any, Mapping

from broker.shells.private_files import make_private, private_dir


def fetch_local(workdir: str | None, path: str, dest: Path, env: Mapping[str, str]) -> list[Path]:
    """Copy ``path`` (relative to ``workdir``, both expanded as the agent does) into ``dest``."""
    from workers.agent import expand_path

    full_env = {**os.environ, **env}
    base = os.environ.get("HOME") or "/"
    if workdir:
        base, unset = expand_path(workdir, full_env)
        if unset:
            raise FileNotFoundError(f"workdir {workdir} names {', '.join('$' + n for n in unset)}, which is not set")
    source = Path(base, expand_path(path, full_env)[0])
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    target = Path(dest) / (source.name or "output")
    private_dir(target.parent)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
        make_private(target)  # copytree gives the copies their source's modes
        return sorted(p for p in target.rglob("*") if p.is_file())
    shutil.copy2(source, target)
    make_private(target)
    return [target]


def fetch_over_ssh(session: Any, node: str, workdir: str | None, path: str, dest: Path,
                   env: Mapping[str, str]) -> list[Path]:
    """Fetch ``path`` (relative to ``workdir``, which the node's shell expands with the
    bag's ``env``, as the agent does) from ``node`` over SFTP into ``dest``."""
    if session is None or not session.alive:
        raise ConnectionError(f"no SSH connection to {node} to fetch outputs over")
    if not (path.startswith("/") or path == "~" or path.startswith("~/")):
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
        where = f"cd {_shell_word(workdir)} && " if workdir else ""
        resolved = session.run(f"{exports}{where}pwd -P", timeout_s=30.0)
        if resolved.exit_code != 0 or not resolved.stdout.strip():
            raise FileNotFoundError(f"cannot enter the working directory {workdir} on {node}: "
                                    f"{resolved.stderr.strip() or f'exit code {resolved.exit_code}'}")
        path = posixpath.join(resolved.stdout.strip().splitlines()[-1], path)
    files = session.fetch(path, dest)
    make_private(dest)
    return files


def _shell_word(path: str) -> str:
    """``path`` as one shell word in which ``~`` (leading) and ``$VAR`` expand, nothing else."""
    head = ""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        head, path = "~/", path[2:]
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'{head}"{escaped}"'
