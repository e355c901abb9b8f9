"""The simulator needs no database: keep the suite's session fixture from creating the test
databases when only these tests run (a replay starts in a second, not after a migrate)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _heartbeat_closes_before_the_databases_go():
    yield
