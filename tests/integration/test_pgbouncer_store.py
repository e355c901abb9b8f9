"""The store behind a transaction pooler (``TRANSACTION_POOLING``), its part: no statement
leaves a session-level lock on the driver's connection (the pooler would hand that server
connection, lock and all, to other clients, and an unlock to another one); a lease's
liveness lock is on the direct connection only, held *before* the lease is written (nothing
else covers a fresh lease there), and goes when that connection goes (the process died).

The driver's connection here is PostgreSQL itself, so a lock left on it would show in
pg_locks under its backend; the same paths through a real PgBouncer are in
``tests/acceptance/test_pgbouncer.py``."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connections

from durable_agents.database.liveness import Liveness
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import header
from durable_agents.engine.ports import RunInfo

pytestmark = pytest.mark.django_db(transaction=True)

# Lease tokens of this module's own: a lock another test's driver still holds on a common
# token ("tok-1") in this process or another worker would make a dead holder look alive.
TOK = {n: f"pool-{uuid.uuid4().hex[:8]}-{n}" for n in range(1, 6)}


def _pid() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _advisory_locks(pid: int | None) -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", [pid]
        )
        return int(cursor.fetchone()[0])


def _pooled(liveness: Liveness) -> DjangoStore:
    return DjangoStore(
        "default", prepared=False, instant_takeover=True, liveness=liveness, pooled=True
    )


def _gone(pid: int | None) -> None:
    deadline = time.monotonic() + 30
    while True:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
        assert time.monotonic() < deadline, "the liveness backend never exited"
        time.sleep(0.02)


def test_behind_a_pooler_a_lease_is_locked_on_the_direct_connection_only():
    mine, theirs = Liveness("default"), Liveness("default")
    store, other = _pooled(mine), _pooled(theirs)
    try:
        store.create_run(RunInfo("pool-1", agent="echo"))
        assert store.acquire_lease("pool-1", "me", TOK[1], 30)
        assert _advisory_locks(_pid()) == 0, "a session lock on the pooled connection"
        assert _advisory_locks(mine.backend_pid) == 1 and TOK[1] in mine.held
        assert not other.acquire_lease("pool-1", "them", TOK[2], 30), "its holder is alive"
        dead = mine.backend_pid
        mine.close()  # the process died: its direct connection, and so its lock, went
        _gone(dead)
        granted = other.acquire_lease("pool-1", "them", TOK[2], 30)
        assert granted and granted.previous is not None and granted.previous.live
        assert _advisory_locks(_pid()) == 0
        other.release_lease("pool-1", TOK[2])
        assert _advisory_locks(_pid()) == 0
    finally:
        mine.close()
        theirs.close()


def test_behind_a_pooler_a_started_run_is_locked_before_its_first_write_returns():
    """``start_run`` takes the lease in its one statement: the lock is held before it (not
    deferred to the next write, as on a direct connection, where the statement locks the
    driver's own connection meanwhile), and let go with the finish."""
    mine = Liveness("default")
    store = _pooled(mine)
    try:
        run = RunInfo("pool-2", agent="echo", status="running", input="hi")
        records = [header(), ("run:start", '{"kind":"start","input":"hi"}')]
        assert store.start_run(run, holder="me", token=TOK[3], ttl=30, records=records)
        assert TOK[3] in mine.held and not mine.deferred(TOK[3])
        assert _advisory_locks(_pid()) == 0
        assert _advisory_locks(mine.backend_pid) == 1
        assert not _pooled(Liveness("default")).acquire_lease("pool-2", "them", TOK[4], 30)
        store.finish_run("pool-2", "run:complete", '{"answer":"hi"}', fence=TOK[3])
        assert TOK[3] not in mine.held and _advisory_locks(_pid()) == 0
        # A run that already exists starts nothing and keeps nothing locked.
        assert store.start_run(run, holder="me", token=TOK[5], ttl=30, records=records) is None
        assert TOK[5] not in mine.held
    finally:
        mine.close()
