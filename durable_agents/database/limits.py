"""The limits' rows on the site's database (``engine.limits``): slots, rate buckets and the
throttle rows, as a part of ``DjangoStore``.

A claim of a slot runs in one short transaction serialised per key (a transaction-scoped
advisory lock on PostgreSQL, which holds behind a transaction pooler too; SQLite serialises
writers, and the claim writes first). A slot counts while its run's lease is live by the
database clock — and, with instant takeover, while that lease's holder still holds its
liveness lock — so a driver that died frees its slots with its lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from ..engine.limits import CONTINUED_WAIT
from ..engine.ports import THROTTLED, ThrottleInfo
from ..models import Lease, RateBucket, Run, Slot, Throttle

_S = Slot._meta.db_table
_L = Lease._meta.db_table
_B = RateBucket._meta.db_table


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

    def _slot_lease_live(self, alias: str) -> str:
        from .store import _LOCK_HELD

        held = f" AND {_LOCK_HELD.format(f'{alias}.token')}" if self._instant else ""
        return f"{alias}.expires_at > {self.dialect.now}{held}"

    def claim_slot(self, key: str, holder: str, run_id: str, token: str, limit: int) -> bool:
        d = self.dialect
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            if d.postgres:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"durable_agents.slot:{key}"]
                )
            # Dead slots go first (on SQLite this write also takes the writers' lock, so
            # the count below is the only one at a time).
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
                f"SELECT %s, %s, %s, %s, {d.now} WHERE EXISTS (SELECT 1 FROM {_L} l "
                f"WHERE l.run_id = %s AND l.token = %s AND {self._slot_lease_live('l')}) "
                "ON CONFLICT (key, holder) DO UPDATE SET run_id = excluded.run_id, "
                "token = excluded.token, taken_at = excluded.taken_at RETURNING 1",
                [key, holder, run_id, token, run_id, token],
            )
            return cursor.fetchone() is not None

    def release_slot(self, key: str, holder: str, token: str) -> None:
        Slot.objects.using(self.using).filter(key=key, holder=holder, token=token).delete()

    def take_permit(self, key: str, count: int, period: float) -> float:
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

    def throttle(self, info: ThrottleInfo) -> int:
        rows = Throttle.objects.using(self.using)
        with transaction.atomic(using=self.using):
            old = rows.select_for_update().filter(run_id=info.run_id).first()
            same = (
                old is not None
                and old.key == info.key
                and (info.since - old.retry_at).total_seconds() <= CONTINUED_WAIT
            )
            tries = old.tries + 1 if same and old is not None else 1
            since = old.since if same and old is not None else info.since
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
        self, *, key: str | None = None, due: bool = False, limit: int = 100
    ) -> Sequence[ThrottleInfo]:
        rows = Throttle.objects.using(self.using).filter(
            Exists(Run.objects.filter(run_id=OuterRef("run_id"), status=THROTTLED))
        )
        if key is not None:
            rows = rows.filter(key=key)
        if due:
            rows = rows.filter(retry_at__lte=Now())
        return [
            ThrottleInfo(t.run_id, t.agent, t.key, t.reason, t.limit, t.retry_at, t.since, t.tries)
            for t in rows.order_by("since", "run_id")[:limit]
        ]
