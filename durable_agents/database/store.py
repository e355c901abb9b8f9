"""DjangoStore: the Store port on the site's database (PostgreSQL first, SQLite too).

The hot path — a journal insert — is one statement, one round trip: an insert-if-absent
fenced by the lease, ``INSERT … SELECT … WHERE EXISTS (live lease FOR SHARE) ON CONFLICT DO
NOTHING RETURNING``. No row back means the name exists (read the winner) or the lease is
lost (``LeaseLost``, nothing stored). The ``FOR SHARE`` lock makes a concurrent takeover of
the lease wait for this insert's commit, and a takeover committed first makes the ``EXISTS``
false. Lease expiry is always judged by the database clock (``now()``).

On SQLite every statement is atomic and writers are serialised by the database lock, so the
same statements without ``FOR SHARE`` give the same guarantees; the clock is the database
host's (the same machine). Use ``"transaction_mode": "IMMEDIATE"`` and WAL mode. A record
and the run-row change it projects are two statements there, in one transaction.

The SQL lives here, next to the models it writes; everything else goes through the ORM.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django import db as django_db
from django.core.signals import setting_changed
from django.db import IntegrityError, connections, transaction
from django.db.models import (
    BooleanField,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    OuterRef,
    Q,
)
from django.db.models.functions import Now
from django.dispatch import receiver
from django.utils.dateparse import parse_datetime
from psycopg.types.json import Jsonb

from ..engine import failpoints
from ..engine.audit import (
    ACTION_FIELDS,
    ACTION_NAME,
    Link,
    action_content,
    action_hash,
    chain_hash,
)
from ..engine.deadlines import first_after
from ..engine.errors import (
    ApprovalNotFound,
    ConfigError,
    LeaseLost,
    StorageError,
)
from ..engine.ports import (
    APPROVAL_PENDING,
    HALT_OPEN,
    HALT_ORPHANED,
    HALT_RESOLVED,
    IMPORTED_INERT,
    KIND_AGENT,
    RUN_FIELDS,
    TERMINAL_STATUSES,
    Acquired,
    ActionInfo,
    ApprovalRequestInfo,
    DecisionInfo,
    Entry,
    Existing,
    HaltInfo,
    LeaseInfo,
    RunInfo,
    asked_again,
    changed_under,
    closed_request,
    closed_under,
    same_request,
)
from ..engine.records import encode
from ..engine.spent import DELETED, refusal
from ..models import (
    ActionLog,
    ApprovalRequest,
    Decision,
    Follower,
    Halt,
    JournalEntry,
    Lease,
    Run,
    Slot,
    SpentRunId,
    Throttle,
)
from ..notifications import outbox as notifications
from .delegations import Delegations
from .limits import Limits
from .liveness import KEY, LOCK_HELD, Liveness, liveness_for
from .prepared import Prepared
from .spent import retire, spent_ids

_J = JournalEntry._meta.db_table
_L = Lease._meta.db_table
_R = Run._meta.db_table
_S = SpentRunId._meta.db_table
_F = Follower._meta.db_table
_NEVER_AUTO_PREPARE = 2**31 - 1
_ACTION_LOCK = 1684107621  # the advisory lock the action log's writers take turns on
_PREV_SEQ_INDEX = "da_journal_prev_seq"
# What a record the trigger hashes first waits for (PostgreSQL): the run's records hashed by
# their writers and not committed yet, whose writers hold the run's lease row ``FOR SHARE``.
# Locking that row ``FOR NO KEY UPDATE`` before the trigger reads the last record means
# such a record never names a stale predecessor (so it is never refused, even inside a
# site's transaction, where a retry is impossible); writers hashing their own records wait
# for it in turn and, their predecessor now stale, are refused and written again. Taken
# before the trigger's advisory lock, as every writer does: no deadlock.
_LEASE_WAIT = (
    f"(SELECT count(*) FROM (SELECT 1 FROM {_L} WHERE run_id = %s FOR NO KEY UPDATE) AS l)"
)
# How many leases' chain tails a process keeps (``DjangoStore._tails``).
_TAILS_MAX = 4096
# What the chain trigger does besides hashing, for a record hashed by its writer: notify a
# followed run (a RETURNING expression of the journal insert, so once per record stored).
_NOTIFY_FOLLOWERS = (
    f"CASE WHEN EXISTS (SELECT 1 FROM {_F} fw WHERE fw.run_id = {_J}.run_id "
    f"AND fw.expires_at > now()) THEN pg_notify('da_run_' || md5({_J}.run_id), "
    f"{_J}.seq || ' ' || {_J}.run_id) END AS notified"
)
# A record hashed by its writer (PostgreSQL: a driver that knows its run's last record): the
# trigger does not fire (``WHEN (NEW.hash IS NULL)``, migration 0012), so the statement
# notifies a followed run itself (docs/events.md). It takes no lock of its own: the unique
# ``prev_seq`` makes a writer whose idea of the last record is stale fail instead of forking
# the chain, and the lease row it holds ``FOR SHARE`` to its commit is what a record hashed
# by the trigger (``_LEASE_WAIT``) and a new follower's ``settle`` wait for.
_HASHED_INSERT = (
    f"INSERT INTO {_J} (run_id, name, data, created_at, hash, prev_seq) "
    "SELECT %s, %s, %s, now(), %s, %s "
    f"WHERE EXISTS (SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s "
    "AND expires_at > now() FOR SHARE) "
    f"ON CONFLICT (run_id, name) DO NOTHING RETURNING seq, created_at, {_NOTIFY_FOLLOWERS}"
)
# One reusable server-binding cursor per psycopg connection, kept on the Django connection
# wrapper (per thread) under this name: a reconnect replaces it, so the closed connection,
# which its cursor references, goes with it.
_CURSOR_ATTR = "_durable_agents_cursor"
# The statements prepared through libpq on the wrapper's connection (``prepared.py``).
_PREPARED_ATTR = "_durable_agents_prepared"
_TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid
_C_TIMESTAMPTZ = psycopg.adapters.get_loader(_TIMESTAMPTZ, psycopg.pq.Format.TEXT)

# Instant takeover (PostgreSQL): a driver's process holds a session-level advisory lock keyed
# by its lease token on a connection of the library's own (``liveness.py``) — a connection the
# site's code never closes — requested just before the lease statement and confirmed after
# it; that statement also takes the lock on the connection it leases the run from, so a live
# lease never lacks its lock in between (that one goes with the lease, or with its
# connection). The server releases a lock the moment its connection drops — the process died — so
# a live lease whose token's lock is free has no driver left and may be taken at once. A
# stalled (SIGSTOPped) process keeps its connections, its locks, and so its lease until
# expiry. The key: the token's md5, first 64 bits (``liveness.KEY``).
_LOCK_KEY = KEY


# Whether anyone holds token {0}'s lock — this very session too (advisory locks are reentrant
# per session, so a probe by taking it would "succeed" on a lease this connection holds). A
# bigint key shows in pg_locks as classid (high 32 bits) and objid (low 32 bits).
def _by_seq(row: Sequence[Any]) -> int:
    return int(row[0])


# The marker row a start sends back when the run's id is spent (``engine.spent``): its name
# is this prefix and the reason.
_SPENT = "@spent:"


class _HolderAlive(Func):
    """``LOCK_HELD`` over a lease's token column, for ORM queries (the column's alias is
    the query's to choose)."""

    template = LOCK_HELD.format("%(expressions)s")
    output_field = BooleanField()


# The tokens whose lock each connection holds (weak keys: a closed connection's locks are gone).
_LOCKED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

# The durability dial (engine/durability.py) on PostgreSQL: ``SET LOCAL synchronous_commit =
# off`` inside the statement itself, so a relaxed write costs no extra round trip. It is in
# the statement's result list: evaluated once, exactly when the record was stored (a name
# already recorded stores nothing and changes nothing), and it lasts until this statement's
# own (autocommit) transaction commits. The commit then returns without waiting for the WAL
# flush; the WAL writer flushes it within ``wal_writer_delay`` (200 ms by default), and any
# later synchronous commit flushes it first (the log is written in commit order).
_ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true)"

_JSON_COLUMNS = frozenset({"input", "usage", "spend", "last_error", "fingerprint"})
# The run row's columns as ``RunInfo`` names them (``get_run``).
_RUN_COLUMNS = (
    "run_id",
    "agent",
    "status",
    "input",
    "answer",
    "usage",
    "spend",
    "turns",
    "last_error",
    "attempts",
    "fingerprint",
    "session_id",
    "parent_run_id",
    "root_run_id",
    "forked_from",
    "forked_step",
    "kind",
    "created_at",
    "updated_at",
    "finished_at",
    "dispatched_at",
    "imported",
)


def _prev_seq_taken(exc: BaseException) -> bool:
    """Whether ``exc`` is the unique ``prev_seq`` refusing a second successor of a record:
    a writer hashed its record after one that was no longer the run's last."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    diag = getattr(cause, "diag", None)
    name = getattr(diag, "constraint_name", None) if diag is not None else None
    return name == _PREV_SEQ_INDEX or (name is None and _PREV_SEQ_INDEX in str(cause))


class _NothingWritten(Exception):
    """Rolls back a multi-record write whose first record was already there."""


def _jsonb(value: Any) -> Any:
    return Jsonb(value) if value is not None else None


def _aware(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))
    if parsed is None:
        raise StorageError(f"unreadable timestamp {value!r} from the database")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class _Dialect:
    """The few expressions that differ between PostgreSQL and SQLite."""

    def __init__(self, vendor: str) -> None:
        self.postgres = vendor == "postgresql"
        if vendor not in ("postgresql", "sqlite"):
            raise ConfigError(
                f"DjangoStore supports PostgreSQL and SQLite, not {vendor!r}",
                code="config.database",
            )
        self.now = "now()" if self.postgres else "strftime('%%Y-%%m-%%d %%H:%%M:%%f','now')"
        self.for_share = "FOR SHARE" if self.postgres else ""
        # A fenced record the trigger hashes: as ``FOR SHARE`` for the lease, and it waits
        # for the run's records hashed by their writers (``_LEASE_WAIT``).
        self.for_no_key_update = "FOR NO KEY UPDATE" if self.postgres else ""

    def later(self) -> str:
        """``now() + ttl`` with the ttl (seconds) as the next parameter."""
        if self.postgres:
            return "now() + make_interval(secs => %s)"
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f','now', %s)"

    def ttl_param(self, ttl: float) -> Any:
        return float(ttl) if self.postgres else f"+{float(ttl)} seconds"


# The site's one store, built from the settings on first use (see ``site_store``).
_site: DjangoStore | None = None


def site_store() -> DjangoStore:
    """The site's store: the ``DjangoStore`` on the database the settings name (``DATABASE``,
    ``PREPARED_STATEMENTS``), built once and shared by the engine, the admin, the API and the
    management command. Changing ``DURABLE_AGENTS`` or ``DATABASES`` (``override_settings``,
    pytest-django's ``settings``) builds a new one on the next call; invalid settings raise
    ``ConfigError`` on every call until they are fixed."""
    global _site
    store = _site
    if store is None:
        store = _site = DjangoStore()
    return store


@receiver(setting_changed)
def _forget_site_store(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DURABLE_AGENTS", "DATABASES"):
        global _site
        _site = None


class DjangoStore(Delegations, Limits):
    """The Store port over a Django database alias."""

    def __init__(
        self,
        using: str | None = None,
        *,
        prepared: bool | None = None,
        instant_takeover: bool | None = None,
        liveness: Liveness | None = None,
        pooled: bool | None = None,
        direct: str | None = None,
    ) -> None:
        if using is None or prepared is None or instant_takeover is None or pooled is None:
            from ..conf import get_settings

            settings = get_settings()
            using = settings.database if using is None else using
            # TRANSACTION_POOLING and DIRECT_DATABASE describe the DATABASE alias only.
            ours = using == settings.database
            prepared = (
                (settings.use_prepared if ours else settings.prepared_statements is not False)
                if prepared is None
                else prepared
            )
            if instant_takeover is None:
                instant_takeover = (
                    settings.use_instant_takeover if ours else settings.instant_takeover
                )
            if pooled is None:
                pooled = settings.transaction_pooling and ours
                direct = settings.direct_database if ours and direct is None else direct
        self.using = using
        self.prepared = prepared
        self.instant_takeover = instant_takeover
        # Behind a transaction pooler: no session-level lock on the driver's connection (it
        # would stay on whichever server connection ran the statement, for other clients);
        # the liveness locks live on ``direct``'s connection only.
        self.pooled = pooled
        self.direct = direct
        self._liveness = liveness  # a test's own "process"; else this process's
        self._dialect: _Dialect | None = None
        # Lease token -> (run id, seq, hash) of the last record written under it by this
        # process: the next record's predecessor, so it is hashed here (``_tail``).
        self._tails: dict[str, tuple[str, int, str | None]] = {}

    @property
    def connection(self) -> Any:
        return connections[self.using]

    @property
    def dialect(self) -> _Dialect:
        if self._dialect is None:
            self._dialect = _Dialect(self.connection.vendor)
        return self._dialect

    @property
    def _instant(self) -> bool:
        return self.instant_takeover and self.dialect.postgres

    @property
    def liveness(self) -> Liveness | None:
        """This process's liveness locks (None: instant takeover is off or not PostgreSQL)."""
        if not self._instant:
            return None
        if self._liveness is not None:
            return self._liveness
        return liveness_for(self.direct or self.using)

    def _liveness_on(self, conn: Any) -> Liveness | None:
        """``liveness``, with this thread's connection wrapper ``conn`` already at hand."""
        if not (self.instant_takeover and self.dialect.postgres):
            return None
        if self._liveness is not None:
            return self._liveness
        if self.direct is not None:
            return liveness_for(self.direct)
        return liveness_for(self.using, conn.settings_dict)

    @property
    def _driver_locks(self) -> bool:
        """Whether lease statements also lock on the driver's own connection (not behind a
        transaction pooler: there the lock would outlive the statement on a server
        connection other clients then use, and an unlock would reach another one)."""
        return self._instant and not self.pooled

    def _lock_first(self, token: str) -> None:
        """Behind a transaction pooler: hold ``token``'s liveness lock before its lease is
        written (nothing else covers a fresh lease); a lock that cannot be taken fails the
        write as a database error, rather than leave a lease that looks abandoned."""
        liveness = self.liveness
        if liveness is None:
            return
        try:
            liveness.lock_now(token)
        except psycopg.Error as exc:
            raise django_db.OperationalError(f"the liveness connection failed: {exc}") from exc

    def _locked(self) -> set[str] | None:
        """The tokens whose liveness lock this thread's connection holds (None: no connection,
        or no liveness locks on this database)."""
        if not self._instant:
            return None
        raw = self.connection.connection
        if raw is None or raw.closed:
            return None
        return _LOCKED.setdefault(raw, set())

    def _held_lock(self, token: str) -> None:
        locked = self._locked()
        if locked is not None:
            locked.add(token)

    def _forget_lock(self, token: str) -> None:
        locked = self._locked()
        if locked is not None:
            locked.discard(token)

    def _holds_lock(self, token: str) -> bool:
        locked = self._locked()
        return locked is not None and token in locked

    def _execute(self, sql: str, params: Sequence[Any], fetch: str, conn: Any = None) -> Any:
        """Run one statement; on PostgreSQL as a prepared statement with server-side binding.

        Django turns prepared statements off by default (for connection poolers); the
        journal's few hot statements are planned once per connection instead of on every
        step, which is most of their cost. ``DURABLE_AGENTS["PREPARED_STATEMENTS"] = False``
        turns this off (PgBouncer in transaction mode before 1.21). ``conn``: this thread's
        connection wrapper when the caller already looked it up (a lookup costs microseconds).
        """
        if conn is None:
            conn = connections[self.using]
        if self.prepared and conn.vendor == "postgresql":
            if conn.health_check_enabled and not conn.health_check_done:
                # What Django's own cursors do first (``CONN_HEALTH_CHECKS``): a kept
                # connection the server dropped since the last request or task is replaced.
                conn.close_if_health_check_failed()
            raw = conn.connection
            if raw is None or raw.closed:
                conn.ensure_connection()
                raw = conn.connection
            cursor = getattr(conn, _CURSOR_ATTR, None)
            if cursor is None or cursor.closed or cursor.connection is not raw:
                if raw.prepare_threshold is None:
                    # psycopg ignores prepare=True while the threshold is None (Django's
                    # default); a threshold never reached keeps other queries unprepared.
                    raw.prepare_threshold = _NEVER_AUTO_PREPARE
                cursor = psycopg.Cursor(raw)
                setattr(conn, _CURSOR_ATTR, cursor)
                # Django's timestamptz loader parses in Python; psycopg's own is C and gives
                # the same aware datetime (the session time zone is UTC).
                if _C_TIMESTAMPTZ is not None:
                    cursor.adapters.register_loader(_TIMESTAMPTZ, _C_TIMESTAMPTZ)
            if raw.autocommit:  # its own transaction: straight through libpq (prepared.py)
                fast = getattr(conn, _PREPARED_ATTR, None)
                if fast is None or fast.pgconn is not raw.pgconn:
                    fast = Prepared(raw, cursor)
                    setattr(conn, _PREPARED_ATTR, fast)
                with conn.wrap_database_errors, raw.lock:
                    rows = fast.execute(sql, params)
                if fetch == "one":
                    return rows[0] if rows else None
                return rows
            with conn.wrap_database_errors:
                cursor.execute(sql, params, prepare=True)
                return cursor.fetchone() if fetch == "one" else cursor.fetchall()
        with conn.cursor() as django_cursor:
            django_cursor.execute(sql, params)
            if fetch == "none":
                return None
            return django_cursor.fetchone() if fetch == "one" else django_cursor.fetchall()

    def _fetchone(
        self, sql: str, params: Sequence[Any], conn: Any = None
    ) -> tuple[Any, ...] | None:
        row = self._execute(sql, params, "one", conn)
        return tuple(row) if row is not None else None

    # -- runs -------------------------------------------------------------------------

    def create_run(self, run: RunInfo) -> bool:
        row = Run(
            run_id=run.run_id,
            agent=run.agent,
            status=run.status,
            input=run.input,
            answer=run.answer,
            turns=run.turns,
            attempts=run.attempts,
            last_error=dict(run.last_error) if run.last_error is not None else None,
            usage=dict(run.usage),
            spend=dict(run.spend),
            fingerprint=run.fingerprint,
            session_id=run.session_id,
            parent_run_id=run.parent_run_id,
            root_run_id=run.root_run_id,
            forked_from=run.forked_from,
            forked_step=run.forked_step,
            kind=run.kind,
            imported=run.imported,
        )
        if run.status in TERMINAL_STATUSES:
            row.finished_at = Now()  # created in its final state: one write, never unfinished
        try:
            with transaction.atomic(using=self.using):
                row.save(force_insert=True, using=self.using)
                # Asked only of a row this call inserted (a run that exists costs nothing
                # more); a spent id rolls the insert back.
                spent = spent_ids(self.using, [run.run_id])
                if spent:
                    raise refusal(run.run_id, spent[run.run_id])
        except IntegrityError:
            return False
        return True

    def run_held(self, run_id: str) -> bool:
        # FOR SHARE waits for a transaction that locked the row to delete it, then finds it
        # gone; SQLite's writers are serialised by the database lock anyway.
        return (
            self._fetchone(
                f"SELECT 1 FROM {_R} WHERE run_id = %s {self.dialect.for_share}", [run_id]
            )
            is not None
        )

    def get_run(self, run_id: str) -> RunInfo | None:
        if self.prepared and self.dialect.postgres:
            # A driver reads its run's row on every start and resume: one prepared statement
            # instead of the ORM's query building (the same values as ``Run.to_domain``).
            found = self._fetchone(
                f"SELECT {', '.join(_RUN_COLUMNS)} FROM {_R} WHERE run_id = %s", [run_id]
            )
            if found is None:
                return None
            values = dict(zip(_RUN_COLUMNS, found, strict=True))
            for column in _JSON_COLUMNS:  # Django's jsonb loader leaves the text to decode
                if values[column] is not None:
                    values[column] = json.loads(values[column])
            values["usage"] = values["usage"] or {}
            values["spend"] = values["spend"] or {}
            return RunInfo(**values)
        row = Run.objects.using(self.using).filter(run_id=run_id).first()
        return row.to_domain() if row is not None else None

    def mark_dispatched(self, run_id: str, *, seen: datetime | None) -> bool:
        """One conditional UPDATE: of two recovery passes that read the same stamp, the
        second finds it moved on (PostgreSQL re-checks the row it waited for)."""
        unchanged = Q(dispatched_at__isnull=True)
        if seen is not None:
            if not self.dialect.postgres:
                # SQLite keeps the stamp as text to the millisecond (``…:51.000``) and Django
                # writes a whole-second ``seen`` without its fraction (``…:51``), which sorts
                # before it. A microsecond more is still below the clock's next tick.
                seen += timedelta(microseconds=1)
            unchanged |= Q(dispatched_at__lte=seen)
        rows = Run.objects.using(self.using).filter(unchanged, run_id=run_id)
        return rows.update(dispatched_at=Now()) > 0

    def update_run(
        self,
        run_id: str,
        changes: Mapping[str, Any],
        *,
        fence: str | None = None,
        if_status: Sequence[str] | None = None,
    ) -> bool:
        unknown = set(changes) - RUN_FIELDS
        if unknown:
            raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        if self.prepared and self.dialect.postgres:
            return self._update_run_sql(run_id, changes, fence, if_status)
        values: dict[str, Any] = dict(changes, updated_at=Now())
        if "status" in changes:
            values["finished_at"] = Now() if changes["status"] in TERMINAL_STATUSES else None
        rows = Run.objects.using(self.using).filter(run_id=run_id)
        if fence is not None:
            rows = rows.filter(Exists(self._live_lease(fence)))
        if if_status is not None:
            rows = rows.filter(status__in=list(if_status))
        updated = rows.update(**values)
        lost = updated == 0 and fence is not None and not self._holds(run_id, fence)
        if lost and self.get_run(run_id) is not None:
            raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")
        return updated > 0

    def _update_run_sql(
        self,
        run_id: str,
        changes: Mapping[str, Any],
        fence: str | None,
        if_status: Sequence[str] | None,
    ) -> bool:
        """The driver updates the run row after every turn: one prepared statement, fenced
        like a journal write."""
        sets, params = self._run_sets(changes)
        sql = f"UPDATE {_R} SET {sets} WHERE run_id = %s"
        params.append(run_id)
        if fence is not None:
            sql += (
                f" AND EXISTS (SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s "
                "AND expires_at > now())"
            )
            params += [run_id, fence]
        if if_status is not None:
            sql += " AND status = ANY(%s)"
            params.append(list(if_status))
        row = self._fetchone(sql + " RETURNING 1", params)
        lost = row is None and fence is not None and not self._holds(run_id, fence)
        if lost and self.get_run(run_id) is not None:
            raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")
        return row is not None

    @staticmethod
    def _run_sets(changes: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SET clause (PostgreSQL) for projected run fields, and its parameters."""
        unknown = set(changes) - RUN_FIELDS
        if unknown:
            raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        columns = sorted(changes)
        sets = [f"{c} = %s" for c in columns] + ["updated_at = now()"]
        params: list[Any] = [
            Jsonb(changes[c]) if c in _JSON_COLUMNS and changes[c] is not None else changes[c]
            for c in columns
        ]
        if "status" in changes:
            sets.append("finished_at = CASE WHEN %s THEN now() ELSE NULL END")
            params.append(changes["status"] in TERMINAL_STATUSES)
        return ", ".join(sets), params

    def now(self) -> datetime:
        """The database's clock."""
        row = self._fetchone(f"SELECT {self.dialect.now}", [])
        assert row is not None
        return _aware(row[0])

    def _holds(self, run_id: str, token: str) -> bool:
        d = self.dialect
        row = self._fetchone(
            f"SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s AND expires_at > {d.now}",
            [run_id, token],
        )
        return row is not None

    def _check_fence(self, run_id: str, fence: str | None) -> None:
        """Inside the caller's transaction, before its write: raise ``LeaseLost`` unless
        ``fence`` holds the run's live lease. ``FOR SHARE`` keeps the lease row until the
        write commits, so a takeover waits for it (PostgreSQL); SQLite's writer lock does the
        same. A run that is gone raises nothing: the write fails on its own."""
        if fence is None:
            return
        d = self.dialect
        held = self._fetchone(
            f"SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s AND expires_at > {d.now} "
            f"{d.for_share}",
            [run_id, fence],
        )
        if held is None and self.get_run(run_id) is not None:
            raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")

    def _live_lease(self, token: str) -> Any:
        return Lease.objects.using(self.using).filter(
            run_id=OuterRef("run_id"), token=token, expires_at__gt=Now()
        )

    def delete_run(self, run_id: str) -> None:
        with transaction.atomic(using=self.using):
            if Run.objects.using(self.using).filter(run_id=run_id).exists():
                retire(self.using, [run_id], DELETED)
            Run.objects.using(self.using).filter(run_id=run_id).delete()
            # Not tied to the run row (no foreign key): a limit's rows of the run go too.
            Throttle.objects.using(self.using).filter(run_id=run_id).delete()
            Slot.objects.using(self.using).filter(run_id=run_id).delete()

    def prune(self, *, finished_before: datetime, by: Any) -> Any:
        """``retention.prune`` on this store's database, without an export (tombstones
        only): the same call as ``InMemoryStore.prune``, so code written against either
        store prunes both (the simulator's operator, the conformance suite)."""
        from .retention import prune

        return prune(finished_before=finished_before, by=by, export_dir=None, using=self.using)

    # -- journal ----------------------------------------------------------------------

    def insert(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str | None = None,
        run_changes: Mapping[str, Any] | None = None,
        sync: bool = True,
    ) -> tuple[Entry, bool]:
        return self._insert(run_id, name, data, fence, run_changes, release=False, sync=sync)

    def finish_run(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> tuple[Entry, bool]:
        """A driver's last record, its row and the lease's release: one statement on
        PostgreSQL (the lease row the insert locks ``FOR SHARE`` is deleted by the same
        transaction), one transaction on SQLite."""
        if self.dialect.postgres:
            return self._insert(run_id, name, data, fence, run_changes, release=True)
        with transaction.atomic(using=self.using):
            entry, inserted = self.insert(run_id, name, data, fence=fence, run_changes=run_changes)
            if inserted:
                self.release_lease(run_id, fence)
        return entry, inserted

    def finish_run_with(
        self,
        run_id: str,
        records: Sequence[tuple[str, str]],
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> list[Entry] | None:
        """A driver's last records (its final model turn and ``run:complete``), its row and
        the lease's release: one statement on PostgreSQL (a chain of data-modifying CTEs,
        each record inserted only if the one before was), one transaction on SQLite. None,
        writing nothing, if the first name is recorded or the lease is lost."""
        if not records:
            raise ConfigError("finish_run_with needs at least one record", code="config.records")
        if not self.dialect.postgres:
            try:
                with transaction.atomic(using=self.using):
                    written = []
                    for i, (name, data) in enumerate(records):
                        changes = run_changes if i == len(records) - 1 else None
                        entry, inserted = self.insert(
                            run_id, name, data, fence=fence, run_changes=changes
                        )
                        if not inserted:
                            raise _NothingWritten
                        written.append(entry)
                    self.release_lease(run_id, fence)
            except (_NothingWritten, LeaseLost):
                return None
            return written
        tail = self._tail(run_id, fence, self.connection)
        try:
            found = self._finish_with(run_id, records, fence, run_changes, tail)
        except IntegrityError as exc:
            if tail is None or not _prev_seq_taken(exc):
                raise
            # Someone appended since this driver's last record: the trigger hashes instead.
            self._forget_tail(fence)
            found = self._finish_with(run_id, records, fence, run_changes, None)
        if not found:  # the first name is recorded, or the lease is lost: nothing written
            return None
        self._forget_lock(fence)
        self._forget_tail(fence)
        if (liveness := self.liveness) is not None:
            liveness.release(fence)  # deferred: no round trip of its own
        return [Entry(run_id, n, int(seq), dt, _aware(at)) for seq, n, dt, at in found]

    def _finish_with(
        self,
        run_id: str,
        records: Sequence[tuple[str, str]],
        fence: str,
        run_changes: Mapping[str, Any] | None,
        tail: tuple[int, str | None] | None,
    ) -> Sequence[tuple[Any, ...]]:
        """``finish_run_with``'s statement on PostgreSQL; each record hashed here after
        ``tail`` and the one before it, or (``tail`` None) by the trigger."""
        sets, values = self._run_sets(run_changes) if run_changes else ("", [])
        # Hashed here: the lease row held as any fenced insert holds it; hashed by the
        # trigger: waiting for records hashed by their writers (``_LEASE_WAIT``).
        fenced = (
            f"EXISTS (SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s "
            f"AND expires_at > now() FOR {'SHARE' if tail is not None else 'NO KEY UPDATE'})"
        )
        parts = []
        params: list[Any] = []
        prev_hash = tail[1] if tail is not None else None
        for i, (name, data) in enumerate(records):
            if tail is not None:
                # As ``_HASHED_INSERT``: the record's hash and its predecessor's seq.
                prev_hash = chain_hash(prev_hash, name, data)
                columns = "run_id, name, data, created_at, hash, prev_seq"
                notify = f", {_NOTIFY_FOLLOWERS}"
                if i == 0:
                    values_sql = "%s, %s, %s, now(), %s, %s"
                    source = f"WHERE {fenced} ON CONFLICT (run_id, name) DO NOTHING"
                    params += [run_id, name, data, prev_hash, tail[0], run_id, fence]
                else:
                    values_sql = f"%s, %s, %s, now(), %s, i{i - 1}.seq"
                    source = f"FROM i{i - 1}"
                    params += [run_id, name, data, prev_hash]
            else:
                columns = "run_id, name, data, created_at"
                values_sql = "%s, %s, %s, now()"
                notify = ""
                if i == 0:
                    source = f"WHERE {fenced} ON CONFLICT (run_id, name) DO NOTHING"
                    params += [run_id, name, data, run_id, fence]
                else:
                    # Only after the record before it. No conflict clause: a later name
                    # recorded without the first (no driver writes that) fails the whole
                    # statement.
                    source = f"FROM i{i - 1}"
                    params += [run_id, name, data]
            parts.append(
                f"i{i} AS (INSERT INTO {_J} ({columns}) SELECT {values_sql} {source} "
                f"RETURNING seq, name, data, created_at{notify})"
            )
        last = f"i{len(records) - 1}"
        if sets:
            parts.append(
                f"upd AS (UPDATE {_R} SET {sets} WHERE run_id = %s "
                f"AND EXISTS (SELECT 1 FROM {last}))"
            )
            params += [*values, run_id]
        unlock = (
            f" RETURNING pg_advisory_unlock_shared({_LOCK_KEY.format('token')})"
            if self._holds_lock(fence)
            else ""
        )
        parts.append(
            f"rel AS (DELETE FROM {_L} WHERE run_id = %s AND token = %s "
            f"AND EXISTS (SELECT 1 FROM {last}){unlock})"
        )
        params += [run_id, fence]
        notified = ", notified" if tail is not None else ""
        union = " UNION ALL ".join(
            f"SELECT seq, name, data, created_at{notified} FROM i{i}" for i in range(len(records))
        )
        sql = f"WITH {', '.join(parts)} SELECT * FROM ({union}) AS w ORDER BY seq"
        return [row[:4] for row in self._execute(sql, params, "all")]

    def start_run(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> list[Entry] | None:
        """A new run's row, its lease (none without a ``token``: a run queued for a worker)
        and first records: one statement on PostgreSQL (a data-modifying CTE, each part fed
        by the one before, so a run that exists gets nothing), one transaction on SQLite."""
        return self._start(run, holder, token, ttl, records, load=False)[0]

    def start_or_load(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> tuple[list[Entry] | None, Existing | None]:
        """``start_run``; for a run that exists, its journal and row in the same statement
        (PostgreSQL), read in the snapshot that saw it exist."""
        return self._start(run, holder, token, ttl, records, load=True)

    def _start(
        self,
        run: RunInfo,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
        *,
        load: bool,
    ) -> tuple[list[Entry] | None, Existing | None]:
        if not records:
            raise ConfigError("start_run needs at least one record", code="config.records")
        if not self.dialect.postgres:
            return self._start_local(run, holder, token, ttl, records)
        sql, params, lock = self._start_statement(run, holder, token, ttl, records, load=load)
        first = token if self._instant and self.pooled else None
        if first is not None:
            self._lock_first(first)
        found: list[Any] = []
        rows: list[Any] = []
        try:
            rows = list(self._execute(sql, params, "all"))
            if load:
                found = sorted((row[:5] for row in rows if row[6]), key=_by_seq)  # inserted
            else:
                found = [row[:5] for row in rows if row[0] is not None]
        finally:
            if first is not None and not found and (liveness := self.liveness) is not None:
                liveness.release(first)  # no run was started: nothing to keep locked
        if not found:
            for row in rows:
                if row[0] is None and str(row[1] or "").startswith(_SPENT):
                    raise refusal(run.run_id, str(row[1])[len(_SPENT) :])
            return None, self._existing(run.run_id, rows) if load else None
        if token is not None:
            seq, *_, last_hash = found[-1]
            self._remember_tail(token, run.run_id, int(seq), last_hash)
        if lock and token is not None:
            self._held_lock(token)
            if (liveness := self.liveness) is not None:
                # Locked on this connection by the statement; on the library's own by the
                # next fenced write (a one-turn run's finish is its next: it never is).
                liveness.defer(token)
        return [Entry(run.run_id, n, int(seq), dt, _aware(at)) for seq, n, dt, at, _ in found], None

    def _start_local(
        self,
        run: RunInfo,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> tuple[list[Entry] | None, Existing | None]:
        """``_start`` on SQLite: the row, the lease and the records in one transaction."""
        with transaction.atomic(using=self.using):
            if not self.create_run(run):  # refuses a spent id
                return None, None  # read as usual: SQLite is local, a read is cheap
            if token is not None:
                self.acquire_lease(run.run_id, str(holder), token, float(ttl or 0))
            return [self.insert(run.run_id, n, dt, fence=token)[0] for n, dt in records], None

    @staticmethod
    def _start_values(run: RunInfo) -> list[Any]:
        """The row as RunInfo names it, up to the columns the database sets (created_at…)."""
        return [
            run.run_id,
            run.agent,
            run.status,
            _jsonb(run.input),
            run.answer,
            Jsonb(dict(run.usage)),
            Jsonb(dict(run.spend)),
            run.turns,
            _jsonb(dict(run.last_error) if run.last_error is not None else None),
            run.attempts,
            _jsonb(run.fingerprint),
            run.session_id,
            run.parent_run_id,
            run.root_run_id,
            run.forked_from,
            run.forked_step,
            run.kind,
        ]

    @staticmethod
    def _start_journal(
        records: Sequence[tuple[str, str]], leased: bool
    ) -> tuple[list[str], list[Any]]:
        """The statement's inserts of the records, and their parameters."""
        # The records, hashed here (a new run's chain starts empty and nobody else can
        # write to a run this statement creates): each inserted only after the one before
        # it, whose seq it names as ``prev_seq``.
        journal = []
        record_params: list[Any] = []
        prev_hash: str | None = None
        for i, (name, data) in enumerate(records):
            prev_hash = chain_hash(prev_hash, name, data)
            if i == 0:
                source, prev = f"{'l' if leased else 'r'} AS f", "NULL"
            else:
                source, prev = f"j{i - 1} AS f", "f.seq"
            journal.append(
                f"j{i} AS (INSERT INTO {_J} (run_id, name, data, created_at, hash, prev_seq) "
                f"SELECT f.run_id, %s, %s, now(), %s, {prev} FROM {source} "
                f"RETURNING run_id, seq, name, data, created_at, hash, {_NOTIFY_FOLLOWERS})"
            )
            record_params += [name, data, prev_hash]
        return journal, record_params

    def _start_statement(
        self,
        run: RunInfo,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
        *,
        load: bool,
    ) -> tuple[str, list[Any], str]:
        """``_start``'s one statement on PostgreSQL, its parameters, and the lock it takes
        (empty: none)."""
        leased = token is not None
        columns = _RUN_COLUMNS[: _RUN_COLUMNS.index("created_at")]
        values = self._start_values(run)
        # Once, with the lease row: a RETURNING expression runs once per row inserted.
        lock = (
            f", pg_try_advisory_lock_shared({_LOCK_KEY.format('token')})"
            if self._driver_locks and leased
            else ""
        )
        lease = (
            f"l AS (INSERT INTO {_L} (run_id, holder, token, expires_at, renewed_at) "
            "SELECT run_id, %s, %s, now() + make_interval(secs => %s), now() FROM r "
            f"RETURNING run_id{lock}), "
            if leased
            else ""
        )
        journal, record_params = self._start_journal(records, leased)
        # The row's fields a re-entry checks: none on the records this statement wrote.
        no_row = ", NULL::text, NULL::text, NULL::integer, NULL::text"
        union = " UNION ALL ".join(
            f"SELECT seq, name, data, created_at, hash, notified"
            f"{', TRUE' + no_row if load else ''} FROM j{i}"
            for i in range(len(records))
        )
        # ``notified`` is void-typed; a subquery of it gives another branch a NULL of that type.
        void = "(SELECT notified FROM j0 LIMIT 0)"
        if load:
            # A run that exists (nothing inserted): its journal, then its row (seq NULL,
            # sorted last), in this statement's snapshot.
            union += (
                f" UNION ALL SELECT e.seq, e.name, e.data, e.created_at, e.hash, {void}, FALSE"
                f"{no_row} FROM {_J} e WHERE e.run_id = %s AND NOT EXISTS (SELECT FROM r)"
                f" UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, {void}, FALSE, x.status,"
                f" x.answer, x.turns, x.imported FROM {_R} x"
                " WHERE x.run_id = %s AND NOT EXISTS (SELECT FROM r)"
            )
        # Nothing inserted because the id is spent (a deleted or pruned run held it): a
        # marker row (seq NULL, name ``_SPENT`` and the reason) says so in the same round
        # trip, and the start is refused.
        union += (
            f" UNION ALL SELECT NULL, '{_SPENT}' || s.reason, NULL, NULL, NULL, {void}"
            f"{', FALSE' + no_row if load else ''} FROM {_S} s WHERE s.run_id = %s"
            " AND NOT EXISTS (SELECT FROM r)"
            f" AND NOT EXISTS (SELECT FROM {_R} WHERE run_id = %s)"
        )
        # Sorted here, or in Python when a journal may come back (a sort node over a
        # thousand records costs more than the sort of a list already nearly in order).
        order = "" if load else " ORDER BY seq"
        # A deleted run's id is spent (``engine.spent``): no row for it.
        sql = (
            f"WITH r AS (INSERT INTO {_R} ({', '.join(columns)}, finished_at) "
            f"SELECT {', '.join(['%s'] * len(columns))}, CASE WHEN %s THEN now() END "
            f"WHERE NOT EXISTS (SELECT FROM {_S} WHERE run_id = %s) "
            f"ON CONFLICT (run_id) DO NOTHING RETURNING run_id), {lease}"
            f"{', '.join(journal)} SELECT * FROM ({union}) AS w{order}"
        )
        params: list[Any] = [*values, run.status in TERMINAL_STATUSES, run.run_id]
        if leased:
            params += [holder, token, float(ttl or 0)]
        params += record_params
        if load:
            params += [run.run_id, run.run_id]
        params += [run.run_id, run.run_id]
        return sql, params, lock

    def _existing(self, run_id: str, rows: list[Any]) -> Existing | None:
        """What ``_start`` read of a run that exists; None when its row was not in the
        statement's snapshot (committed after it began): the driver then reads as usual."""
        row = next((r for r in rows if r[0] is None and r[7] is not None), None)
        if row is None:
            return None
        journal = sorted((r for r in rows if r[0] is not None), key=_by_seq)
        if self.prepared:  # typed by psycopg's own loaders, as ``load`` takes them
            new = tuple.__new__
            entries = [new(Entry, (run_id, r[1], r[0], r[2], r[3])) for r in journal]
        else:
            entries = [Entry(run_id, r[1], int(r[0]), r[2], _aware(r[3])) for r in journal]
        return Existing(entries, row[7], row[8], int(row[9]), row[10])

    def _insert(
        self,
        run_id: str,
        name: str,
        data: str,
        fence: str | None,
        run_changes: Mapping[str, Any] | None,
        *,
        release: bool,
        sync: bool = True,
    ) -> tuple[Entry, bool]:
        d = self.dialect
        conn = connections[self.using]
        # The durability dial: only a statement that is its own transaction (autocommit) is
        # relaxed, so ``synchronous_commit = off`` covers exactly this record (and its row).
        relax = not sync and d.postgres and not conn.in_atomic_block
        if run_changes and not d.postgres:
            unknown = set(run_changes) - RUN_FIELDS
            if unknown:
                raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
            # Two statements on SQLite (no data-modifying CTE): one transaction, so a crash
            # between them stores neither.
            with transaction.atomic(using=self.using):
                entry, inserted = self.insert(run_id, name, data, fence=fence)
                failpoints.hit(f"store:after-insert:{name}")
                if inserted:
                    self.update_run(run_id, run_changes, fence=fence)
            return entry, inserted
        tail = self._tail(run_id, fence, conn)
        try:
            return self._insert_once(
                run_id, name, data, fence, run_changes, release, relax, tail, conn
            )
        except IntegrityError as exc:
            if tail is None or fence is None or not _prev_seq_taken(exc):
                raise
        # Someone else appended since this driver's last record (a decision, a signal):
        # nothing was stored; the trigger hashes it after the true last record instead.
        self._forget_tail(fence)
        return self._insert_once(run_id, name, data, fence, run_changes, release, relax, None, conn)

    def _insert_once(
        self,
        run_id: str,
        name: str,
        data: str,
        fence: str | None,
        run_changes: Mapping[str, Any] | None,
        release: bool,
        relax: bool,
        tail: tuple[int, str | None] | None,
        conn: Any,
    ) -> tuple[Entry, bool]:
        d = self.dialect
        params: list[Any]
        hashed: str | None = None  # the record's hash when hashed here (not returned then)
        if tail is not None and fence is not None:
            sql, params, hashed = self._hashed_insert(run_id, name, data, fence, tail)
        elif fence is None:
            wait = f"FROM {_LEASE_WAIT} AS w " if d.postgres else ""
            sql = (
                f"INSERT INTO {_J} (run_id, name, data, created_at) "
                f"SELECT %s, %s, %s, {d.now} {wait}"
                f"WHERE EXISTS (SELECT 1 FROM {_R} WHERE run_id = %s) "
                "ON CONFLICT (run_id, name) DO NOTHING RETURNING seq, created_at, hash"
            )
            params = [run_id, name, data, *([run_id] if d.postgres else []), run_id]
        else:
            sql = (
                f"INSERT INTO {_J} (run_id, name, data, created_at) "
                f"SELECT %s, %s, %s, {d.now} "
                f"WHERE EXISTS (SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s "
                f"AND expires_at > {d.now} {d.for_no_key_update}) "
                "ON CONFLICT (run_id, name) DO NOTHING RETURNING seq, created_at, hash"
            )
            params = [run_id, name, data, run_id, fence]
        if run_changes or release or relax:
            # The run row's projection changes in the same statement as the record it
            # projects: one round trip, and never out of step with the journal.
            parts = [f"ins AS ({sql})"]
            if run_changes:
                sets, values = self._run_sets(run_changes)
                parts.append(
                    f"upd AS (UPDATE {_R} SET {sets} "
                    "WHERE run_id = %s AND EXISTS (SELECT 1 FROM ins))"
                )
                params += [*values, run_id]
            unlocks = release and fence is not None and self._holds_lock(fence)
            if release:
                # The liveness lock goes with the lease (once: one row deleted).
                unlock = f" RETURNING pg_advisory_unlock_shared({_LOCK_KEY.format('token')})"
                parts.append(
                    f"rel AS (DELETE FROM {_L} WHERE run_id = %s AND token = %s "
                    f"AND EXISTS (SELECT 1 FROM ins){unlock if unlocks else ''})"
                )
                params += [run_id, fence]
            dial = f", {_ASYNC_COMMIT}" if relax else ""
            returned = ", hash" if hashed is None else ", notified"
            sql = f"WITH {', '.join(parts)} SELECT seq, created_at{returned}{dial} FROM ins"
        liveness = self._liveness_on(conn) if fence is not None and not release else None
        if liveness is not None and fence is not None and liveness.deferred(fence):
            liveness.hold(fence)  # sent now, confirmed after this write (`start_run`)
            try:
                row = self._fetchone(sql, params, conn)
            finally:
                liveness.confirm()
        else:
            row = self._fetchone(sql, params, conn)
        if row is not None:
            if release and fence is not None:
                self._forget_lock(fence)
                self._forget_tail(fence)
                if (liveness := self.liveness) is not None:
                    liveness.release(fence)  # deferred: no round trip of its own
            elif fence is not None and d.postgres:
                self._remember_tail(fence, run_id, int(row[0]), hashed or row[2])
            return Entry(run_id, name, int(row[0]), data, _aware(row[1])), True
        existing = self.get(run_id, name)
        if existing is not None and (fence is None or self._holds(run_id, fence)):
            return existing, False
        if fence is not None:
            self._forget_tail(fence)
            # A driver that lost its lease stops here, even when the name is already
            # recorded (by the driver that took over): it must not carry on from there.
            raise LeaseLost(
                f"lease on run {run_id!r} is no longer held by this driver; "
                f"step {name!r} was not recorded"
            )
        raise ConfigError(
            f"run {run_id!r} does not exist; create it before writing to its journal",
            code="config.run_missing",
        )

    # -- the chain's tail, as this process's drivers know it ---------------------------

    def _hashed_insert(
        self, run_id: str, name: str, data: str, fence: str, tail: tuple[int, str | None]
    ) -> tuple[str, list[Any], str]:
        """A driver's fenced insert of a record it hashes after ``tail`` (its RETURNING
        columns: seq, created_at, notified), and the record's hash."""
        prev_seq, prev_hash = tail
        hashed = chain_hash(prev_hash, name, data)
        return _HASHED_INSERT, [run_id, name, data, hashed, prev_seq, run_id, fence], hashed

    def _tail(self, run_id: str, fence: str | None, conn: Any) -> tuple[int, str | None] | None:
        """The last record (seq, hash) of ``run_id`` as written under lease ``fence`` by
        this process, when the next record may be hashed here: on PostgreSQL (the only
        database with tails), in a statement of its own on ``conn`` (a stale tail fails
        the statement; inside a site's transaction that would abort the transaction, so
        the trigger hashes there)."""
        tail = self._tails.get(fence) if fence is not None else None
        if tail is None or tail[0] != run_id or conn.in_atomic_block or not conn.autocommit:
            return None
        return tail[1], tail[2]

    def _remember_tail(self, fence: str, run_id: str, seq: int, hash: str | None) -> None:
        tails = self._tails
        known = tails.get(fence)
        if known is not None and known[0] == run_id and known[1] >= seq:
            return  # another thread of the same driver wrote a later one
        if known is None and len(tails) >= _TAILS_MAX:
            # The oldest lease's: a driver that stopped without finishing (its next write
            # just goes through the trigger). Other threads may change the dict meanwhile.
            with contextlib.suppress(RuntimeError, StopIteration, KeyError):
                del tails[next(iter(tails))]
        tails[fence] = (run_id, seq, hash)

    def _forget_tail(self, fence: str) -> None:
        self._tails.pop(fence, None)

    def get(self, run_id: str, name: str) -> Entry | None:
        row = self._fetchone(
            f"SELECT seq, data, created_at FROM {_J} WHERE run_id = %s AND name = %s",
            [run_id, name],
        )
        if row is None:
            return None
        return Entry(run_id, name, int(row[0]), row[1], _aware(row[2]))

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]:
        rows = self._execute(
            f"SELECT seq, name, data, created_at FROM {_J} "
            "WHERE run_id = %s AND seq > %s ORDER BY seq",
            [run_id, after],
            "all",
        )
        if self.dialect.postgres and self.prepared:  # typed by psycopg's own loaders
            # A resume reads a whole journal here: the tuple constructor itself skips the
            # named tuple's Python-level ``__new__`` (a third of this loop's time).
            new = tuple.__new__
            return [new(Entry, (run_id, name, seq, data, at)) for seq, name, data, at in rows]
        return [Entry(run_id, r[1], int(r[0]), r[2], _aware(r[3])) for r in rows]

    def find(self, run_ids: Sequence[str], names: Sequence[str]) -> list[Entry]:
        """The entries called any of ``names`` in any of ``run_ids``' journals, in one read
        (one statement: one snapshot of all of them)."""
        if not run_ids or not names:
            return []
        if self.dialect.postgres:
            rows = self._execute(
                f"SELECT run_id, name, seq, data, created_at FROM {_J} "
                "WHERE run_id = ANY(%s::text[]) AND name = ANY(%s::text[])",
                [list(run_ids), list(names)],
                "all",
            )
        else:
            runs, marks = ", ".join(["%s"] * len(run_ids)), ", ".join(["%s"] * len(names))
            rows = self._execute(
                f"SELECT run_id, name, seq, data, created_at FROM {_J} "
                f"WHERE run_id IN ({runs}) AND name IN ({marks})",
                [*run_ids, *names],
                "all",
            )
        return [Entry(r[0], r[1], int(r[2]), r[3], _aware(r[4])) for r in rows]

    def journal_heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The seq of each run's last record (runs without one are left out): one index
        probe per run, whatever its journal's length."""
        if not run_ids:
            return {}
        if self.dialect.postgres:
            rows = self._execute(
                f"SELECT r.id, (SELECT seq FROM {_J} WHERE run_id = r.id "
                "ORDER BY seq DESC LIMIT 1) FROM unnest(%s::text[]) AS r(id)",
                [list(run_ids)],
                "all",
            )
        else:
            marks = ", ".join(["%s"] * len(run_ids))
            rows = self._execute(
                f"SELECT run_id, MAX(seq) FROM {_J} WHERE run_id IN ({marks}) GROUP BY run_id",
                list(run_ids),
                "all",
            )
        return {run_id: int(seq) for run_id, seq in rows if seq is not None}

    # -- leases -----------------------------------------------------------------------

    def acquire_lease(self, run_id: str, holder: str, token: str, ttl: float) -> Acquired | None:
        d = self.dialect
        instant = self._instant
        # With instant takeover, a live lease whose holder's lock nobody holds (its
        # connection is gone: the process died) is taken too.
        gone = f" OR NOT {LOCK_HELD.format(f'{_L}.token')}" if instant else ""
        upsert = (
            f"INSERT INTO {_L} (run_id, holder, token, expires_at, renewed_at) "
            f"SELECT %s, %s, %s, {d.later()}, {d.now} "
            # No lease on an inert import: it is never driven (``engine.imported``).
            f"WHERE EXISTS (SELECT 1 FROM {_R} WHERE run_id = %s "
            f"AND imported <> '{IMPORTED_INERT}') "
            "ON CONFLICT (run_id) DO UPDATE SET holder = excluded.holder, "
            "token = excluded.token, expires_at = excluded.expires_at, "
            "renewed_at = excluded.renewed_at "
            f"WHERE {_L}.expires_at <= {d.now} OR {_L}.token = excluded.token{gone} "
            "RETURNING token"
        )
        params = [run_id, holder, token, d.ttl_param(ttl), run_id]
        before = f"SELECT holder, token, expires_at, renewed_at FROM {_L} WHERE run_id = %s"
        if d.postgres:
            # One statement: the lease it replaces is read from the statement's snapshot —
            # only when the upsert did replace a row (``xmax = 0``: it inserted one, the lease
            # was released meanwhile); the new holder's liveness lock is taken in it (once:
            # the result has one row).
            lock = (
                "CASE WHEN ins.fresh OR old.token IS DISTINCT FROM ins.token THEN "
                f"pg_try_advisory_lock_shared({_LOCK_KEY.format('ins.token')}) END"
                if self._driver_locks
                else "NULL"
            )
            liveness = self.liveness
            if liveness is not None and self.pooled:
                self._lock_first(token)  # held before the lease exists; confirm is a no-op
            elif liveness is not None:
                liveness.hold(token)  # sent now, confirmed after the lease is written
            found = None
            try:
                found = self._fetchone(
                    f"WITH old AS ({before}), ins AS ({upsert}, xmax = 0 AS fresh) "
                    "SELECT ins.token, old.holder, old.token, old.expires_at, old.renewed_at, "
                    f"old.expires_at > now(), {lock}, ins.fresh "
                    "FROM ins LEFT JOIN old ON true",
                    [run_id, *params],
                )
            finally:
                if liveness is not None:
                    liveness.confirm() if found is not None else liveness.release(token)
            if found is not None and found[6]:
                self._held_lock(token)
            row = found
            if found is not None and found[7]:  # inserted: no lease was there to replace
                row = (found[0], None, None, None, None, None)
        else:  # writers are serialised: nothing changes the lease between the two
            with transaction.atomic(using=self.using):
                previous = self._fetchone(before, [run_id])
                won = self._fetchone(upsert, params)
                row = (*won, *(previous or (None,) * 4), False) if won is not None else None
        if row is not None:
            if row[2] is None or row[2] == token:
                return Acquired()
            return Acquired(
                LeaseInfo(run_id, row[1], row[2], _aware(row[3]), _aware(row[4]), bool(row[5]))
            )
        if not Run.objects.using(self.using).filter(run_id=run_id).exists():
            raise ConfigError(
                f"run {run_id!r} does not exist; create it before leasing it",
                code="config.run_missing",
            )
        return None

    def renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        d = self.dialect
        row = self._fetchone(
            f"UPDATE {_L} SET expires_at = {d.later()}, renewed_at = {d.now} "
            f"WHERE run_id = %s AND token = %s AND expires_at > {d.now} RETURNING token",
            [d.ttl_param(ttl), run_id, token],
        )
        liveness = self.liveness
        if liveness is not None:
            liveness.keep()  # the heartbeat also checks the locks are still there
        return row is not None

    def release_lease(self, run_id: str, token: str) -> None:
        delete = f"DELETE FROM {_L} WHERE run_id = %s AND token = %s"
        try:
            with self.connection.cursor() as cursor:
                if self._holds_lock(token):
                    # Let go of the lease statement's lock whether or not the lease was
                    # still ours.
                    cursor.execute(
                        f"WITH d AS ({delete}) "
                        f"SELECT pg_advisory_unlock_shared({_LOCK_KEY.format('%s')})",
                        [run_id, token, token],
                    )
                    self._forget_lock(token)
                else:
                    cursor.execute(delete, [run_id, token])
        finally:
            self._forget_tail(token)
            if (liveness := self.liveness) is not None:
                # After its row is gone (a lease a failed delete left is a stopped driver's:
                # free to take). Deferred: no round trip of its own.
                liveness.release(token)

    def get_lease(self, run_id: str) -> LeaseInfo | None:
        d = self.dialect
        row = self._fetchone(
            f"SELECT holder, token, expires_at, renewed_at, "
            f"CASE WHEN expires_at > {d.now} THEN 1 ELSE 0 END "
            f"FROM {_L} WHERE run_id = %s",
            [run_id],
        )
        if row is None:
            return None
        return LeaseInfo(run_id, row[0], row[1], _aware(row[2]), _aware(row[3]), bool(row[4]))

    # -- halts ------------------------------------------------------------------------

    def save_halt(self, halt: HaltInfo, *, fence: str | None = None) -> bool:
        try:
            with transaction.atomic(using=self.using):
                self._check_fence(halt.run_id, fence)
                Halt.objects.using(self.using).create(
                    run_id=halt.run_id,
                    op_id=halt.op_id,
                    attempt=halt.attempt,
                    tool_name=halt.tool_name,
                    arguments=halt.arguments,
                    attempted_at=halt.attempted_at,
                    cause=halt.cause,
                    reason=dict(halt.reason) if halt.reason is not None else None,
                    status=HALT_OPEN,
                )
        except IntegrityError:
            return False  # this attempt's halt exists: it is never written again
        return True

    def resolve_halt_row(
        self, run_id: str, op_id: str, resolution: Mapping[str, Any], by: str | None
    ) -> None:
        Halt.objects.using(self.using).filter(run_id=run_id, op_id=op_id, status=HALT_OPEN).update(
            status=HALT_RESOLVED, resolution=dict(resolution), resolved_by=by, resolved_at=Now()
        )

    def orphan_halts(self, run_id: str) -> int:
        return int(
            Halt.objects.using(self.using)
            .filter(run_id=run_id, status=HALT_OPEN)
            .update(status=HALT_ORPHANED, resolved_at=Now())
        )

    def list_halts(
        self, *, run_id: str | None = None, status: str | None = HALT_OPEN
    ) -> Sequence[HaltInfo]:
        rows = Halt.objects.using(self.using).order_by("run_id", "op_id")
        if run_id is not None:
            rows = rows.filter(run_id=run_id)
        else:
            rows = rows.exclude(run__imported=IMPORTED_INERT)
        if status is not None:
            rows = rows.filter(status=status)
        return [row.to_domain() for row in rows]

    # -- approvals and history --------------------------------------------------------

    def save_approval_request(
        self, request: ApprovalRequestInfo, *, fence: str | None = None
    ) -> bool:
        rows = ApprovalRequest.objects.using(self.using)
        values = {
            "tool_name": request.tool_name,
            "arguments": request.arguments,
            "policy": dict(request.policy),
            "start_seq": request.start_seq,
            "status": request.status,
            "decided_at": None,
            "previous_arguments": request.previous_arguments,
            "tool_digest": request.tool_digest,
            # The deadline's first step, counted on the database's clock in the write that
            # stamps ``created_at`` (one statement: one ``now``).
            "due_at": _after(Now(), first_after(request.policy)),
        }
        with transaction.atomic(using=self.using):
            self._check_fence(request.run_id, fence)
            existing = (
                rows.select_for_update()
                .filter(run_id=request.run_id, call_id=request.call_id)
                .first()
            )
            if existing is not None and same_request(existing.to_domain(), request):
                return False
            if existing is not None:  # an earlier incarnation, other arguments, or decided
                existing.decisions.all().delete()
                rows.filter(pk=existing.pk).update(**values, created_at=Now())
                notifications.waiting(self.using, existing.pk)
                return True
            try:
                with transaction.atomic(using=self.using):
                    row = rows.create(run_id=request.run_id, call_id=request.call_id, **values)
            except IntegrityError:
                return False
            # In this transaction: a call that waits has its notifications' rows, or neither.
            notifications.waiting(self.using, row.pk)
        return True

    def get_approval_request(self, run_id: str, call_id: str) -> ApprovalRequestInfo | None:
        row = (
            ApprovalRequest.objects.using(self.using).filter(run_id=run_id, call_id=call_id).first()
        )
        return row.to_domain() if row is not None else None

    def update_approval_request(
        self, run_id: str, call_id: str, *, policy: Mapping[str, Any], if_arguments: Any
    ) -> bool:
        rows = ApprovalRequest.objects.using(self.using).filter(
            run_id=run_id, call_id=call_id, status=APPROVAL_PENDING
        )
        with transaction.atomic(using=self.using):
            # Compared as canonical JSON (jsonb and SQLite's JSON text disagree on equality).
            row = rows.select_for_update().only("pk", "arguments").first()
            if row is None or encode(row.arguments) != encode(if_arguments):
                return False
            return rows.filter(pk=row.pk).update(policy=dict(policy)) > 0

    def list_due_approval_requests(self, *, limit: int = 100) -> Sequence[ApprovalRequestInfo]:
        # The partial index ``da_approval_due`` holds exactly the pending rows with a step
        # left: this reads only those due, however many requests were ever decided.
        rows = ApprovalRequest.objects.using(self.using).filter(
            status=APPROVAL_PENDING, due_at__isnull=False, due_at__lte=Now()
        )
        return [row.to_domain() for row in rows.order_by("due_at")[:limit]]

    def advance_deadline(
        self,
        run_id: str,
        call_id: str,
        *,
        next_after: float | None,
        merge: Mapping[str, Any] | None = None,
        if_arguments: Any,
    ) -> bool:
        rows = ApprovalRequest.objects.using(self.using).filter(
            run_id=run_id, call_id=call_id, status=APPROVAL_PENDING
        )
        with transaction.atomic(using=self.using):
            # Locked, as an edit's move of the policy locks it: an escalation merges into
            # the policy as it stands, never over a move made since it was read.
            row = rows.select_for_update().only("pk", "arguments", "policy").first()
            if row is None or encode(row.arguments) != encode(if_arguments):
                return False
            changes: dict[str, Any] = {"due_at": _after(F("created_at"), next_after)}
            if merge:
                changes["policy"] = {**(row.policy or {}), **merge}
            return rows.filter(pk=row.pk).update(**changes) > 0

    def set_approval_status(
        self,
        run_id: str,
        call_id: str,
        status: str,
        *,
        if_status: Sequence[str] | None = None,
        if_arguments: Any = None,
        if_asked_again: bool | None = None,
        if_tool_digest: str | None = None,
    ) -> bool:
        rows = ApprovalRequest.objects.using(self.using).filter(run_id=run_id, call_id=call_id)
        if if_status is not None:
            rows = rows.filter(status__in=list(if_status))
        if if_tool_digest is not None:
            rows = rows.filter(tool_digest=if_tool_digest)
        if if_asked_again is not None:
            rows = rows.filter(previous_arguments__isnull=not if_asked_again)
        changes: dict[str, Any] = {"status": status}
        if status != APPROVAL_PENDING:
            changes.update(decided_at=Now(), due_at=None)  # no deadline step left
        if if_arguments is None:
            return rows.update(**changes) > 0
        with transaction.atomic(using=self.using):
            # Compared as canonical JSON (jsonb and SQLite's JSON text disagree on equality).
            row = rows.select_for_update().only("pk", "arguments").first()
            if row is None or encode(row.arguments) != encode(if_arguments):
                return False
            return rows.filter(pk=row.pk).update(**changes) > 0

    def list_approval_requests(
        self, *, status: str | None = APPROVAL_PENDING, run_id: str | None = None
    ) -> Sequence[ApprovalRequestInfo]:
        rows = ApprovalRequest.objects.using(self.using).order_by("run_id", "call_id")
        if status is not None:
            rows = rows.filter(status=status)
        if run_id is not None:
            rows = rows.filter(run_id=run_id)
        else:
            rows = rows.exclude(run__imported=IMPORTED_INERT)
        return [row.to_domain() for row in rows]

    def save_decision(self, decision: DecisionInfo) -> bool:
        rows = ApprovalRequest.objects.using(self.using).filter(
            run_id=decision.run_id, call_id=decision.call_id
        )
        try:
            with transaction.atomic(using=self.using):
                # Locked as ``save_approval_request`` locks it to ask again: the request
                # cannot change between this check and the vote's insert.
                request = rows.select_for_update().first()
                if request is None:
                    raise ApprovalNotFound(
                        f"no approval request for call {decision.call_id!r} of run "
                        f"{decision.run_id!r}"
                    )
                current = request.to_domain()
                if changed_under(decision, current):
                    raise asked_again(decision, current)
                if closed_under(decision, current):
                    if (
                        Decision.objects.using(self.using)
                        .filter(request=request, approver=decision.approver)
                        .exists()
                    ):
                        return False  # a repeat: what it repeats is read back
                    raise closed_request(decision, current)
                with transaction.atomic(using=self.using):
                    Decision.objects.using(self.using).create(
                        request=request,
                        approver=decision.approver,
                        approved=decision.approved,
                        note=decision.note,
                        signature=decision.signature,
                        arguments=decision.arguments,
                        deputy=decision.deputy,
                    )
        except IntegrityError:
            return False
        return True

    def list_decisions(self, run_id: str, call_id: str) -> Sequence[DecisionInfo]:
        # In the order they were recorded (a quorum counts the approvals that agree with
        # the first); ``pk`` breaks a tie between two in one instant.
        rows = (
            Decision.objects.using(self.using)
            .filter(request__run_id=run_id, request__call_id=call_id)
            .order_by("created_at", "pk")
        )
        return [
            DecisionInfo(
                run_id,
                call_id,
                d.approver,
                d.approved,
                d.note,
                d.signature,
                d.created_at,
                d.arguments,
                deputy=d.deputy,
            )
            for d in rows
        ]

    def log_action(self, action: ActionInfo) -> None:
        self.append_action(
            {
                "actor": action.actor,
                "actor_id": action.actor_id,
                "channel": action.channel,
                "action": action.action,
                "run_id": action.run_id,
                "target": action.target,
                "payload": dict(action.payload),
            }
        )

    def append_action(self, fields: Mapping[str, Any]) -> None:
        """Append one row to the action log, chained to the row before it (docs/audit.md).

        Writers of the action log take turns: a transaction-scoped advisory lock on
        PostgreSQL, the database's write lock on SQLite (``IMMEDIATE`` transactions), so the
        row read as the previous one is the last committed, and ids follow the chain.
        """
        with transaction.atomic(using=self.using):
            if self.dialect.postgres:
                self._execute("SELECT pg_advisory_xact_lock(%s)", [_ACTION_LOCK], "one")
            rows = ActionLog.objects.using(self.using)
            prev = rows.order_by("-id").values_list("hash", flat=True).first()
            rows.create(**fields, hash=action_hash(prev, fields))

    def list_actions(self, *, run_id: str | None = None) -> Sequence[ActionInfo]:
        rows = ActionLog.objects.using(self.using).all()
        if run_id is not None:
            rows = rows.filter(run_id=run_id)
        return [
            ActionInfo(
                a.actor,
                a.action,
                a.run_id,
                a.target,
                a.payload,
                a.created_at,
                actor_id=a.actor_id,
                channel=a.channel,
            )
            for a in rows
        ]

    # -- audit chains (engine/audit.py) -------------------------------------------------

    def chain(self, run_id: str) -> Sequence[Link]:
        rows = self._execute(
            f"SELECT seq, name, data, hash FROM {_J} WHERE run_id = %s ORDER BY seq",
            [run_id],
            "all",
        )
        return [Link(int(seq), name, data, h) for seq, name, data, h in rows]

    def action_chain(self) -> Sequence[Link]:
        rows = (
            ActionLog.objects.using(self.using)
            .order_by("id")
            .values_list("id", "hash", *ACTION_FIELDS)
        )
        return [
            Link(
                row[0],
                ACTION_NAME,
                action_content(dict(zip(ACTION_FIELDS, row[2:], strict=True))),
                row[1],
            )
            for row in rows.iterator()
        ]

    def announce(self, event: str, details: Mapping[str, Any]) -> None:
        """Send ``event``'s Django signal after this database's transaction commits
        (``durable_agents.signals``)."""
        from ..signals import send_after_commit

        send_after_commit(event, details, using=self.using)

    def check_can_drive(self) -> None:
        """Driving needs each step to commit on its own: refuse inside ``atomic()``."""
        if self.connection.in_atomic_block:
            raise ConfigError(
                "a run cannot be driven inside transaction.atomic() (or ATOMIC_REQUESTS): its "
                "steps would not be durable until the transaction commits. Start it with "
                "agent.start(...) (enqueued on commit) or drive it outside the transaction",
                code="config.in_transaction",
            )

    def close_thread_resources(self) -> None:
        """Close this thread's database connections (called by engine worker threads)."""
        connections.close_all()

    # -- listing ----------------------------------------------------------------------

    def list_unfinished(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        statuses: Sequence[str] | None = None,
        lease_free: bool = False,
    ) -> Sequence[RunInfo]:
        live = Lease.objects.using(self.using).filter(
            run_id=OuterRef("run_id"), expires_at__gt=Now()
        )
        if self._instant:
            # A live lease whose holder's liveness lock nobody holds has no driver left (its
            # process died): the run is as free as if its lease had expired, and recovery
            # hands it over at once. Only leased unfinished runs pay for the probe.
            live = live.filter(_HolderAlive(F("token")))
        rows = (
            Run.objects.using(self.using)
            .filter(finished_at__isnull=True, kind=KIND_AGENT)
            .exclude(imported=IMPORTED_INERT)
            .annotate(_leased=Exists(live))
            .order_by("run_id")
        )
        if after is not None:
            rows = rows.filter(run_id__gt=after)
        if statuses is not None:
            rows = rows.filter(status__in=list(statuses))
        if lease_free:
            rows = rows.filter(_leased=False)
        return [replace(row.to_domain(), lease_expired=not row._leased) for row in rows[:limit]]


# What a database raises when it is unreachable or gave up on a statement for reasons of its
# own (a dropped connection, a restart, a serialization failure, a deadlock victim): a
# failure to retry, never a verdict on the run. Django wraps the driver's errors in its own
# classes; prepared statements and liveness locks use psycopg directly.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    django_db.OperationalError,
    django_db.InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def _unavailable_as_storage_error(method: Any) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except _UNAVAILABLE as exc:
            # The statement may have committed before the client lost the answer: callers
            # treat this as "unknown", as after a crash (the journal says what happened).
            raise StorageError(
                f"the database failed {method.__name__}: {type(exc).__name__}: {exc}",
                code="storage.unavailable",
            ) from exc

    return call


for _name, _member in list(vars(DjangoStore).items()):
    if not _name.startswith("_") and inspect.isfunction(_member):
        setattr(DjangoStore, _name, _unavailable_as_storage_error(_member))
del _name, _member


def _after(moment: Any, seconds: float | None) -> Any:
    """``moment`` (an expression on the database's clock) plus ``seconds``, as a
    datetime the database computes; None for no seconds."""
    if seconds is None:
        return None
    return ExpressionWrapper(moment + timedelta(seconds=seconds), output_field=DateTimeField())
