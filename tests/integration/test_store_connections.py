"""The store's statements on PostgreSQL: its reusable cursor and its statements prepared
through libpq do not outlive their connection (a worker that reconnects for every task,
``CONN_MAX_AGE = 0``, must not keep every closed connection); statements psycopg deallocated
are prepared again; in a transaction they go through psycopg and roll back with it; errors
and values keep their types."""

from __future__ import annotations

import gc
import json

import psycopg
import pytest
from django.db import DataError, connections, transaction
from psycopg.types.json import Jsonb

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo

pytestmark = pytest.mark.django_db(transaction=True)


def _closed_connections() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, psycopg.Connection) and o.closed)


def test_a_closed_connection_and_its_cursor_are_let_go():
    store = DjangoStore()
    store.create_run(RunInfo("conn-1", agent="echo"))
    store.get_run("conn-1")  # the store's prepared-statement cursor on this connection
    before = _closed_connections()
    for _ in range(5):
        connections["default"].close()
        assert store.get_run("conn-1") is not None  # a new connection, a new cursor
    assert _closed_connections() <= before + 1, "closed connections kept alive"


def test_statements_psycopg_deallocated_are_prepared_again():
    """psycopg sends ``DEALLOCATE ALL`` after a schema change it ran; the store's statements
    prepared through libpq (``durable_agents.database.prepared``) are prepared again, and run
    once."""
    store = DjangoStore()
    store.create_run(RunInfo("conn-2", agent="echo"))
    assert store.insert("conn-2", "step:a", '{"kind":"value"}')[1]  # prepared now
    with connections["default"].cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert store.insert("conn-2", "step:b", '{"kind":"value"}')[1]
    assert [e.name for e in store.load("conn-2")] == ["step:a", "step:b"]


def test_a_store_write_inside_a_transaction_rolls_back_with_it():
    """In a transaction the store's statements go through psycopg's cursor, which opens it:
    they commit or roll back with the site's own writes."""
    store = DjangoStore()
    store.create_run(RunInfo("conn-3", agent="echo"))
    with pytest.raises(RuntimeError), transaction.atomic():
        store.insert("conn-3", "step:a", '{"kind":"value"}')
        assert store.get("conn-3", "step:a") is not None
        raise RuntimeError("the site's transaction fails")
    assert store.get("conn-3", "step:a") is None
    assert store.insert("conn-3", "step:a", '{"kind":"value"}')[1]


@pytest.mark.parametrize("builder", ["psycopg's", "by SQLSTATE"])
def test_a_failed_statement_raises_djangos_error_of_its_class(builder, monkeypatch):
    if builder == "by SQLSTATE":  # a psycopg without its private error builder
        monkeypatch.delattr(psycopg.errors, "error_from_result")
    store = DjangoStore()
    with pytest.raises(DataError, match="division by zero"):
        store._fetchone("SELECT 1 / %s", [0])
    assert store._fetchone("SELECT %s::int + 1", [1]) == (2,)


def test_parameters_and_results_keep_their_types():
    """The same values both ways through libpq as through psycopg's cursor (which the
    store uses inside a transaction)."""
    store = DjangoStore()
    sql = "SELECT %s::text, %s::bigint, %s::int, %s::bool, %s::jsonb, %s::text[], %s, now()"
    params = ["é ✓", 2**40, 7, True, Jsonb({"a": [1, None]}), ["x", "y"], None]
    fast = store._fetchone(sql, params)
    with transaction.atomic():
        through_cursor = store._fetchone(sql, params)
    assert fast[:7] == through_cursor[:7]
    assert fast[:4] == ("é ✓", 2**40, 7, True) and fast[5:7] == (["x", "y"], None)
    assert json.loads(fast[4]) == {"a": [1, None]}  # jsonb as text, for Django to parse
    assert fast[7].tzinfo is not None and type(fast[7]) is type(through_cursor[7])


def test_a_kept_connection_the_server_dropped_is_replaced_under_health_checks():
    """With ``CONN_MAX_AGE`` and ``CONN_HEALTH_CHECKS`` (a worker that keeps its connection
    between tasks: docs/celery.md), a connection the server dropped since the last task is
    checked and replaced before the store's first statement, as Django does for its own
    cursors; the store's fast path does not fail on it."""
    from django.db import close_old_connections

    conn = connections["default"]
    saved = {k: conn.settings_dict[k] for k in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS")}
    conn.settings_dict.update(CONN_MAX_AGE=600, CONN_HEALTH_CHECKS=True)
    try:
        conn.close()
        store = DjangoStore()
        store.create_run(RunInfo("conn-5", agent="echo"))
        assert store.get_run("conn-5") is not None  # a kept connection, statements prepared
        dropped = conn.connection.info.backend_pid
        with psycopg.connect(**_params(conn)) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [dropped])
        close_old_connections()  # a task's end and the next one's start: kept, not closed
        assert conn.connection is not None
        assert store.get_run("conn-5") is not None  # checked, reconnected, prepared again
        assert conn.connection.info.backend_pid != dropped
    finally:
        conn.close()
        conn.settings_dict.update(saved)


def _params(conn) -> dict:
    params = conn.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return {**params, "autocommit": True}
