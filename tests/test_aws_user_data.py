"""deploy/user-data.sh: valid bash that prepares the agent's user and directory offline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

USER_DATA = Path(__file__).resolve().parent.parent / "deploy" / "user-data.sh"


def test_user_data_is_valid_bash_for_cloud_init() -> None:
    text = USER_DATA.read_text()
    assert text.startswith("#!/bin/bash\n")  # cloud-init runs user-data with a shebang as a script
    bash = shutil.which("bash")
    assert bash is not None
    checked = subprocess.run([bash, "-n", str(USER_DATA)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert len(text.encode()) < 16 * 1024  # EC2's user-data limit


def test_user_data_never_reaches_the_network() -> None:
    code = "\n".join(line for line in USER_DATA.read_text().splitlines() if not line.lstrip().startswith("#"))
    network_tools = r"curl|wget|apt-get|apt|yum|dnf|zypper|pip3?|nc|ncat|ssh|scp|rsync|git"
    commands = re.findall(rf"(?:^|[;&|($\s])({network_tools})(?=\s|$)", code, re.M)
    assert commands == [], f"user-data runs {sorted(set(commands))}"
    assert "://" not in code


def test_user_data_prepares_the_agent_user_and_directory() -> None:
    text = USER_DATA.read_text()
    assert re.search(r"^AGENT_USER=broker$", text, re.M)
    assert re.search(r"^AGENT_DIR=/opt/broker-agent$", text, re.M)
    assert "useradd" in text and "authorized_keys" in text and "python3" in text
