"""Shared fixtures. Fixtures for real servers live in their own modules, loaded here."""

import os

import pytest
import structlog
from hypothesis import settings

# In CI the property tests draw the same examples every run (derandomized): a red CI then
# means a change broke something, not that this run drew an unlucky example, and the run
# takes the same time each time. Locally they draw fresh examples, exploring further.
# No profile has hypothesis's per-example deadline (200 ms by default): that is a wall-clock
# limit, and on a loaded machine a correct example can take longer (a pool test's took 253 ms).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")

pytest_plugins = ["tests.sshd_fixtures", "tests.run_fixtures"]


@pytest.fixture(autouse=True)
def _fresh_structlog():
    """``broker.cli.main`` points structlog at the ``sys.stderr`` of its moment, which under
    pytest is a capture stream closed after the test; reset so later tests log safely."""
    yield
    structlog.reset_defaults()
