"""A database that fails a statement (a dropped connection, a lock or statement timeout, a
serialization failure) fails the drive for a retry, never the run for good: the store raises
``StorageError`` (``storage.unavailable``, retryable), and the next drive goes on from the
journal without repeating a side effect. Found by the simulator's failing store (issue 32):
before, the drive took the driver's error for a bug of its own (``internal``, not retryable).
On the real PostgreSQL, with a real lock held by another connection."""

from __future__ import annotations

import psycopg
import pytest
from django.db import close_old_connections, connections

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo
from durable_agents.models import Run
from tests.support.agents import count_effects, crash_agents
from tests.support.doubles import hooks_at_points

pytestmark = pytest.mark.django_db(transaction=True)

SIDE_EFFECT = next(a for a in crash_agents if a.name == "crash-side_effect")


def _other_connection() -> psycopg.Connection:
    settings = connections["default"].settings_dict
    return psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"]
    )


def test_a_dropped_connection_is_a_retryable_storage_error_and_the_next_call_reconnects():
    store = DjangoStore()
    store.create_run(RunInfo("blip-drop", agent="echo"))
    pid = connections["default"].connection.info.backend_pid
    with _other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(da.StorageError) as failed:
        store.get_run("blip-drop")
    assert failed.value.code == "storage.unavailable" and failed.value.retryable
    close_old_connections()  # what a worker does between tasks
    assert store.get_run("blip-drop") is not None


def test_a_statement_the_database_gives_up_on_fails_the_drive_for_a_retry(monkeypatch):
    """Mid-run (the first call's result recorded), another connection holds the journal
    locked and this one gives up waiting (``lock_timeout``): the drive fails retryable, the
    run is not failed for good, and the next drive finishes it with each effect once."""
    run_id = "blip-lock"
    other = _other_connection()
    at_point = hooks_at_points(monkeypatch)

    def lock_the_journal() -> None:
        other.execute("LOCK TABLE durable_agents_journalentry IN ACCESS EXCLUSIVE MODE")
        with connections["default"].cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")

    at_point("after-result:call_1_1", lock_the_journal)
    try:
        SIDE_EFFECT.start("go", run_id=run_id)  # the inline worker logs the failed drive
    finally:
        other.rollback()  # the lock goes
        other.close()
    with connections["default"].cursor() as cursor:
        cursor.execute("SET lock_timeout = 0")
    row = Run.objects.get(run_id=run_id)
    assert row.status == "failed"
    assert row.last_error["code"] == "storage.unavailable" and row.last_error["retryable"]
    assert count_effects(run_id) == {"call_1_1": 1}

    assert da.resume(run_id).answer == "all done"
    assert count_effects(run_id) == {"call_1_1": 1, "call_1_2": 1, "call_2_1": 1}
