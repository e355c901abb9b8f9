"""Suite-wide fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _heartbeat_closes_before_the_databases_go(django_db_setup, django_db_blocker):
    """The lease heartbeat keeps a connection while it renews, the liveness locks one while
    a lease is held; close them before pytest-django drops the test databases."""
    yield
    from durable_agents.database.liveness import close_all
    from durable_agents.engine.leases import wait_idle

    wait_idle(10)
    close_all()  # a lease a test left held keeps its liveness connection open


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup):
    """A PgBouncer of the session's own, transaction pooling, in front of 127.0.0.1:5432
    (``tests/support/pgbouncer.py``); stopped before the test databases are dropped (its
    server connections would keep them). A missing or broken pgbouncer fails the test."""
    from tests.support.pgbouncer import PgBouncer

    bouncer = PgBouncer()
    bouncer.start()
    yield bouncer
    bouncer.stop()


# The simulator's fresh seeds (tests/simulation/test_simulation.py): drawn once per run of
# the suite, here in the main process, so every worker explores the same range and the
# summary can name it.
FRESH_SEEDS = 150
# And the PostgreSQL lane's, right after them (about 3 s a seed there).
PG_FRESH_SEEDS = 6


# The longest files, started first: the suite runs a file per worker at a time
# (``--dist loadfile``), and one of these begun last keeps one worker busy minutes after the
# other is done. Their order here is their order in the run; every other file keeps its own.
LONGEST_FIRST = (
    "tests/simulation/test_mutations.py",
    "tests/simulation/test_mutations_second_half.py",
    "tests/simulation/test_simulation.py",
    "tests/simulation/test_postgres_lane.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    import os
    import secrets

    if not hasattr(config, "workerinput") and not os.environ.get("SIM_FRESH"):
        os.environ["SIM_FRESH"] = str(1_000_000 + secrets.randbelow(1_000_000_000))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    import os

    base = os.environ.get("SIM_FRESH")
    # (Not for a sweep's range of its own, ``scripts/sim-sweep``: these did not run.)
    if base and not hasattr(config, "workerinput") and not os.environ.get("SIM_PG_FRESH"):
        last = int(base) + FRESH_SEEDS - 1
        pg_last = last + PG_FRESH_SEEDS
        terminalreporter.write_line(
            f"simulator: fresh seeds {base}-{last} this run; again: SIM_FRESH={base} "
            ".venv/bin/python -m pytest tests/simulation/test_simulation.py -k fresh"
        )
        terminalreporter.write_line(
            f"simulator: fresh seeds {last + 1}-{pg_last} on PostgreSQL; again: "
            f"SIM_FRESH={base} .venv/bin/python -m pytest "
            "tests/simulation/test_postgres_lane.py -k fresh"
        )
