"""Suite-wide fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _heartbeat_closes_before_the_databases_go(django_db_setup, django_db_blocker):
    """The lease heartbeat keeps a connection while it renews, the liveness locks one while
    a lease is held; close them before pytest-django drops the test databases."""
    yield
    from durable_agents.engine.leases import wait_idle
    from durable_agents.liveness import close_all

    wait_idle(10)
    close_all()  # a lease a test left held keeps its liveness connection open
