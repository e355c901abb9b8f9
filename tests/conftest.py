"""Suite-wide fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _heartbeat_closes_before_the_databases_go(django_db_setup, django_db_blocker):
    """The lease heartbeat keeps a connection while it renews; let it close it before
    pytest-django drops the test databases."""
    yield
    from durable_agents.engine.leases import wait_idle

    wait_idle(10)
