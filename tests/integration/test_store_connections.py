"""The store's reusable cursor on PostgreSQL does not outlive its connection: a worker that
reconnects for every task (``CONN_MAX_AGE = 0``) must not keep every closed connection."""

from __future__ import annotations

import gc

import psycopg
import pytest
from django.db import connections

from durable_agents.engine.ports import RunInfo
from durable_agents.storage import DjangoStore

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
