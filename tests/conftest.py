"""Shared fixtures. Fixtures for real servers live in their own modules, loaded here."""

import pytest
import structlog

pytest_plugins = ["tests.sshd_fixtures", "tests.run_fixtures"]


@pytest.fixture(autouse=True)
def _fresh_structlog():
    """``broker.cli.main`` points structlog at the ``sys.stderr`` of its moment, which under
    pytest is a capture stream closed after the test; reset so later tests log safely."""
    yield
    structlog.reset_defaults()
