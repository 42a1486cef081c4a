"""pytest fixtures for a real OpenSSH server on 127.0.0.1 (see ``tests/sshd.py``).

``sshd`` starts one server per test (about 30 ms), so a test may drop its connections or
break its keys without disturbing others. When sshd is not installed the tests are skipped
with the reason, except under CI (``CI=true``), where a missing sshd is a failure: CI must
run them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
import structlog

from tests.sshd import INSTALL_HINT, TestSshd, running_sshd, sshd_missing_reason


def require_sshd() -> None:
    """Skip (or, under CI, fail) the calling test when no sshd can be started here."""
    reason = sshd_missing_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the SSH integration tests, but {reason}. {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"real-sshd test not run: {reason}")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[TestSshd]:
    """A fresh sshd on 127.0.0.1 with its own host key, user key and known_hosts."""
    require_sshd()
    with running_sshd(tmp_path / "sshd") as server:
        yield server


@pytest.fixture(scope="module")
def structlog_defaults() -> Iterator[None]:
    """structlog as a fresh process has it, whatever an earlier test configured.

    ``broker.cli.main`` points structlog at the ``sys.stderr`` of its moment, which under
    pytest is a capture stream closed after that test; every later log call would raise.
    """
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
