"""Who follows a run live, so that only followed runs notify (PostgreSQL; docs/events.md).

A ``NOTIFY`` serialises its transaction's commit with every other notifying commit on the
server, so the triggers of migration 0010 notify a run's channel only while the run has an
unexpired ``Follower`` row. A follower (``durable_agents.database.events``) registers one on its own
autocommit connection after it ``LISTEN``s and before it first reads, refreshes its expiry
while it follows, and deletes it when it stops; a crashed follower's row expires, and the
next registration anywhere sweeps it.

The race this closes: a writer that probed for followers before the registration committed
does not notify, and may commit after the follower's first read. Such a writer still holds
what it locked before probing until it commits — the run's journal lock (the chain trigger
takes it first) for a record the trigger hashes, the run's lease row (``FOR SHARE``) for a
record its driver hashed (migration 0012), the run's row for a status change. So after
registering, the follower takes all three once (``settle``) and so waits for exactly those
writers; any writer that locks after that probes after the registration and notifies. (A
driver's hashed insert probes with the snapshot its statement began with, an instant before
it locks the lease row: a registration committed in that instant is not seen, and the record
is read at the next keep-alive.)
This holds for writers in READ COMMITTED (Django's default): each statement of a trigger
sees what committed before it began. A writer at REPEATABLE READ or SERIALIZABLE probes with
its transaction's first snapshot and may miss a newer follower; such a record is read at
the follower's next keep-alive at the latest (``engine.follow.ticks`` reads again then).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from ..engine import runtime
from ..engine.follow import Wait
from ..models import Follower, Lease, Run

_F = Follower._meta.db_table
_R = Run._meta.db_table
_L = Lease._meta.db_table
# The key of the journal chain trigger's per-run lock (migrations 0007, 0009, 0010).
JOURNAL_LOCK = 1684107620

# A registration is refreshed at least this often (and at each keep-alive interval when
# that is shorter), and lasts this many refresh intervals (at least ``MIN_TTL`` seconds):
# a crashed follower's run keeps notifying, uselessly, for at most that long.
MAX_REFRESH = 30.0
TTL_INTERVALS = 3
MIN_TTL = 10.0
# The longest a new follower waits for one writer of the run (``settle``): the follower
# connection's ``lock_timeout``.
SETTLE_TIMEOUT = 5.0


class Registration:
    """One follower's row on its listening connection ``conn`` (autocommit)."""

    def __init__(self, conn: psycopg.Connection[Any], run_id: str, every: float) -> None:
        self.conn = conn
        self.run_id = run_id
        self.every = min(every, MAX_REFRESH) if every > 0 else MAX_REFRESH
        self.ttl = max(self.every * TTL_INTERVALS, MIN_TTL)
        self.id: int | None = None
        self.refresh_at = 0.0

    def start(self) -> None:
        """Register (sweeping expired rows), then wait for the writers that probed before
        the registration committed (``settle``). Call after ``LISTEN``, before reading."""
        self.conn.execute(
            "SELECT set_config('lock_timeout', %s, false)", [f"{int(SETTLE_TIMEOUT * 1000)}ms"]
        )
        row = self.conn.execute(
            f"WITH swept AS (DELETE FROM {_F} WHERE expires_at <= now()) "
            f"INSERT INTO {_F} (run_id, expires_at) "
            "VALUES (%s, now() + make_interval(secs => %s)) RETURNING id",
            [self.run_id, self.ttl],
        ).fetchone()
        assert row is not None
        self.id = row[0]
        self.refresh_at = runtime.monotonic() + self.every
        self.settle()

    def settle(self) -> None:
        """Wait for the run's writers that hold its journal lock, its lease row or its row:
        they may have probed before the registration committed (each statement autocommits,
        so the locks are let go at once). At most ``SETTLE_TIMEOUT`` seconds each: a writer
        that holds them longer — or one in this very thread, whose transaction is open
        while it follows — is not waited for; what it commits is read at the next
        keep-alive."""
        for statement, params in (
            ("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [JOURNAL_LOCK, self.run_id]),
            (f"SELECT 1 FROM {_L} WHERE run_id = %s FOR NO KEY UPDATE", [self.run_id]),
            (f"SELECT 1 FROM {_R} WHERE run_id = %s FOR SHARE", [self.run_id]),
        ):
            with contextlib.suppress(psycopg.errors.LockNotAvailable):
                self.conn.execute(statement, params)

    def renew(self) -> bool:
        """Refresh the expiry when due. True when the registration had lapsed (expired by
        the database clock, or swept): writers may have skipped the notification since, so
        the caller reads again (after registering anew)."""
        if runtime.monotonic() < self.refresh_at:
            return False
        # Only an unexpired row is extended: then every writer since the last refresh saw
        # it alive (a writer's now() is never later than this statement's).
        row = self.conn.execute(
            f"UPDATE {_F} SET expires_at = now() + make_interval(secs => %s) "
            "WHERE id = %s AND expires_at > now() RETURNING id",
            [self.ttl, self.id],
        ).fetchone()
        if row is not None:
            self.refresh_at = runtime.monotonic() + self.every
            return False
        self.conn.execute(f"DELETE FROM {_F} WHERE id = %s", [self.id])
        self.start()
        return True

    def waiting(self, inner: Wait) -> Wait:
        """``inner`` (waiting for a notification), interrupted to refresh the registration
        when due; True (read again) when it had lapsed."""

        def wait(timeout: float) -> bool:
            deadline = runtime.monotonic() + timeout
            while True:
                if self.renew():
                    return True
                now = runtime.monotonic()
                if now >= deadline:
                    return False
                if inner(max(min(deadline, self.refresh_at) - now, 0.0)):
                    return True

        return wait

    def stop(self) -> None:
        """Delete the row; on a broken connection it is left to expire."""
        if self.id is None or self.conn.closed:
            return
        with contextlib.suppress(psycopg.Error):
            self.conn.execute(f"DELETE FROM {_F} WHERE id = %s", [self.id])
        self.id = None
