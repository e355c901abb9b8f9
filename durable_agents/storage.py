"""DjangoStore: the Store port on the site's database (PostgreSQL first, SQLite too).

The hot path — a journal insert — is one statement, one round trip: an insert-if-absent
fenced by the lease, ``INSERT … SELECT … WHERE EXISTS (live lease FOR SHARE) ON CONFLICT DO
NOTHING RETURNING``. No row back means the name exists (read the winner) or the lease is
lost (``LeaseLost``, nothing stored). The ``FOR SHARE`` lock makes a concurrent takeover of
the lease wait for this insert's commit, and a takeover committed first makes the ``EXISTS``
false. Lease expiry is always judged by the database clock (``now()``).

On SQLite every statement is atomic and writers are serialised by the database lock, so the
same statements without ``FOR SHARE`` give the same guarantees; the clock is the database
host's (the same machine). Use ``"transaction_mode": "IMMEDIATE"`` and WAL mode.

The SQL lives here, next to the models it writes; everything else goes through the ORM.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

from .engine.errors import ConfigError, LeaseLost, StorageError
from .engine.ports import (
    HALT_OPEN,
    RUN_FIELDS,
    TERMINAL_STATUSES,
    Entry,
    HaltInfo,
    LeaseInfo,
    RunInfo,
)
from .models import Halt, JournalEntry, Lease, Run

_J = JournalEntry._meta.db_table
_L = Lease._meta.db_table
_R = Run._meta.db_table
_NEVER_AUTO_PREPARE = 2**31 - 1


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

    def later(self) -> str:
        """``now() + ttl`` with the ttl (seconds) as the next parameter."""
        if self.postgres:
            return "now() + make_interval(secs => %s)"
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f','now', %s)"

    def ttl_param(self, ttl: float) -> Any:
        return float(ttl) if self.postgres else f"+{float(ttl)} seconds"


class DjangoStore:
    """The Store port over a Django database alias."""

    def __init__(self, using: str | None = None, *, prepared: bool | None = None) -> None:
        if using is None or prepared is None:
            from .conf import get_settings

            settings = get_settings()
            using = settings.database if using is None else using
            prepared = settings.prepared_statements if prepared is None else prepared
        self.using = using
        self.prepared = prepared
        self._dialect: _Dialect | None = None
        # One reusable server-binding cursor per psycopg connection (connections are
        # per thread in Django); weak keys let closed connections go.
        self._cursors: weakref.WeakKeyDictionary[Any, psycopg.Cursor[Any]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def connection(self) -> Any:
        return connections[self.using]

    @property
    def dialect(self) -> _Dialect:
        if self._dialect is None:
            self._dialect = _Dialect(self.connection.vendor)
        return self._dialect

    def _execute(self, sql: str, params: Sequence[Any], fetch: str) -> Any:
        """Run one statement; on PostgreSQL as a prepared statement with server-side binding.

        Django turns prepared statements off by default (for connection poolers); the
        journal's few hot statements are planned once per connection instead of on every
        step, which is most of their cost. ``DURABLE_AGENTS["PREPARED_STATEMENTS"] = False``
        turns this off (PgBouncer in transaction mode before 1.21).
        """
        conn = connections[self.using]
        if self.prepared and conn.vendor == "postgresql":
            raw = conn.connection
            if raw is None or raw.closed:
                conn.ensure_connection()
                raw = conn.connection
            cursor = self._cursors.get(raw)
            if cursor is None or cursor.closed:
                if raw.prepare_threshold is None:
                    # psycopg ignores prepare=True while the threshold is None (Django's
                    # default); a threshold never reached keeps other queries unprepared.
                    raw.prepare_threshold = _NEVER_AUTO_PREPARE
                cursor = self._cursors[raw] = psycopg.Cursor(raw)
            with conn.wrap_database_errors:
                cursor.execute(sql, params, prepare=True)
                return cursor.fetchone() if fetch == "one" else cursor.fetchall()
        with conn.cursor() as django_cursor:
            django_cursor.execute(sql, params)
            if fetch == "none":
                return None
            return django_cursor.fetchone() if fetch == "one" else django_cursor.fetchall()

    def _fetchone(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        row = self._execute(sql, params, "one")
        return tuple(row) if row is not None else None

    # -- runs -------------------------------------------------------------------------

    def create_run(self, run: RunInfo) -> bool:
        row = Run(
            run_id=run.run_id,
            agent=run.agent,
            status=run.status,
            input=run.input,
            usage=dict(run.usage),
            spend=dict(run.spend),
            fingerprint=run.fingerprint,
            session_id=run.session_id,
            parent_run_id=run.parent_run_id,
            root_run_id=run.root_run_id,
            forked_from=run.forked_from,
            forked_step=run.forked_step,
        )
        try:
            with transaction.atomic(using=self.using):
                row.save(force_insert=True, using=self.using)
        except IntegrityError:
            return False
        return True

    def get_run(self, run_id: str) -> RunInfo | None:
        row = Run.objects.using(self.using).filter(run_id=run_id).first()
        return row.to_domain() if row is not None else None

    def update_run(
        self, run_id: str, changes: Mapping[str, Any], *, fence: str | None = None
    ) -> None:
        unknown = set(changes) - RUN_FIELDS
        if unknown:
            raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        values: dict[str, Any] = dict(changes, updated_at=Now())
        if "status" in changes:
            values["finished_at"] = Now() if changes["status"] in TERMINAL_STATUSES else None
        rows = Run.objects.using(self.using).filter(run_id=run_id)
        if fence is not None:
            rows = rows.filter(Exists(self._live_lease(fence)))
        updated = rows.update(**values)
        if updated == 0 and fence is not None and self.get_run(run_id) is not None:
            raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")

    def _live_lease(self, token: str) -> Any:
        return Lease.objects.using(self.using).filter(
            run_id=OuterRef("run_id"), token=token, expires_at__gt=Now()
        )

    def delete_run(self, run_id: str) -> None:
        Run.objects.using(self.using).filter(run_id=run_id).delete()

    # -- journal ----------------------------------------------------------------------

    def insert(
        self, run_id: str, name: str, data: str, *, fence: str | None = None
    ) -> tuple[Entry, bool]:
        d = self.dialect
        if fence is None:
            sql = (
                f"INSERT INTO {_J} (run_id, name, data, created_at) "
                f"SELECT %s, %s, %s, {d.now} "
                f"WHERE EXISTS (SELECT 1 FROM {_R} WHERE run_id = %s) "
                "ON CONFLICT (run_id, name) DO NOTHING RETURNING seq, created_at"
            )
            params: list[Any] = [run_id, name, data, run_id]
        else:
            sql = (
                f"INSERT INTO {_J} (run_id, name, data, created_at) "
                f"SELECT %s, %s, %s, {d.now} "
                f"WHERE EXISTS (SELECT 1 FROM {_L} WHERE run_id = %s AND token = %s "
                f"AND expires_at > {d.now} {d.for_share}) "
                "ON CONFLICT (run_id, name) DO NOTHING RETURNING seq, created_at"
            )
            params = [run_id, name, data, run_id, fence]
        row = self._fetchone(sql, params)
        if row is not None:
            return Entry(run_id, name, int(row[0]), data, _aware(row[1])), True
        existing = self.get(run_id, name)
        if existing is not None:
            return existing, False
        if fence is not None:
            raise LeaseLost(
                f"lease on run {run_id!r} is no longer held by this driver; "
                f"step {name!r} was not recorded"
            )
        raise ConfigError(
            f"run {run_id!r} does not exist; create it before writing to its journal",
            code="config.run_missing",
        )

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
        return [Entry(run_id, r[1], int(r[0]), r[2], _aware(r[3])) for r in rows]

    # -- leases -----------------------------------------------------------------------

    def acquire_lease(self, run_id: str, holder: str, token: str, ttl: float) -> bool:
        d = self.dialect
        later = d.later()
        row = self._fetchone(
            f"INSERT INTO {_L} (run_id, holder, token, expires_at, renewed_at) "
            f"SELECT %s, %s, %s, {later}, {d.now} "
            f"WHERE EXISTS (SELECT 1 FROM {_R} WHERE run_id = %s) "
            "ON CONFLICT (run_id) DO UPDATE SET holder = excluded.holder, "
            "token = excluded.token, expires_at = excluded.expires_at, "
            "renewed_at = excluded.renewed_at "
            f"WHERE {_L}.expires_at <= {d.now} OR {_L}.token = excluded.token "
            "RETURNING token",
            [run_id, holder, token, d.ttl_param(ttl), run_id],
        )
        if row is not None:
            return True
        if not Run.objects.using(self.using).filter(run_id=run_id).exists():
            raise ConfigError(
                f"run {run_id!r} does not exist; create it before leasing it",
                code="config.run_missing",
            )
        return False

    def renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        d = self.dialect
        row = self._fetchone(
            f"UPDATE {_L} SET expires_at = {d.later()}, renewed_at = {d.now} "
            f"WHERE run_id = %s AND token = %s AND expires_at > {d.now} RETURNING token",
            [d.ttl_param(ttl), run_id, token],
        )
        return row is not None

    def release_lease(self, run_id: str, token: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {_L} WHERE run_id = %s AND token = %s", [run_id, token])

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

    def save_halt(self, halt: HaltInfo) -> bool:
        rows = Halt.objects.using(self.using)
        if rows.filter(run_id=halt.run_id, op_id=halt.op_id, status=HALT_OPEN).exists():
            return False
        values = {
            "tool_name": halt.tool_name,
            "arguments": halt.arguments,
            "attempt": halt.attempt,
            "attempted_at": halt.attempted_at,
            "cause": halt.cause,
            "status": HALT_OPEN,
            "resolution": None,
            "resolved_by": None,
            "resolved_at": None,
        }
        try:
            with transaction.atomic(using=self.using):
                rows.update_or_create(run_id=halt.run_id, op_id=halt.op_id, defaults=values)
        except IntegrityError:
            return False
        return True

    def resolve_halt_row(
        self, run_id: str, op_id: str, resolution: Mapping[str, Any], by: str | None
    ) -> None:
        Halt.objects.using(self.using).filter(run_id=run_id, op_id=op_id).update(
            status="resolved", resolution=dict(resolution), resolved_by=by, resolved_at=Now()
        )

    def list_halts(
        self, *, run_id: str | None = None, status: str | None = HALT_OPEN
    ) -> Sequence[HaltInfo]:
        rows = Halt.objects.using(self.using).order_by("run_id", "op_id")
        if run_id is not None:
            rows = rows.filter(run_id=run_id)
        if status is not None:
            rows = rows.filter(status=status)
        return [row.to_domain() for row in rows]

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
        rows = (
            Run.objects.using(self.using)
            .filter(finished_at__isnull=True)
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
