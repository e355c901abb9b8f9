"""The limits' rows on the site's database (``engine.limits``): slots, rate buckets and the
throttle rows, as a part of ``DjangoStore``.

A claim of a slot runs in one short transaction serialised per key (a transaction-scoped
advisory lock on PostgreSQL, which holds behind a transaction pooler too; SQLite serialises
writers, and the claim writes first). A slot counts while its run's lease is live by the
database clock — and, with instant takeover, while that lease's holder still holds its
liveness lock — so a driver that died frees its slots with its lease.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef
from django.db.models.functions import Now

from ..engine.limits import agent_key, continued, model_key, tool_key
from ..engine.ports import THROTTLED, ThrottleInfo
from ..models import Lease, RateBucket, Run, Slot, Throttle
from .liveness import LOCK_HELD

_S = Slot._meta.db_table
_L = Lease._meta.db_table
_B = RateBucket._meta.db_table
_T = Throttle._meta.db_table
_R = Run._meta.db_table


class Limits:
    """Mixed into ``DjangoStore``: uses its ``using``, ``dialect``, ``now`` and the liveness
    test of instant takeover."""

    if TYPE_CHECKING:
        using: str

        @property
        def dialect(self) -> Any: ...

        @property
        def _instant(self) -> bool: ...

        def now(self) -> datetime: ...

        def _execute(self, sql: str, params: Sequence[Any], fetch: str) -> Any: ...

        def _fetchone(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None: ...

    def _slot_lease_live(self, alias: str, held: str | None = None) -> str:
        """SQL: lease ``alias`` is live — unexpired, and with instant takeover its holder's
        liveness lock is held: looked up in ``held`` (a CTE of the advisory locks, read once
        per statement) when given, else in pg_locks."""
        if not self._instant:
            return f"{alias}.expires_at > {self.dialect.now}"
        if held is None:
            return (
                f"{alias}.expires_at > {self.dialect.now} AND {LOCK_HELD.format(f'{alias}.token')}"
            )
        token = f"{alias}.token"
        return (
            f"{alias}.expires_at > now() AND EXISTS (SELECT 1 FROM {held} h WHERE "
            f"h.classid = ('x' || substr(md5({token}), 1, 8))::bit(32)::bigint::oid "
            f"AND h.objid = ('x' || substr(md5({token}), 9, 8))::bit(32)::bigint::oid)"
        )

    def claim_slot(self, key: str, holder: str, run_id: str, token: str, limit: int) -> bool:
        if self.dialect.postgres:
            return self._claim_slot_postgres(key, holder, run_id, token, limit)
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            # Dead slots go first: this write also takes SQLite's writers' lock, so the
            # count below is the only one at a time.
            cursor.execute(
                f"DELETE FROM {_S} WHERE key = %s AND NOT EXISTS (SELECT 1 FROM {_L} l "
                f"WHERE l.run_id = {_S}.run_id AND l.token = {_S}.token "
                f"AND {self._slot_lease_live('l')})",
                [key],
            )
            cursor.execute(
                f"SELECT count(*), count(*) FILTER (WHERE holder = %s AND token = %s) "
                f"FROM {_S} WHERE key = %s",
                [holder, token, key],
            )
            others, mine = cursor.fetchone()
            if mine:
                return True
            if others >= limit:
                return False
            cursor.execute(
                f"INSERT INTO {_S} (key, holder, run_id, token, taken_at) "
                f"SELECT %s, %s, %s, %s, {self.dialect.now} WHERE EXISTS (SELECT 1 FROM {_L} l "
                f"WHERE l.run_id = %s AND l.token = %s AND {self._slot_lease_live('l')}) "
                "ON CONFLICT (key, holder) DO UPDATE SET run_id = excluded.run_id, "
                "token = excluded.token, taken_at = excluded.taken_at RETURNING 1",
                [key, holder, run_id, token, run_id, token],
            )
            return cursor.fetchone() is not None

    def _claim_slot_postgres(
        self, key: str, holder: str, run_id: str, token: str, limit: int
    ) -> bool:
        """Two statements in one transaction: the key's advisory lock, then one statement
        (with its own snapshot, taken once the lock is held: READ COMMITTED) that deletes
        the key's dead slots, counts the live ones of others and inserts this holder's if
        there is room and its lease is live. This holder's own row is left to the upsert:
        one statement must not both delete and upsert a row."""
        live = self._slot_lease_live("l", held="held")
        claim = (
            "WITH held AS MATERIALIZED (SELECT classid, objid FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())), "
            f"dead AS (DELETE FROM {_S} s WHERE s.key = %s AND s.holder <> %s "
            f"AND NOT EXISTS (SELECT 1 FROM {_L} l WHERE l.run_id = s.run_id "
            f"AND l.token = s.token AND {live}) RETURNING s.id), "
            f"counted AS (SELECT count(*) FILTER (WHERE s.holder <> %s) AS others, "
            "count(*) FILTER (WHERE s.holder = %s AND s.token = %s) AS mine "
            f"FROM {_S} s WHERE s.key = %s AND s.id NOT IN (SELECT id FROM dead)), "
            f"ins AS (INSERT INTO {_S} (key, holder, run_id, token, taken_at) "
            "SELECT %s, %s, %s, %s, now() FROM counted WHERE counted.mine = 0 "
            f"AND counted.others < %s AND EXISTS (SELECT 1 FROM {_L} l WHERE l.run_id = %s "
            f"AND l.token = %s AND {live}) "
            "ON CONFLICT (key, holder) DO UPDATE SET run_id = excluded.run_id, "
            "token = excluded.token, taken_at = excluded.taken_at RETURNING 1) "
            "SELECT (SELECT mine FROM counted), (SELECT count(*) FROM ins)"
        )
        params: list[str | int] = [key, holder, holder, holder, token, key]
        params += [key, holder, run_id, token, limit, run_id, token]
        with transaction.atomic(using=self.using):  # both prepared, as the store's own
            self._fetchone(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"durable_agents.slot:{key}"]
            )
            row = self._fetchone(claim, params)
        assert row is not None
        return bool(row[0]) or bool(row[1])

    def release_slot(self, key: str, holder: str, token: str) -> str | None:
        delete = f"DELETE FROM {_S} WHERE key = %s AND holder = %s AND token = %s"
        oldest = (
            f"SELECT t.run_id FROM {_T} t WHERE t.key = %s AND EXISTS (SELECT 1 FROM {_R} r "
            "WHERE r.run_id = t.run_id AND r.status = %s) ORDER BY t.since, t.run_id LIMIT 1"
        )
        if self.dialect.postgres:  # one round trip
            row = self._fetchone(
                f"WITH gone AS ({delete} RETURNING 1) {oldest}",
                [key, holder, token, key, THROTTLED],
            )
        else:
            with connections[self.using].cursor() as cursor:
                cursor.execute(delete, [key, holder, token])
                cursor.execute(oldest, [key, THROTTLED])
                row = cursor.fetchone()
        return str(row[0]) if row is not None else None

    def take_permit(self, key: str, count: int, period: float) -> float:
        if self.dialect.postgres:
            return self._take_permit_postgres(key, count, period)
        buckets = RateBucket.objects.using(self.using)
        with transaction.atomic(using=self.using):
            now = self.now()
            buckets.bulk_create([RateBucket(key=key, tat=now)], ignore_conflicts=True)
            bucket = buckets.select_for_update().get(key=key)
            tat = max(bucket.tat, now) + timedelta(seconds=period / count)
            ahead = (tat - now).total_seconds()
            if ahead > period + 1e-6:
                return ahead - period
            buckets.filter(key=key).update(tat=tat)
            return 0.0

    def _take_permit_postgres(self, key: str, count: int, period: float) -> float:
        """One statement: the upsert moves the bucket on only while the permit fits (its
        WHERE is checked again on the row's latest version once the row is locked, so two
        callers never both take the last permit). A refusal reads how long until the next
        permit from the statement's snapshot: a retry time, never a grant."""
        step = "make_interval(secs => %s)"
        sql = (
            f"WITH ins AS (INSERT INTO {_B} AS b (key, tat) VALUES (%s, now() + {step}) "
            f"ON CONFLICT (key) DO UPDATE SET tat = greatest(b.tat, now()) + {step} "
            f"WHERE greatest(b.tat, now()) + {step} <= now() + {step} RETURNING 1) "
            "SELECT (SELECT count(*) FROM ins), (SELECT extract(epoch FROM greatest(tat, now()) "
            f"+ {step} - {step} - now()) FROM {_B} WHERE key = %s)"
        )
        interval = period / count
        params: list[str | float] = [key, interval, interval, interval, period]
        params += [interval, period, key]
        row = self._fetchone(sql, params)
        assert row is not None
        granted, wait = row
        if granted:
            return 0.0
        # A row another caller inserted after this statement's snapshot: about one interval.
        return max(float(wait) if wait is not None else interval, 1e-3)

    def throttle(self, info: ThrottleInfo) -> int:
        rows = Throttle.objects.using(self.using)
        with transaction.atomic(using=self.using):
            old = rows.select_for_update().filter(run_id=info.run_id).first()
            tries, since = continued(old, info)
            rows.update_or_create(
                run_id=info.run_id,
                defaults={
                    "agent": info.agent,
                    "key": info.key,
                    "reason": info.reason,
                    "limit": info.limit,
                    "retry_at": info.retry_at,
                    "since": since,
                    "tries": tries,
                },
            )
            return tries

    def list_throttled(
        self,
        *,
        key: str | None = None,
        due: bool = False,
        run_id: str | None = None,
        limit: int = 100,
    ) -> Sequence[ThrottleInfo]:
        rows = Throttle.objects.using(self.using).filter(
            Exists(Run.objects.filter(run_id=OuterRef("run_id"), status=THROTTLED))
        )
        if key is not None:
            rows = rows.filter(key=key)
        if run_id is not None:
            rows = rows.filter(run_id=run_id)
        if due:
            rows = rows.filter(retry_at__lte=Now())
        return [
            ThrottleInfo(t.run_id, t.agent, t.key, t.reason, t.limit, t.retry_at, t.since, t.tries)
            for t in rows.order_by("since", "run_id")[:limit]
        ]


@dataclass(frozen=True)
class LimitQueue:
    """One limit as staff see it: what it limits (``agent/…``, ``tool/…``, ``model/…``), the
    limit, how many slots are in use now (None for a rate), and the runs waiting on it."""

    key: str
    kind: str
    name: str
    limit: str
    in_use: int | None
    waiting: int
    oldest_since: datetime | None
    next_retry_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "name": self.name,
            "limit": self.limit,
            "in_use": self.in_use,
            "waiting": self.waiting,
            "oldest_since": self.oldest_since.isoformat() if self.oldest_since else None,
            "next_retry_at": self.next_retry_at.isoformat() if self.next_retry_at else None,
        }


def declared_limits() -> dict[str, tuple[str, int | None]]:
    """Every limit the site declares, by key: its text and, for a slot, its size."""
    from ..agent_loader import configured_agents
    from ..conf import get_settings

    settings = get_settings()
    found: dict[str, tuple[str, int | None]] = {}
    for agent in configured_agents(settings.agents).values():
        if agent.max_concurrent_runs is not None:
            n = agent.max_concurrent_runs
            found[agent_key(agent.name)] = (f"{n} at once", n)
        # Without listing an MCP server's tools: the page never starts or waits on one.
        for name, rate, concurrent in agent.limited_tools():
            texts = []
            if concurrent is not None:
                texts.append(f"{concurrent} at once")
            if rate is not None:
                texts.append(rate.text)
            found[tool_key(name)] = (", ".join(texts), concurrent)
    for name, rate in settings.model_rates.items():
        found[model_key(name)] = (rate.text, None)
    return found


def limit_queues(using: str = "default") -> list[LimitQueue]:
    """Each declared limit, and each key a throttled run waits on, with its slots in use and
    its waiting runs: two grouped queries, whatever the number of runs."""
    declared = declared_limits()
    waiting = {
        row["key"]: row
        for row in Throttle.objects.using(using)
        .filter(Exists(Run.objects.filter(run_id=OuterRef("run_id"), status=THROTTLED)))
        .values("key")
        .annotate(n=Count("run_id"), oldest=Min("since"), next=Min("retry_at"), said=Max("limit"))
    }
    live = Lease.objects.filter(
        run_id=OuterRef("run_id"), token=OuterRef("token"), expires_at__gt=Now()
    )
    in_use = {
        row["key"]: row["n"]
        for row in Slot.objects.using(using)
        .filter(Exists(live))
        .values("key")
        .annotate(n=Count("holder"))
    }
    queues = []
    for key in sorted(set(declared) | set(waiting)):
        kind, _, name = key.partition("/")
        text, size = declared.get(key, ("", None))
        row: Mapping[str, Any] = waiting.get(key) or {}
        queues.append(
            LimitQueue(
                key,
                kind,
                name,
                text or str(row.get("said") or ""),
                in_use.get(key, 0) if size is not None or key in in_use else None,
                int(row.get("n") or 0),
                row.get("oldest"),
                row.get("next"),
            )
        )
    return queues
