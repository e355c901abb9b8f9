"""The memory lane needs no database: keep the suite's session fixture from creating the
test databases when only its tests run (a replay starts in a second, not after a migrate).
The PostgreSQL lane (``test_postgres_lane.py``) asks for the database itself."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _heartbeat_closes_before_the_databases_go():
    yield
