"""The durability dial (issue 17): which transactions of a run commit with
``synchronous_commit = off`` in ``durability="async"``, read from the statements PostgreSQL
is sent.

Every statement any psycopg cursor executes (the store's prepared cursor and Django's own)
is recorded with whether it ran as its own transaction (autocommit, no transaction open).
The agent's turns call, in order, a read-only tool, an idempotent one and one with a side
effect, then answer: only the records that are safe to redo may lag (docs/durability.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from django.db import connections

import durable_agents as da
from durable_agents.database.prepared import Prepared
from durable_agents.database.store import DjangoStore
from durable_agents.engine.errors import ConfigError
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.stores import DB

pytestmark = DB

_J = "durable_agents_journalentry"
DIAL = "synchronous_commit"


@da.tool(read_only=True)
def look(item: str) -> dict:
    """Look an item up."""
    return {"item": item, "stock": 3}


@da.tool(idempotent=True)
def notify(item: str, ctx: da.ToolContext) -> dict:
    """Send a notice about an item (deduplicated by the idempotency key)."""
    return {"sent": ctx.idempotency_key}


@da.tool
def charge(item: str) -> dict:
    """Charge for an item: a side effect, at most once."""
    return {"charged": item}


SCRIPT = [
    scripted.calls(scripted.call("look", {"item": "a"}, id="c1")),
    scripted.calls(scripted.call("notify", {"item": "a"}, id="c2")),
    scripted.calls(scripted.call("charge", {"item": "a"}, id="c3")),
    scripted.calls(scripted.call("look", {"item": "b"}, id="c4"), text="checking"),
    scripted.text("Done."),
]

# What may lag in "async": turns that ask only for read-only tools (model:1, model:4) or for
# a tool with an attempt claim (model:3: the claim is synchronous and follows it), and
# retry-safe tools' results.
LAGGING = {"model:1", "tool:c1", "tool:c2", "model:3", "model:4", "tool:c4"}
# What never lags: the start, a turn asking for an idempotent tool (nothing durable stands
# between it and the effect), the attempt claim, a side effect's result, the completion and
# the final turn, stored in one statement with it.
DURABLE = {
    "@journal",
    "run:start",
    "model:2",
    "attempt:c3:1",
    "tool:c3",
    "model:5",
    "run:complete",
}


def _agent(durability: str) -> da.Agent:
    return da.Agent(
        f"dial-{durability}-{uuid.uuid4().hex[:6]}",
        ScriptedModel(list(SCRIPT)),
        "Look, notify, charge, look, answer.",
        [look, notify, charge],
        durability=durability,
    )


@dataclass
class Statement:
    sql: str
    params: Any
    own_transaction: bool  # autocommit, no transaction open: the statement is one


@contextmanager
def statements() -> Iterator[list[Statement]]:
    """Every statement psycopg executes meanwhile, in this thread or any other, through a
    cursor or straight through libpq (``durable_agents.database.prepared``)."""
    seen: list[Statement] = []
    original = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        conn = self.connection
        alone = (
            conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        seen.append(Statement(str(query), params, alone))
        return original(self, query, params, **kw)

    # The store's own statements in autocommit go straight through libpq (prepared.py).
    original_prepared = Prepared.execute

    def prepared(self: Prepared, sql: str, params: Any) -> Any:
        idle = self.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        seen.append(Statement(sql, params, idle))
        return original_prepared(self, sql, params)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    Prepared.execute = prepared  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]
        Prepared.execute = original_prepared  # type: ignore[method-assign]


def _written(statement: Statement) -> list[str]:
    """The journal names a statement writes (an insert's name parameters)."""
    if f"INSERT INTO {_J}" not in statement.sql:
        return []
    params = list(statement.params or [])
    return [p for p in params if isinstance(p, str) and (p in LAGGING or p in DURABLE)]


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "django-cursor"])
def test_async_relaxes_exactly_the_records_safe_to_redo(prepared):
    store = DjangoStore(using="default", prepared=prepared)
    agent = _agent("async")
    run_id = f"dial-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        result = agent.run(run_id, "go", store=store)
    assert result.answer == "Done."
    names = [r.name for r in Journal(store).records(run_id)]
    assert set(names) == LAGGING | DURABLE, names

    relaxed = [s for s in seen if DIAL in s.sql]
    lagged = [name for s in relaxed for name in _written(s)]
    assert sorted(lagged) == sorted(LAGGING), [s.sql for s in relaxed]
    for s in relaxed:
        # SET LOCAL's scope is the transaction: a statement that is its own transaction
        # relaxes exactly its record and its row change, nothing else.
        assert s.own_transaction, s.sql
        assert "set_config('synchronous_commit', 'off', true)" in s.sql
    durable = [name for s in seen if DIAL not in s.sql for name in _written(s)]
    assert set(durable) == DURABLE, durable
    # Nothing else (leases, the run row's own updates, reads) is relaxed.
    assert all(_written(s) for s in relaxed)
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on", "the session's setting is untouched"


def test_sync_relaxes_nothing():
    store = DjangoStore(using="default", prepared=True)
    run_id = f"dial-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        assert _agent("sync").run(run_id, "go", store=store).answer == "Done."
    assert [s.sql for s in seen if DIAL in s.sql] == []
    assert {n for s in seen for n in _written(s)} == LAGGING | DURABLE


def test_async_on_sqlite_commits_like_sync():
    """SQLite has no such setting: the dial is ignored (every write is durable)."""
    store = DjangoStore(using="sqlite", prepared=True)
    run_id = f"dial-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        assert _agent("async").run(run_id, "go", store=store).answer == "Done."
    assert [s.sql for s in seen if DIAL in s.sql] == []
    names = {r.name for r in Journal(store).records(run_id)}
    assert names == LAGGING | DURABLE


def test_durability_is_sync_or_async():
    assert _agent("sync").durability == "sync"
    assert (
        da.Agent(
            f"dial-default-{uuid.uuid4().hex[:6]}", ScriptedModel([scripted.text("x")])
        ).durability
        == "sync"
    )
    for bad in ("fast", "", None, "SYNC", True):
        with pytest.raises(ConfigError, match="durability is 'sync' or 'async'"):
            da.Agent("dial-bad", ScriptedModel([scripted.text("x")]), durability=bad)
